"""The dashboard in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by `make test`) against a real 3-node cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from disque.devcluster import NodeProcess, free_port, join

# `DISQUE_SCREENSHOT=docs/dashboard.png pytest tests/integration/test_dashboard.py`
# refreshes the picture in the docs; every run saves one under tmp_path.
SCREENSHOT = os.environ.get("DISQUE_SCREENSHOT")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[tuple[NodeProcess, int]]]:
    nodes = []
    try:
        for i in range(3):
            http = free_port()
            nodes.append((NodeProcess(free_port(), tmp_path / f"node{i}", "--metrics-port", str(http)).start(), http))
        join([node for node, _ in nodes])
        yield nodes
    finally:
        for node, _ in nodes:
            node.stop()


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_dashboard_shows_the_cluster_and_acts_on_it(cluster, browser, tmp_path: Path) -> None:
    (node, http), (other, _), _ = cluster
    r = redis.Redis(port=node.port)
    for i in range(3):
        r.execute_command("ADDJOB", "orders", f"order {i}", 0, "REPLICATE", 1)
    job_id = r.execute_command("ADDJOB", "invoices", "invoice 7", 0, "REPLICATE", 1).decode()
    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 10, ignored_exceptions=[StaleElementReferenceException])  # the tables are redrawn live

    def rows(table: str) -> list[list[str]]:
        return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]

    def click(selector: str) -> None:
        """Click an element of a table that may be redrawn under the click (retried then)."""
        wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, selector).click() or True)

    # the three nodes, this one marked, the bus links to the two others up
    nodes = wait.until(lambda _: found if len(found := rows("nodes")) == 3 else None)
    assert sum("(this node)" in row[0] for row in nodes) == 1
    assert sorted(row[3] for row in nodes) == ["-", "connected", "connected"]
    # the queues with their lengths, updated live
    wait.until(lambda _: {row[0]: row[1] for row in rows("queues")} == {"invoices": "1", "orders": "3"})
    r.execute_command("ADDJOB", "orders", "order 3", 0, "REPLICATE", 1)
    wait.until(lambda _: {row[0]: row[1] for row in rows("queues")}.get("orders") == "4")
    wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, '#jobs span[data-state="queued"]').text == "queued: 5")
    # a job looked up by ID (SHOW)
    browser.find_element(By.ID, "job-id").send_keys(job_id)
    browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, '#job tr[data-field="body"]'))
    fields = {row[0]: row[1] for row in rows("job")}
    assert fields["id"] == job_id and fields["queue"] == "invoices" and fields["body"] == "invoice 7"
    # pause a queue (PAUSE ... BCAST: the other nodes follow), then resume it
    click('tr[data-queue="orders"] button.toggle')
    wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="orders"] td.pause').text == "in")
    other_client = redis.Redis(port=other.port)
    wait.until(lambda _: other_client.execute_command("PAUSE", "orders", "state") == b"in")
    assert r.execute_command("PAUSE", "orders", "state") == b"in"
    path = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(path)) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    click('tr[data-queue="orders"] button.toggle')
    wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="orders"] td.pause').text == "none")
    assert r.execute_command("PAUSE", "orders", "state") == b"none"
    r.close()
    other_client.close()
