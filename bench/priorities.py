"""Job priorities (issue 26 §3): how long an urgent job waits behind a backlog.

    .venv/bin/python bench/priorities.py                    # 10 000 waiting, 200 probes
    .venv/bin/python bench/priorities.py --backlog 2000 --probes 50

Each mode runs on a fresh PostgreSQL database on $JOBFENCE_BENCH_PG (dropped after): one
in-process worker (``concurrency`` 20, the defaults otherwise) on one queue whose handler
works 5 ms per job; ``--backlog`` jobs of priority 0 wait, kept topped up to that depth while
the probes run. A probe is one job enqueued every 50 ms; its latency is from just before the
``enqueue`` call to the start of its handler (one clock, this process). Modes:

- ``priority 9, prefetch 0, batch 1``: the probes have priority 9, the backlog 0; the
  worker claims only for its free slots (``prefetch=0``) and runs one job per transaction
  (``batch_size=1``) — a probe waits for the next free slot;
- ``priority 9, prefetch 0``: the same with group commit (the default ``batch_size``): a
  probe waits for a slot's batch of jobs to end;
- ``priority 9, worker defaults``: and with the default prefetch (``concurrency`` × the
  group-commit batch): a probe also waits for every job the worker holds already, which it
  runs in the order it claimed them;
- ``no priority, worker defaults``: the probes have priority 0 like the backlog — each waits
  for the ``--backlog`` jobs ahead of it (what a queue without priorities does).

Prints one table row per mode: p50, p99 and max of the probes' latency, the backlog's drain
rate meanwhile, and the ratio of the p50s; the last line is the result as JSON. Every run
checks that each probe ran exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

PG = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "bench.priorities"
PROBE_EVERY = 0.05
WORK = 0.005


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    name = f"jf_bench_prio_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield PG.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _run(
    url: str,
    backlog: int,
    probes: int,
    probe_priority: int,
    prefetch: int | None,
    batch_size: int | None,
) -> dict[str, Any]:
    from jobfence import App, Job, Tx

    app = App(url, auto_migrate=True)
    started: dict[str, float] = {}
    seen: set[str] = set()
    done = [0]

    @app.consumer(QUEUE)
    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.payload.get("probe"):
            if job.job_id in seen:
                raise AssertionError(f"probe {job.job_id} ran twice")
            seen.add(job.job_id)
            started[job.job_id] = time.monotonic()
        else:
            done[0] += 1
            await asyncio.sleep(WORK)

    sent: dict[str, float] = {}
    async with app:
        filler = [0]

        async def top_up() -> None:
            rows = await app.db.run("queue_backlog")
            waiting = sum(int(r["waiting"]) for r in rows if r["queue"] == QUEUE)
            missing = backlog - waiting
            if missing > 0:
                jobs = [app.job(QUEUE, {"n": filler[0] + i}) for i in range(missing)]
                filler[0] += missing
                await app.enqueue_many(jobs)

        await top_up()
        worker = (
            app.worker(concurrency=20, prefetch=prefetch)
            if batch_size is None
            else app.worker(concurrency=20, prefetch=prefetch, batch_size=batch_size)
        )
        running = asyncio.create_task(worker.run())
        try:
            began = time.monotonic()
            drained_before = done[0]
            next_top_up = time.monotonic()
            for n in range(probes):
                if time.monotonic() >= next_top_up:
                    await top_up()
                    next_top_up = time.monotonic() + 0.25
                job_id = f"probe-{n}"
                sent[job_id] = time.monotonic()
                await app.enqueue(QUEUE, {"probe": True}, job_id=job_id, priority=probe_priority)
                await asyncio.sleep(PROBE_EVERY)
            deadline = time.monotonic() + 600
            while len(started) < probes:
                if time.monotonic() > deadline:
                    raise AssertionError(f"only {len(started)} of {probes} probes ran in 600 s")
                if time.monotonic() >= next_top_up:
                    await top_up()
                    next_top_up = time.monotonic() + 0.25
                await asyncio.sleep(0.01)
            rate = (done[0] - drained_before) / (time.monotonic() - began)
        finally:
            worker.request_stop()
            await asyncio.wait([running], timeout=120)
    latencies = [(started[j] - sent[j]) * 1000 for j in sent]
    assert len(seen) == probes
    return {
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "backlog_jobs_per_s": rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--probes", type=int, default=200)
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    modes = (
        ("priority 9, prefetch 0, batch 1", 9, 0, 1),
        ("priority 9, prefetch 0", 9, 0, None),
        ("priority 9, worker defaults", 9, None, None),
        ("no priority, worker defaults", 0, None, None),
    )
    for label, priority, prefetch, batch in modes:
        with fresh_database() as url:
            results[label] = asyncio.run(
                _run(url, args.backlog, args.probes, priority, prefetch, batch)
            )
    base = results["no priority, worker defaults"]["p50_ms"]
    ratio = base / results["priority 9, prefetch 0, batch 1"]["p50_ms"]
    print(
        f"{'probes behind ' + format(args.backlog, ',') + ' waiting jobs':<36}"
        f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'backlog jobs/s':>16}"
    )
    for label, r in results.items():
        print(
            f"{label:<36}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}{r['max_ms']:>10.1f}"
            f"{r['backlog_jobs_per_s']:>16,.0f}"
        )
    print(f"p50 without priorities / with priority 9, prefetch 0, batch 1: {ratio:,.0f}x")
    print(json.dumps({"backlog": args.backlog, "probes": args.probes, **results}))


if __name__ == "__main__":
    main()
