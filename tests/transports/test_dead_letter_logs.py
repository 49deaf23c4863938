"""One stored dead letter is logged once (issue 10 §3.4).

Writing a dead letter is idempotent (SPEC D1: one pending letter per consumer and job_id),
so the same poison delivered three times stores one letter; the log said "job dead-lettered"
three times. Now the first delivery logs that, the others log "dead letter already recorded"
at INFO. A real `jobfence worker` process with JSON logs, on every transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobfence.core.jobs import Delivery
from jobfence.errors import Category
from jobfence.logs import LogObserver
from jobfence.observers import Observer, Observers

from ..contract.support import (
    KINDS,
    Target,
    cleanup,
    make_target,
    remaining,
    start_worker,
    stop_worker,
    wait_started,
)
from ..helpers import eventually, query, table

DEAD = "job dead-lettered"
AGAIN = "dead letter already recorded"


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


def _entries(log: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


async def test_the_same_poison_delivered_three_times_logs_one_dead_letter(
    target: Target, tmp_path: Path
) -> None:
    """Three copies of one job_id, each not JSON (poison): one dead letter row; one
    "job dead-lettered" line (WARNING, with the letter's id) and two "dead letter already
    recorded" lines (INFO) for the same job."""
    log = tmp_path / "worker.log"
    worker = start_worker(target.env(tmp_path, lease=5.0), log, "--log-format", "json")
    try:
        await wait_started(log)
        app = target.app()
        async with app:
            await app.enqueue_many(
                [app.job(target.queue, b"\xffnot json", job_id="poison-1") for _ in range(3)]
            )

        def answered() -> bool:
            events = [e["event"] for e in _entries(log)]
            return events.count(DEAD) + events.count(AGAIN) >= 3

        await eventually(answered, timeout=60, what="three dead-letter log lines")
        await eventually(lambda: _empty(target), timeout=60, what="the queue drained")
    finally:
        code = stop_worker(worker)
    assert code == 0
    db = target.database_url
    rows = await query(db, f"SELECT id, job_id, attempts FROM {table(db, 'dead_letters')}")
    assert [(job_id, attempts) for _, job_id, attempts in rows] == [("poison-1", 1)]
    letter_id = rows[0][0]
    entries = [e for e in _entries(log) if e["event"] in (DEAD, AGAIN)]
    dead = [e for e in entries if e["event"] == DEAD]
    again = [e for e in entries if e["event"] == AGAIN]
    assert len(dead) == 1, entries
    assert (dead[0]["level"], dead[0]["job_id"], dead[0]["dead_letter_id"]) == (
        "warning",
        "poison-1",
        letter_id,
    )
    assert len(again) == 2, entries
    assert {(e["level"], e["job_id"], e["category"]) for e in again} == {
        ("info", "poison-1", "VALIDATION_ERROR")
    }


async def _empty(target: Target) -> bool:
    return await remaining(target) == 0


class OldStyle(Observer):
    """An observer written before ``created`` existed."""

    def __init__(self) -> None:
        self.calls: list[int | None] = []

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
    ) -> None:
        self.calls.append(dead_letter_id)


class NewStyle(Observer):
    def __init__(self) -> None:
        self.calls: list[tuple[int | None, bool]] = []

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
        *,
        created: bool = True,
    ) -> None:
        self.calls.append((dead_letter_id, created))


def test_job_dead_passes_created_to_the_observers_that_take_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Observers.job_dead(..., created=False)`` (what the harness passes when the store
    found the letter already recorded, with that letter's id): the log says "dead letter
    already recorded" with the id at INFO; an observer that takes ``created`` gets it, one
    written before it existed is still called, without it, and nothing fails."""
    old, new = OldStyle(), NewStyle()
    observers = Observers([LogObserver(), old, new])
    delivery = Delivery(queue="q", job_id="j-1", payload=b"x", attempt=2, correlation_id="c-1")
    with caplog.at_level(logging.DEBUG):
        observers.job_dead(delivery, "q", Category.VALIDATION_ERROR, "bad", 41)
        observers.job_dead(delivery, "q", Category.VALIDATION_ERROR, "bad", 41, created=False)
    assert old.calls == [41, 41]
    assert new.calls == [(41, True), (41, False)]
    records = [
        (r.levelname, r.getMessage(), getattr(r, "dead_letter_id", "-")) for r in caplog.records
    ]
    assert records == [
        ("WARNING", DEAD, 41),
        ("INFO", AGAIN, 41),
    ]
    again = caplog.records[1]
    assert (again.job_id, again.correlation_id, again.category) == (  # type: ignore[attr-defined]
        "j-1",
        "c-1",
        "VALIDATION_ERROR",
    )
