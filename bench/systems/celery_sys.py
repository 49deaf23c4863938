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


def fill(task_name: str, n: int) -> None:
    """Fill the queue with ``n`` messages in Celery's own wire format, fast.

    ``apply_async`` costs several milliseconds of CPU per message on these machines, which
    would make filling 50 000 messages take minutes of set-up (publishing is not what is
    measured). So one message is published with ``apply_async`` (which also declares the
    queue's bindings), taken back raw, and used as the template for all ``n``: each gets its
    own args, task id and delivery tag, pushed in pipelined batches, in order.
    """
    import base64
    import uuid

    import redis

    with app.producer_or_acquire() as producer:
        app.tasks[task_name].apply_async((0,), producer=producer)
    r = redis.Redis.from_url(app.conf.broker_url)
    raw = r.rpop(QUEUE)
    assert raw is not None, "the template message did not arrive"
    template = json.loads(raw)
    _, kwargs, embed = json.loads(base64.b64decode(template["body"]))
    for start in range(0, n, 2000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(n, start + 2000)):
            task_id = str(uuid.uuid4())
            message = json.loads(raw)
            message["body"] = base64.b64encode(json.dumps([[i], kwargs, embed]).encode()).decode()
            message["headers"].update(id=task_id, root_id=task_id, argsrepr=f"({i},)")
            message["properties"].update(correlation_id=task_id, delivery_tag=str(uuid.uuid4()))
            pipe.lpush(QUEUE, json.dumps(message))
        pipe.execute()
    r.close()


def produce(rate: float, seconds: float) -> None:
    """``apply_async`` on a steady schedule (job i due at start + i / rate), four producer
    threads."""
    import itertools
    import threading

    total = int(rate * seconds)
    todo = iter(range(total))
    lock = threading.Lock()
    start = time.perf_counter()

    def lane() -> None:
        with app.producer_or_acquire() as producer:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                effect.apply_async((i, time.time()), producer=producer)

    threads = [threading.Thread(target=lane) for _ in itertools.repeat(None, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say(sent=total, seconds=time.perf_counter() - start)


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
        fill(task.name, a.n)
        say(seconds=time.perf_counter() - t0)
    elif a.command == "produce":
        produce(a.rate, a.seconds)
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
