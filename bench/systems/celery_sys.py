"""Celery on Redis as a peer under benchmark (runs in bench/.venv-peers).

Same commands as ``jobfence_sys.py``; the broker is ``$BENCH_REDIS`` (a Redis database of
its own) and the queue ``$BENCH_QUEUE``. Settings for a durable effect: ``acks_late`` (the
message is acknowledged after the task returns, so after the effect's commit), no result
backend, the prefork pool with one process per core, a prefetch multiplier (bench/run.py
sets it), and no gossip/mingle/heartbeat chatter. The effect is one INSERT committed on a
per-process psycopg connection before the task returns.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import psycopg
from celery import Celery

QUEUE = os.environ.get("BENCH_QUEUE", "bench")
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, job_id text NOT NULL,"
    " t_enq float8, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
EFFECT = "INSERT INTO bench_effects (job_id, t_enq) VALUES (%s, %s)"

app = Celery("bench", broker=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "16")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

_conn: psycopg.Connection[Any] | None = None


def _db() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
    return _conn


@app.task(name="effect")
def effect(n: int, t: float | None = None) -> None:
    _db().execute(EFFECT, (f"job-{n}", t))


@app.task(name="noop")
def noop(n: int, t: float | None = None) -> None:
    return None


def say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup", "enqueue", "worker", "produce"])
    parser.add_argument("url")
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--mode", choices=["durable", "noop"], default="durable")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    a = parser.parse_args()
    os.environ["BENCH_DATABASE_URL"] = a.url
    task = effect if a.mode == "durable" else noop
    if a.command == "setup":
        with psycopg.connect(a.url, autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        say(ok=True)
    elif a.command == "enqueue":
        t0 = time.perf_counter()
        with app.producer_or_acquire() as producer:
            for i in range(a.n):
                task.apply_async((i,), producer=producer)
        say(seconds=time.perf_counter() - t0)
    elif a.command == "produce":
        total = int(a.rate * a.seconds)
        late = 0
        with app.producer_or_acquire() as producer:
            start = time.perf_counter()
            for i in range(total):
                ahead = start + i / a.rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -0.05:
                    late += 1
                effect.apply_async((i, time.time()), producer=producer)
        say(sent=total, seconds=time.perf_counter() - start, late=late)
    else:
        say(ready=True)
        app.worker_main(
            [
                "worker",
                "--pool=prefork",
                f"--concurrency={a.concurrency}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=WARNING",
                "-Q",
                QUEUE,
            ]
        )


if __name__ == "__main__":
    main()
