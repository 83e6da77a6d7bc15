"""The dashboard in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by `make tools-browser`) against a real 3-node
cluster whose HTTP ports sit as far from their client ports as `make run`'s
(the node serving the page finds the others' that way)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from support import wait_for

from disque.testing.devcluster import NodeProcess, _bindable, join, ports_below_ephemeral

# `DISQUE_SCREENSHOT=docs/dashboard.png pytest tests/integration/test_dashboard.py`
# refreshes the picture in the docs; every run saves one under tmp_path.
SCREENSHOT = os.environ.get("DISQUE_SCREENSHOT")
Cluster = list[tuple[NodeProcess, int]]  # (node, its HTTP port)


def start_cluster(tmp_path: Path, *extra: str, attempts: int = 3) -> Cluster:
    """Three joined nodes; node i's HTTP port is its client port less the same
    offset for all.  Every test run picks its ports the same way, so another
    run may bind them between the check and a node's start: that node exits,
    and the cluster is made again on the next free ports, in a new directory."""
    for attempt in range(attempts - 1):
        try:
            return _start_cluster(tmp_path / f"attempt{attempt}", *extra)
        except RuntimeError:
            pass  # a node could not bind its ports: the next ones
    return _start_cluster(tmp_path / f"attempt{attempts - 1}", *extra)


def _start_cluster(tmp_path: Path, *extra: str) -> Cluster:
    first = ports_below_ephemeral(3)
    offset = next(o for o in range(-500, -20_000, -500) if all(_bindable("127.0.0.1", first + o + i) for i in range(3)))
    nodes: Cluster = []
    try:
        for i in range(3):
            port = first + i
            node = NodeProcess(port, tmp_path / f"node{i}", "--metrics-port", str(port + offset), *extra)
            nodes.append((node.start(), port + offset))
        join([node for node, _ in nodes])
    except BaseException:
        for node, _ in nodes:
            node.stop()
        raise
    return nodes


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = start_cluster(tmp_path)
    try:
        yield nodes
    finally:
        for node, _ in nodes:
            node.stop()


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1900"):
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def api(http: int, path: str, body: Any = None, password: str | None = None) -> tuple[int, Any]:
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {password}"} if password else {})
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{http}{path}", data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def table_rows(browser: webdriver.Chrome, table: str) -> list[list[str]]:
    """The text of the cells of a table's rows, read at once (the page redraws its tables every second)."""
    script = "return [...document.querySelectorAll(arguments[0])].map(tr => [...tr.cells].map(td => td.innerText.trim()))"
    return browser.execute_script(script, f"#{table} tbody tr")


def figure(browser: webdriver.Chrome, selector: str) -> int:
    """The number a line of figures shows in the span `selector` (`name: n`); -1 before it is drawn."""
    found = browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector)
    return int(found.rpartition(" ")[2] or -1)


def dead_letter(client: redis.Redis, queue: str, body: str, *error: str) -> None:
    """A job of `queue` out of attempts at once (NACK ... `error`): dead-lettered into <queue>-dead on this node."""
    job_id = client.execute_command("ADDJOB", queue, body, 0, "REPLICATE", 1, "RETRY", 30, "MAXATTEMPTS", 1)
    [[_, got, _]] = client.execute_command("GETJOB", "FROM", queue)
    assert got == job_id and client.execute_command("NACK", job_id, *error) == 1


