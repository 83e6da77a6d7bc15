"""The dashboard's workflows panel in headless Chromium, against a real
3-node cluster (the fixtures of test_dashboard.py): INFO workflows of every
node added up (held jobs, batches, callbacks fired, results kept)."""

from __future__ import annotations

import redis
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait

from test_dashboard import Cluster, api, browser, cluster, figure  # noqa: F401  (fixtures)


def test_the_workflows_panel(cluster: Cluster, browser) -> None:  # noqa: F811
    (a, http), _, _ = cluster
    ra = redis.Redis(port=a.port)
    parent = ra.execute_command("ADDJOB", "wf-parents", "p", 5000).decode()
    ra.execute_command("ADDJOB", "wf-children", "c", 5000, "AFTER", parent)
    batch = ra.execute_command("BATCH", "NEW", "ON-COMPLETE", "wf-callbacks", "done")
    ra.execute_command("BATCH", "CLOSE", batch)

    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])

    def flow(name: str) -> int:
        return figure(browser, f"#workflow-totals span[data-figure='{name}']")

    wait.until(lambda _: flow("jobs_held") >= 1 and flow("batches") >= 1 and flow("batch_callbacks_fired") >= 1)
    (job,) = ra.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", "wf-parents")
    ra.execute_command("ACKJOB", job[1], "RESULT", "r")
    wait.until(lambda _: flow("jobs_released") >= 1 and flow("results_kept") >= 1)
    ra.close()
