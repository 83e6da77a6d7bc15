"""The dashboard's limits panel in headless Chromium, against a real 3-node
cluster (the fixtures of test_dashboard.py): every limited queue with its
limits, and the jobs out and handed out added up over the nodes."""

from __future__ import annotations

import redis
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait

from test_dashboard import Cluster, api, browser, cluster, table_rows  # noqa: F401  (fixtures)


def test_the_limits_panel(cluster: Cluster, browser) -> None:  # noqa: F811
    (a, http), (b, _), (c, _) = cluster
    ra = redis.Redis(port=a.port)
    assert ra.execute_command("QCONFIG", "stripe", "SET", "rate-limit", "120/m", "concurrency", 5) == b"OK"
    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])

    def rows() -> list[list[str]]:
        return table_rows(browser, "limits")

    wait.until(lambda _: rows() == [["stripe", "2", "5", "0", "0", "", "0.0"]])
    ra.execute_command("ADDJOB", "stripe", "charge", 0, "REPLICATE", 1)
    assert ra.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "stripe")  # (a token from the queue's home)
    wait.until(lambda _: rows()[0][3:5] == ["1", "1"])
    status, overview = api(http, "/api/overview")
    assert status == 200 and [row["queue"] for row in overview["limit_list"]] == ["stripe"]
    ra.execute_command("QCONFIG", "stripe", "DEL")
    ra.close()
