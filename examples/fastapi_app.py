"""FastAPI: an async producer in the endpoints, a worker in the background.

`POST /photos/<name>` adds a job with the app's `AsyncClient` (awaited: the
event loop serves other requests meanwhile) and answers with its ID; the
worker, started and stopped with the app (its lifespan), runs the
`thumbnails` handler on the same event loop; `GET /thumbnails` lists what it
made.  In production the worker usually runs apart (`disque worker
fastapi_app:tasks`), which this file also allows.

    make run                                          # a cluster on 7711-7713
    .venv/bin/python examples/fastapi_app.py          # three uploads through the app, then their thumbnails
    cd examples && ../.venv/bin/uvicorn fastapi_app:app   # serve it (pip install uvicorn)

Needs FastAPI, and httpx for the demo (`.venv/bin/pip install fastapi httpx`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from disque.client import Job
from disque.client.worker import App, Worker

tasks = App()  # $DISQUE_NODES, or 127.0.0.1:7711
made: list[str] = []


@tasks.job("thumbnails", retries=2, timeout=30)
async def make_thumbnail(job: Job) -> None:
    await asyncio.sleep(0.01)  # the resizing
    made.append(f"{job.body.decode()}.thumb.jpg")


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    async with tasks.async_client("fastapi") as client:
        api.state.disque = client
        worker = Worker(tasks, concurrency=4)
        running = asyncio.create_task(worker.run(signals=False))  # the server handles the signals
        yield
        worker.stop()  # the running jobs finish (grace), then it returns
        await running


app = FastAPI(lifespan=lifespan)


@app.post("/photos/{name}")
async def upload(name: str) -> dict[str, str]:
    job_id = await app.state.disque.add_job("thumbnails", name, **make_thumbnail.job_options)
    return {"job": job_id}


@app.get("/thumbnails")
async def thumbnails() -> list[str]:
    return sorted(made)


def demo() -> None:
    import time

    from fastapi.testclient import TestClient

    with TestClient(app) as http:  # runs the lifespan: the worker starts, and stops at the end
        for name in ("cat", "dog", "owl"):
            print("queued", http.post(f"/photos/{name}").json()["job"][:2], name, flush=True)
        deadline = time.monotonic() + 30
        while len(http.get("/thumbnails").json()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        print("thumbnails:", ", ".join(http.get("/thumbnails").json()), flush=True)


if __name__ == "__main__":
    demo()
