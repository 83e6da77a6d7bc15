"""The dashboard's keys panel in headless Chromium, against a real 3-node
cluster (the fixtures of test_dashboard.py): the queues with keyed jobs,
their keys and busiest keys added up over the nodes, and the
deduplication counters."""

from __future__ import annotations

import redis
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait

from test_dashboard import Cluster, api, browser, cluster, figure, table_rows  # noqa: F401  (fixtures)


def test_the_keys_panel(cluster: Cluster, browser) -> None:  # noqa: F811
    (a, http), (b, _), _ = cluster
    ra, rb = redis.Redis(port=a.port), redis.Redis(port=b.port)
    for client, keys in ((ra, ["tenant-a"] * 3 + ["tenant-b"]), (rb, ["tenant-a", "tenant-c", "tenant-c"])):
        for key in keys:
            client.execute_command("ADDJOB", "billing", "charge", 0, "KEY", key, "REPLICATE", 1, "RETRY", 0)
    first = ra.execute_command("ADDJOB", "mail", "hello", 0, "KEY", "order-1", "DEDUP", 60_000)
    assert rb.execute_command("ADDJOB", "mail", "again", 0, "KEY", "order-1", "DEDUP", 60_000) == first  # a hit, on b

    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])

    def rows() -> list[list[str]]:
        return table_rows(browser, "keys")

    def dedup(name: str) -> int:
        return figure(browser, f"#key-totals span[data-figure='{name}']")

    billing, mail = wait.until(lambda _: found if len(found := rows()) == 2 and found[0][2] == "7" else None)
    assert billing[:3] == ["billing", "4", "7"] and billing[4] == "tenant-a: 4, tenant-c: 2, tenant-b: 1"
    ids = [r.execute_command("CLUSTER", "MYID").decode()[:8] for r in (ra, rb)]
    assert sorted(billing[3].split(", ")) == sorted(f"{node}: 2" for node in ids)
    assert mail[:3] == ["mail", "1", "1"] and mail[4] == "order-1: 1"
    wait.until(lambda _: dedup("dedup_hits") == 1 and dedup("dedup_granted") == 1)
    assert dedup("dedup_unconfirmed") == 0
    assert len(rb.execute_command("GETJOB", "COUNT", 3, "FROM", "billing")) == 3  # b's own jobs: its keys are gone
    wait.until(lambda _: rows()[0][:3] == ["billing", "2", "4"])
    status, overview = api(http, "/api/overview")
    assert status == 200 and [q["queue"] for q in overview["key_list"]] == ["billing", "mail"]
    for r in (ra, rb):
        r.close()