def test_the_dashboard_shows_the_whole_cluster_and_acts_on_it(cluster: Cluster, browser, tmp_path: Path) -> None:
    (a, http), (b, _), (c, _) = cluster
    ra, rb, rc = (redis.Redis(port=n.port) for n in (a, b, c))
    for client, n in ((ra, 3), (rb, 2)):
        for i in range(n):
            client.execute_command("ADDJOB", "orders", f"order {i}", 0, "REPLICATE", 1)
    job_id = rc.execute_command("ADDJOB", "invoices", "invoice 7", 0, "REPLICATE", 1).decode()
    for client, n in ((ra, 2), (rb, 1)):
        for i in range(n):
            error = ("ERROR", "CardDeclined", f"card {i} declined", "TRACEBACK", "Traceback ...\nCardDeclined", "HOST", "w1", "PID", "77")
            dead_letter(client, "payments", f"payment {i} on {client.connection_pool.connection_kwargs['port']}", *error)
    rc.execute_command("QADD", "events", 60, "e1")
    assert rc.execute_command("QGET", "events", "billing")  # a group with one event in progress
    worker = redis.Redis(port=b.port, socket_timeout=None)  # blocked for as long as the test runs
    worker.execute_command("CLIENT", "SETNAME", "worker-7")
    waiting = threading.Thread(target=worker.execute_command, args=("GETJOB", "TIMEOUT", 60_000, "FROM", "idle"), daemon=True)
    waiting.start()

    browser.get(f"http://127.0.0.1:{http}/")
    wait = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])  # the tables are redrawn live

    def rows(table: str) -> list[list[str]]:
        return table_rows(browser, table)

    def text(selector: str) -> str:
        return browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : ''", selector)

    def click(selector: str) -> None:
        """Click an element of a table that may be redrawn under the click (retried then)."""
        wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, selector).click() or True)

    # the three nodes, this one marked, every node's figures reached through this one
    nodes = wait.until(lambda _: found if len(found := rows("nodes")) == 3 and all(r[4] == "ok" for r in found) else None)
    assert sum("(this node)" in row[0] for row in nodes) == 1
    assert sorted(row[3] for row in nodes) == ["-", "connected", "connected"]
    assert [row[9] for row in nodes] == ["-"] * 3  # no zones (docs/zones.md)
    # queues added up over the nodes: 3 + 2 orders on two nodes
    wait.until(lambda _: {row[0]: row[1] for row in rows("queues")}.get("orders") == "5")
    orders = next(row for row in rows("queues") if row[0] == "orders")
    assert sorted(orders[2].split(" / ")) == ["2", "3"]
    wait.until(lambda _: text('#jobs span[data-state="queued"]') == "queued: 9")  # 5 orders, 1 invoice, 3 dead letters
    # a queue served on another node: its rates show here
    for i in range(30):
        rc.execute_command("ADDJOB", "orders", f"more {i}", 0, "REPLICATE", 1)
    assert len(rb.execute_command("GETJOB", "COUNT", 2, "FROM", "orders")) == 2
    wait.until(lambda _: float(text('tr[data-queue="orders"] td.rate-in')) > 0 and float(text('tr[data-queue="orders"] td.rate-out')) > 0)
    # dead letters of two nodes, the consumer group, the named worker waiting, every node's health
    wait.until(lambda _: {row[1]: row[2] for row in rows("deadletters")} == {"payments-dead": "3"})
    [dead_row] = rows("deadletters")
    assert dead_row[0] == "CardDeclined: card 0 declined" and dead_row[4] == "payments"  # the error first
    click('tr[data-queue="payments-dead"] td.error a')  # the job behind it: SHOW, with its traceback, host and process
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, '#job tr[data-field="error-traceback"]'))
    shown = {row[0]: row[1] for row in rows("job")}
    assert (shown["error-type"], shown["error-host"], shown["error-pid"], shown["dead-letter-from"]) == ("CardDeclined", "w1", "77", "payments")
    # the same dead letters through the API, every node's, filtered
    status, listed = api(http, "/api/deadletters/payments-dead?error=CardDeclined")
    assert status == 200 and len(listed["dead_letters"]) == 3 and len(listed["nodes"]) == 3
    assert {e["error-message"] for e in listed["dead_letters"]} == {"card 0 declined", "card 1 declined"}
    assert api(http, "/api/deadletters/payments-dead?error=Other&scope=node")[1]["dead_letters"] == []
    assert api(http, "/api/deadletters/payments-dead?since=soon")[0] == 400
    wait.until(lambda _: any(row[:2] == ["events", "billing"] and row[3] == "1" for row in rows("groups")))
    wait.until(lambda _: any(row[2] == "worker-7" and row[7] == "idle" for row in rows("clients")))
    health = wait.until(lambda _: found if len(found := rows("health")) == 3 else None)
    assert {row[5] for row in health} == {"ok"} and all(row[2] != "0" for row in health)
    # pause a queue (PAUSE ... BCAST: the other nodes follow)
    click('tr[data-queue="orders"] button.toggle')
    wait.until(lambda _: text('tr[data-queue="orders"] td.pause') == "in")
    wait_for(lambda: rc.execute_command("PAUSE", "orders", "state") == b"in", timeout=30, what="pause on another node")
    # the history of the last hour, added up over the nodes, drawn once a slot has passed
    for i in range(5):
        rb.execute_command("ADDJOB", "invoices", f"invoice {i}", 0, "REPLICATE", 1)
    def invoices_in() -> int:
        merged = api(http, "/api/cluster/history")[1]
        assert len(merged["nodes"]) == 3 and not any("error" in n for n in merged["nodes"])
        return sum(merged["history"]["queues"].get("invoices", {"in": []})["in"])

    wait_for(lambda: invoices_in() >= 5, timeout=40, what="history of the jobs added")  # sampled every 10 s
    wait_history = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])
    wait_history.until(lambda _: browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="invoices"] td.spark polyline.in'))
    assert browser.find_elements(By.CSS_SELECTOR, "#chart polyline.in")
    path = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(path)) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    click('tr[data-queue="orders"] button.toggle')
    wait.until(lambda _: text('tr[data-queue="orders"] td.pause') == "none")
    # requeue the dead letters of every node from the page
    click('tr[data-queue="payments-dead"] button.requeue')
    wait.until(lambda _: text("#requeue-result").startswith("payments-dead: 3 requeued"))
    wait.until(lambda _: rows("deadletters") == [])
    assert sum(client.execute_command("QLEN", "payments") for client in (ra, rb, rc)) == 3
    assert sum(client.execute_command("QLEN", "payments-dead") for client in (ra, rb, rc)) == 0
    # a job looked up by ID: SHOW on the node that has it
    browser.find_element(By.ID, "job-id").clear()  # (it holds the dead letter looked up above)
    browser.find_element(By.ID, "job-id").send_keys(job_id)
    browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, '#job tr[data-field="body"]'))
    fields = {row[0]: row[1] for row in rows("job")}
    assert (fields["id"], fields["queue"], fields["body"]) == (job_id, "invoices", "invoice 7")
    assert fields["node"] == rc.execute_command("CLUSTER", "MYID").decode()[:8]  # asked of the others
    rb.execute_command("ADDJOB", "idle", "wake up", 0, "REPLICATE", 1)  # the worker's GETJOB returns
    waiting.join(10)
    assert not waiting.is_alive()
    for client in (ra, rb, rc, worker):
        client.close()


