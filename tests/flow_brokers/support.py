"""What the broker flow-control proofs share: the runs table, reading it back, and the two
measures — the most jobs of one key running at once, and the most starts of one key in any
window of a given length."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg

from tests.helpers import query

RUNS_DDL = (
    "CREATE TABLE flow_runs (job_id TEXT NOT NULL, key TEXT NOT NULL, attempt INTEGER NOT NULL,"
    " lost INTEGER NOT NULL, pid INTEGER NOT NULL, started TIMESTAMPTZ NOT NULL,"
    " ended TIMESTAMPTZ NOT NULL)"
)


def create_runs_table(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RUNS_DDL)


@dataclass(frozen=True)
class Run:
    job_id: str
    key: str
    attempt: int
    lost: int
    pid: int
    started: datetime
    ended: datetime


async def runs(database_url: str) -> list[Run]:
    rows = await query(
        database_url,
        "SELECT job_id, key, attempt, lost, pid, started, ended FROM flow_runs ORDER BY started",
    )
    return [Run(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), r[5], r[6]) for r in rows]


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment (an end at the same instant as a start does
    not overlap it)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def most_at_once_per_key(found: list[Run]) -> dict[str, int]:
    by_key: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for run in found:
        by_key[run.key].append((run.started, run.ended))
    return {key: most_at_once(spans) for key, spans in by_key.items()}


def most_in_window(starts: list[datetime], seconds: float) -> int:
    """The most ``starts`` within any window of ``seconds`` (half-open: [t, t + seconds))."""
    times = sorted(s.timestamp() for s in starts)
    most = 0
    first = 0
    for last, t in enumerate(times):
        while t - times[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def deferrals(marks: Path) -> list[tuple[str, int, str, str]]:
    """(job_id, attempt, reason, key) of every deferral the workers' Observer saw."""
    found = []
    for path in marks.glob("deferred.*"):
        for line in path.read_text().splitlines():
            job_id, attempt, reason, key = line.split(" ")
            found.append((job_id, int(attempt), reason, key))
    return found
