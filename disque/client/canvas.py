"""Chains, groups and chords that read like Celery's canvas, over ADDJOB ... AFTER.

    from disque.client.canvas import chain, chord, group, job

    tails = chain(job("fetch", url), job("parse", url), job("index", url)).send(client)
    tails = chord([job("resize", name) for name in names], job("zip", "all")).send(client)
    count, results = client.wait_results(*tails)

Every job is added at once; the cluster holds each one until the jobs it
waits for are acknowledged (docs/workflows.md), so nothing here waits or
polls.  `send` returns the IDs of the last jobs, those a next step would
wait for: `JobHandle`s, so `tails[0].wait(timeout)` is the last job's
result once it is acknowledged.  For the blocking `Client` (an `AsyncClient`'s add_job is awaited:
use `after=` there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from disque.client.sync import Client


class Canvas(Protocol):
    def send(self, client: Client, after: Iterable[str] = ()) -> list[str]:
        """Add the jobs, the first ones after `after`; the IDs of the last ones."""
        ...


@dataclass(frozen=True)
class Job:
    """One job: its queue, body and add_job's options."""

    queue: str
    body: str | bytes
    options: dict[str, Any] = field(default_factory=dict)

    def send(self, client: Client, after: Iterable[str] = ()) -> list[str]:
        return [client.add_job(self.queue, self.body, after=after, **self.options)]


@dataclass(frozen=True)
class Chain:
    """Each step after the one before it (all of its jobs, for a group)."""

    steps: tuple[Canvas, ...]

    def send(self, client: Client, after: Iterable[str] = ()) -> list[str]:
        tails = list(after)
        for step in self.steps:
            tails = step.send(client, tails)
        return tails


@dataclass(frozen=True)
class Group:
    """Every member at once (each after `after`); its tails are all of theirs."""

    members: tuple[Canvas, ...]

    def send(self, client: Client, after: Iterable[str] = ()) -> list[str]:
        after = list(after)
        return [tail for member in self.members for tail in member.send(client, after)]


def job(queue: str, body: str | bytes, **options: Any) -> Job:
    return Job(queue, body, options)


def chain(*steps: Canvas) -> Chain:
    return Chain(steps)


def group(members: Iterable[Canvas]) -> Group:
    return Group(tuple(members))


def chord(header: Iterable[Canvas], body: Canvas) -> Chain:
    """`body` once every job of `header` is acknowledged (Celery's chord,
    with no `chord_unlock` polling: the cluster holds `body`)."""
    return Chain((group(header), body))