def test_requeue_needs_the_password_and_reaches_every_node(tmp_path: Path) -> None:
    """The requeue endpoint: the password first (as the pause endpoint), then
    DEADLETTER REQUEUE on this node and, through their HTTP ports, on the others;
    a node that does not answer is listed with its error."""
    cluster = start_cluster(tmp_path)
    try:
        (a, http), (b, _), (c, _) = cluster
        for node, _ in cluster:
            with redis.Redis(port=node.port) as admin:
                assert admin.execute_command("CONFIG", "SET", "requirepass", "s3cret") == b"OK"
        clients = [redis.Redis(port=n.port, password="s3cret") for n in (a, b, c)]
        for client, n in zip(clients, (2, 1, 0)):
            for i in range(n):
                dead_letter(client, "mail", f"m{i}")
        assert api(http, "/api/deadletters/mail-dead/requeue", {"scope": "cluster"})[0] == 401
        assert api(http, "/api/deadletters/mail-dead/requeue", {"scope": "cluster"}, "wrong")[0] == 401
        assert api(http, "/api/deadletters/mail-dead/requeue", {"scope": "all"}, "s3cret")[0] == 400
        status, reply = api(http, "/api/deadletters/mail-dead/requeue", {"scope": "node"}, "s3cret")
        assert status == 200 and reply["requeued"] == 2 and len(reply["nodes"]) == 1
        c.stop()
        status, reply = api(http, "/api/deadletters/mail-dead/requeue", {}, "s3cret")  # the cluster by default
        assert status == 200 and reply["requeued"] == 1
        assert sorted("error" in n for n in reply["nodes"]) == [False, False, True]
        assert [client.execute_command("QLEN", "mail") for client in clients[:2]] == [2, 1]
        status, overview = api(http, "/api/cluster")
        assert status == 200 and sorted("error" in n for n in overview["nodes"]) == [False, False, True]
        # delete: the same password, the filters, a rate
        for client, error in zip(clients[:2], ("E", "F")):
            for i in range(2):
                dead_letter(client, "post", f"d{i}", "ERROR", error, "m")
        for bad, problem in (({"error": 5}, "error must be a name"), ({"count": 0}, "count and rate must be positive integers"),
                             ({"bogus": 1}, "unknown field 'bogus'"), ({"since": -1}, "since must be a non-negative integer")):  # fmt: skip
            assert api(http, "/api/deadletters/post-dead/delete", bad, "s3cret") == (400, {"error": problem})
        assert api(http, "/api/deadletters/post-dead/delete", {"error": "E"})[0] == 401
        status, reply = api(http, "/api/deadletters/post-dead/delete", {"error": "E", "rate": 1, "scope": "node"}, "s3cret")
        assert status == 200 and reply["deleted"] == 2
        status, reply = api(http, "/api/deadletters/post-dead/delete", {"count": 5}, "s3cret")
        assert status == 200 and reply["deleted"] == 2 and sum(client.execute_command("QLEN", "post-dead") for client in clients[:2]) == 0
        for client in clients[:2]:
            client.close()
    finally:
        for node, _ in cluster:
            node.stop()
