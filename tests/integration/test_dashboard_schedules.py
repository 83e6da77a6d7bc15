"""The dashboard's schedules panel in headless Chromium, against a real
3-node cluster (the fixtures of test_dashboard.py): every schedule with its
ticks and state, the latest tick any node fired, the tick counters added up,
and whether anyone takes its jobs."""

from __future__ import annotations

import redis
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait
from support import wait_for

from test_dashboard import Cluster, api, browser, cluster, figure, table_rows  # noqa: F401  (fixtures)


def test_the_schedules_panel(cluster: Cluster, browser) -> None:  # noqa: F811
    (a, http), (b, _), (c, _) = cluster
    ra, rb, rc = redis.Redis(port=a.port), redis.Redis(port=b.port), redis.Redis(port=c.port)
    assert ra.execute_command("SCHEDULE", "ADD", "heartbeat", "pings", "ping", "EVERY", 1000, "TTL", 60) == b"OK"
    assert rb.execute_command("SCHEDULE", "ADD", "nightly", "reports", "go", "CRON", "0 3 * * *", "TZ", "Europe/Paris") == b"OK"
    assert rb.execute_command("SCHEDULE", "PAUSE", "nightly") == b"OK"

    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])

    def rows() -> list[list[str]]:
        return table_rows(browser, "schedules")

    def ticks(name: str) -> int:
        return figure(browser, f"#schedule-totals span[data-ticks='{name}']")

    # the PAUSE reaches this node after the ADD, in a message of its own: wait for both, not for the ADD alone
    heartbeat, nightly = wait.until(lambda _: found if len(found := rows()) == 2 and found[0][5] and found[1][4] == "paused" else None)
    assert heartbeat[:5] == ["heartbeat", "pings", "every 1 s", "TTL 60", "running"]
    assert heartbeat[6] and heartbeat[7]  # the node that fired the latest tick, the next tick's time
    assert nightly[:5] == ["nightly", "reports", "0 3 * * * Europe/Paris", "", "paused"] and nightly[5] == nightly[6] == ""
    wait.until(lambda _: ticks("fired") >= 2)
    # nobody takes the heartbeat's jobs: the panel says so, until a consumer takes one
    wait.until(lambda _: (row := rows()[0])[8] != "" and int(row[8]) >= 2 and row[9].startswith("NONE: jobs pile up"))
    assert nightly[8:] == ["0", ""]
    # A node without the ticks' jobs asks the others for them (NEEDJOBS), which may move them there
    # between two of these GETJOBs: ask again until one node hands one out.
    wait_for(lambda: any(r.execute_command("GETJOB", "NOHANG", "FROM", "pings") for r in (ra, rb, rc)), what="a tick's job taken")
    wait.until(lambda _: rows()[0][9].startswith("last taken"))
    assert ticks("refused") == 0
    status, overview = api(http, "/api/overview")
    assert status == 200 and [s["name"] for s in overview["schedule_list"]] == ["heartbeat", "nightly"]
    for r in (ra, rb, rc):
        r.close()
