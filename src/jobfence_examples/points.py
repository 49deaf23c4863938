"""``jobfence demo``: the points-crediting application (SPEC A1) end to end.

It enqueues a few hundred credit jobs with everything a real queue throws at a consumer —
the same job_id many times (a burst of them in parallel), a poison payload, a partner API
that fails twice and then works, and one that never works — runs a worker, and then checks
the ledger against the total that effectively-once processing must produce.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobfence import (
    App,
    Category,
    Delivery,
    Job,
    Observer,
    RetryPolicy,
    TemporaryError,
    Tx,
    list_dead_letters,
)

QUEUE = "jobfence-demo.points.credit"
LEDGER = "jobfence_demo_ledger"

DEMO_POLICY = RetryPolicy(
    base=timedelta(seconds=0.1),
    cap=timedelta(seconds=2),
    justification=(
        "demo only: backoff compressed from a 30 s base to 0.1 s so the demo ends in seconds; "
        "production queues keep the default policy"
    ),
)

_LEDGER_DDL = {
    "postgresql": (
        f"CREATE TABLE IF NOT EXISTS {LEDGER} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " run_id text NOT NULL, job_id text NOT NULL, member_id text NOT NULL,"
        " points integer NOT NULL, credited_at timestamptz NOT NULL DEFAULT now())"
    ),
    "sqlite": (
        f"CREATE TABLE IF NOT EXISTS {LEDGER} (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL,"
        " job_id TEXT NOT NULL, member_id TEXT NOT NULL, points INTEGER NOT NULL,"
        " credited_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
    ),
}
# Deliberately no UNIQUE(job_id) on the ledger: the fence is what keeps credits single.
_INSERT = f"INSERT INTO {LEDGER} (run_id, job_id, member_id, points) VALUES "
_CREDIT = {"postgresql": _INSERT + "(%s, %s, %s, %s)", "sqlite": _INSERT + "(?, ?, ?, ?)"}
_SELECT = f"SELECT count(*), coalesce(sum(points), 0), count(DISTINCT job_id) FROM {LEDGER} "
_TOTALS = {"postgresql": _SELECT + "WHERE run_id = %s", "sqlite": _SELECT + "WHERE run_id = ?"}


class Credit(pydantic.BaseModel):
    """A loyalty credit: give ``points`` to ``member_id``."""

    member_id: str = pydantic.Field(min_length=1)
    points: int = pydantic.Field(gt=0)


@dataclass
class Tally(Observer):
    processed: int = 0
    duplicates: int = 0
    retries: int = 0
    dead: dict[str, int] = field(default_factory=dict)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 0
    progress: Any = None

    @property
    def done(self) -> int:
        return self.processed + self.duplicates + sum(self.dead.values())

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress()
        if self.expected and self.done >= self.expected:
            self.settled.set()

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self.processed += 1
        self._tick()

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        self.duplicates += 1
        self._tick()

    def job_retry(
        self, delivery: Delivery, consumer: str, category: Category, delay: timedelta, error: str
    ) -> None:
        self.retries += 1

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
    ) -> None:
        self.dead[category.value] = self.dead.get(category.value, 0) + 1
        self._tick()


def build_app(database_url: str, tally: Tally, run_id: str) -> App:
    app = App(database_url, auto_migrate=True, observers=[tally])

    @app.consumer(QUEUE, schema=Credit, retry=DEMO_POLICY)
    async def credit(job: Job[Credit], tx: Tx) -> None:
        member = job.payload.member_id
        if member == "member-partner-flaky" and job.attempt < 3:
            raise TemporaryError("loyalty partner API timed out (demo: fails twice, then works)")
        if member == "member-partner-down":
            raise TemporaryError("loyalty partner API answered HTTP 503 (demo: always fails)")
        await tx.execute(_CREDIT[tx.dialect], (run_id, job.job_id, member, job.payload.points))

    return app


@dataclass(frozen=True)
class Plan:
    jobs: list[
        tuple[str, dict[str, Any]]
    ]  # (job_id, payload) in enqueue order, duplicates included
    expected_total: int
    expected_effects: int
    distinct: int


def make_plan(run_id: str, n: int, seed: int = 7) -> Plan:
    rng = random.Random(seed)
    unique: list[tuple[str, dict[str, Any]]] = [
        (f"{run_id}:order-{i}", {"member_id": f"member-{i % 25}", "points": rng.randint(1, 100)})
        for i in range(n)
    ]
    hot = unique[0]
    burst = [hot] * 40  # the same job_id 40 times at the head of the queue: claimed in parallel
    flaky: tuple[str, dict[str, Any]] = (
        f"{run_id}:order-flaky",
        {"member_id": "member-partner-flaky", "points": 50},
    )
    down = (f"{run_id}:order-down", {"member_id": "member-partner-down", "points": 70})
    poison = (f"{run_id}:order-poison", {"member_id": "member-3", "points": "a lot"})
    tail = [rng.choice(unique) for _ in range(max(n // 5, 10))] + [flaky, down, poison]
    rng.shuffle(tail)  # scattered redeliveries among the special cases
    jobs = [*burst, *unique, *tail]
    total = sum(int(p["points"]) for _, p in unique) + int(flaky[1]["points"])
    return Plan(jobs=jobs, expected_total=total, expected_effects=n + 1, distinct=n + 3)


async def run_demo(
    database_url: str | None,
    *,
    jobs: int = 300,
    concurrency: int = 16,
    keep: bool = False,
    console: Console | None = None,
) -> bool:
    console = console or Console()
    tmp: Path | None = None
    if database_url is None:
        tmp = Path(tempfile.mkdtemp(prefix="jobfence-demo-"))
        database_url = f"sqlite:///{tmp / 'demo.db'}"
    run_id = uuid.uuid4().hex[:8]
    tally = Tally()
    app = build_app(database_url, tally, run_id)
    plan = make_plan(run_id, jobs)
    tally.expected = len(plan.jobs)
    console.print(
        f"[bold]jobfence demo[/] — points crediting on {app.url.display} (run {run_id})\n"
        f"{len(plan.jobs)} deliveries of {plan.distinct} distinct jobs: duplicates (40 of one "
        "job_id at once), a poison payload, a flaky partner API, one that is down.\n"
        f"retry policy: {DEMO_POLICY.describe()}"
    )
    started = time.monotonic()
    try:
        async with app:
            async with app.db.transaction() as tx:
                await tx.execute(_LEDGER_DDL[tx.dialect])
            worker = app.worker(concurrency=concurrency, poll_interval=0.5, shutdown_grace=5)
            runner = asyncio.create_task(worker.run())
            with Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            ) as progress:
                task = progress.add_task("settling deliveries", total=len(plan.jobs))
                tally.progress = lambda: progress.update(task, completed=tally.done)
                batch = [
                    app.job(QUEUE, p, job_id=j, correlation_id=f"demo-{run_id}")
                    for j, p in plan.jobs
                ]
                await app.enqueue_many(batch)
                try:
                    await asyncio.wait_for(tally.settled.wait(), timeout=120)
                except TimeoutError:
                    console.print("[red]the demo did not settle within 120 s[/]")
                progress.update(task, completed=tally.done)
            worker.request_stop()
            await runner
            async with app.db.transaction() as tx:
                row = await tx.fetchone(_TOTALS[tx.dialect], (run_id,))
            assert row is not None
            effects, total, distinct_effects = int(row[0]), int(row[1]), int(row[2])
            letters = [
                dl
                for dl in await list_dead_letters(app.db, queue=QUEUE, limit=1000)
                if dl.job_id.startswith(run_id)
            ]
    finally:
        if tmp is not None and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started

    summary = Table(title="summary", show_header=True)
    summary.add_column("")
    summary.add_column("count", justify="right")
    summary.add_row("deliveries enqueued", str(len(plan.jobs)))
    summary.add_row("distinct jobs", str(plan.distinct))
    summary.add_row("effects applied (ledger rows)", str(effects))
    summary.add_row("duplicates skipped", str(tally.duplicates))
    summary.add_row("retries", str(tally.retries))
    for category, count in sorted(tally.dead.items()):
        summary.add_row(f"dead letters: {category}", str(count))
    console.print(summary)

    dl_table = Table(title="dead letters")
    for column in ("job_id", "category", "attempts", "error"):
        dl_table.add_column(column, overflow="fold")
    for dl in letters:
        dl_table.add_row(dl.job_id, dl.error_category, str(dl.attempts), dl.last_error[:90])
    console.print(dl_table)

    checks = [
        (
            "ledger total equals expected total",
            total == plan.expected_total,
            f"{total} == {plan.expected_total}",
        ),
        (
            "one effect per successful job",
            effects == distinct_effects == plan.expected_effects,
            f"{effects} rows, {distinct_effects} job_ids, expected {plan.expected_effects}",
        ),
        (
            "poison payload dead-lettered with 0 retries",
            any(d.error_category == "VALIDATION_ERROR" and d.attempts == 1 for d in letters),
            "",
        ),
        (
            "failing partner dead-lettered after 6 attempts",
            any(d.error_category == "TEMPORARY_ERROR" and d.attempts == 6 for d in letters),
            "",
        ),
    ]
    ok = all(passed for _, passed, _ in checks)
    for name, passed, detail in checks:
        mark = "[green]✓[/]" if passed else "[red]✗[/]"
        console.print(f"{mark} {name} {detail}".rstrip())
    if tmp is not None and keep:
        console.print(f"database kept at {tmp / 'demo.db'}")
    verdict = "[green]effectively-once: OK[/]" if ok else "[red]CHECK FAILED[/]"
    console.print(f"{verdict} in {elapsed:.1f} s")
    return ok
