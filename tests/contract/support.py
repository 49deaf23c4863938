"""What the contract suite needs to run one test against one transport on a real server.

A :class:`Target` is a transport under test: the fence's database, the queue URL (None:
the database queue next to the fence), a queue name of its own, and a way to count what
is still queued, read back from the server. Names are unique per test and removed after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from jobfence import App
from jobfence.transports.nats import NatsTransport
from jobfence.transports.rabbitmq import RabbitMQTransport, exhausted_name

RABBITMQ_URL = os.environ.get("JOBFENCE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("JOBFENCE_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("JOBFENCE_TEST_REDIS", "redis://127.0.0.1:6379/0")
#: the Pub/Sub emulator the tests use (scripts/services starts it on this address)
PUBSUB_HOST = os.environ.get("PUBSUB_EMULATOR_HOST") or "127.0.0.1:8085"
KINDS = ["postgresql", "sqlite", "rabbitmq", "nats", "redis", "pubsub"]
BROKERS = ["rabbitmq", "nats", "redis", "pubsub"]
REPO = Path(__file__).resolve().parents[2]
#: every RabbitMQ queue this test process creates contains this, for the final sweep
SESSION = uuid.uuid4().hex[:6]


def with_option(url: str, name: str, value: object) -> str:
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


@dataclass
class Target:
    kind: str
    database_url: str
    transport_url: str | None
    queue: str
    token: str
    extra_urls: list[str] = field(default_factory=list)

    def app(self, *, lease: float = 5.0, transport_url: str | None = None) -> App:
        return App(
            self.database_url,
            transport=transport_url or self.transport_url,
            lease=timedelta(seconds=lease),
            auto_migrate=True,
        )

    def env(self, marks: Path, *, lease: float = 2.0) -> dict[str, str]:
        return {
            "JF_DB": self.database_url,
            "JF_TRANSPORT": self.transport_url or "",
            "JF_QUEUE": self.queue,
            "JF_LEASE": str(lease),
            "JF_MARKS": str(marks),
        }


def broker_url(kind: str, token: str, base: str | None = None) -> str:
    """A broker URL whose names (streams, keys) are private to one test."""
    if kind == "rabbitmq":
        return base or RABBITMQ_URL
    if kind == "nats":
        return with_option(base or NATS_URL, "prefix", f"jf_{token}")
    if kind == "pubsub":
        # a project of its own per test: the emulator keeps projects apart
        return f"pubsub://jf-{token}?emulator={base or PUBSUB_HOST}"
    return with_option(base or REDIS_URL, "prefix", f"jf:{token}")


def create_effects_table(database_url: str) -> None:
    ddl = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid TEXT)"
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(ddl)
        return
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(ddl)


def make_target(kind: str, request: Any) -> Target:
    """A fresh target of ``kind`` (``request`` is pytest's, for the database fixtures)."""
    queue, token = new_queue()
    if kind == "sqlite":
        database = str(request.getfixturevalue("sqlite_database"))
        transport = None
    else:
        database = str(request.getfixturevalue("pg_database"))
        transport = None if kind == "postgresql" else broker_url(kind, token)
    create_effects_table(database)
    return Target(kind, database, transport, queue, token)


# -- counting what is still queued, from the server -----------------------------------------


async def remaining(target: Target, url: str | None = None) -> int:
    """Jobs still in the queue (ready, in flight or delayed), as the server reports them."""
    url = url or target.transport_url
    if target.kind in ("postgresql", "sqlite"):
        from tests.helpers import scalar, table

        db = target.database_url
        return int(await scalar(db, f"SELECT count(*) FROM {table(db, 'jobs')}"))
    assert url is not None
    if target.kind == "rabbitmq":
        import aio_pika

        conn = await aio_pika.connect(url)
        try:
            total = 0
            channel = await conn.channel()
            for name in (target.queue, exhausted_name(target.queue)):
                queue = await channel.declare_queue(name, passive=True)
                total += int(queue.declaration_result.message_count or 0)
            return total
        finally:
            await conn.close()
    if target.kind == "nats":
        nats = NatsTransport.from_url(url, lease=timedelta(seconds=5), worker_id="probe")
        await nats.open()
        try:
            info = await nats.js.stream_info(nats.stream_name(target.queue))
            return int(info.state.messages)
        finally:
            await nats.close()
    if target.kind == "pubsub":
        return await pubsub_remaining(url, target.queue)
    from jobfence.transports.redis import RedisTransport

    red = RedisTransport.from_url(url, lease=timedelta(seconds=5), worker_id="probe")
    await red.open()
    try:
        key = red.stream_key(target.queue)
        groups = await red.redis.xinfo_groups(key)
        total = sum(int(g["pending"]) + int(g.get("lag") or 0) for g in groups)
        return total + int(await red.redis.zcard(red.delayed_key(target.queue)))
    finally:
        await red.close()


# -- cleanup ------------------------------------------------------------------------------


async def cleanup(target: Target) -> None:
    for url in [target.transport_url, *target.extra_urls]:
        if url is None:
            continue
        with contextlib.suppress(Exception):
            await _cleanup_one(target, url)


async def _cleanup_one(target: Target, url: str) -> None:
    if target.kind == "rabbitmq":
        import aio_pika

        conn = await aio_pika.connect(url)
        try:
            channel = await conn.channel()
            for name in (target.queue, exhausted_name(target.queue)):
                await channel.queue_delete(name)
        finally:
            await conn.close()
    elif target.kind == "nats":
        nats = NatsTransport.from_url(url, lease=timedelta(seconds=5), worker_id="cleanup")
        await nats.open()
        try:
            for name in await nats.js.streams_info():
                if name.config.name and name.config.name.startswith(nats.prefix + "_"):
                    await nats.js.delete_stream(name.config.name)
        finally:
            await nats.close()
    elif target.kind == "pubsub":
        await pubsub_cleanup(url)
    elif target.kind == "redis":
        from jobfence.transports.redis import RedisTransport

        red = RedisTransport.from_url(url, lease=timedelta(seconds=5), worker_id="cleanup")
        await red.open()
        try:
            keys = [k async for k in red.redis.scan_iter(match=f"{red.prefix}:*")]
            if keys:
                await red.redis.delete(*keys)
        finally:
            await red.close()


async def pubsub_remaining(url: str, queue: str) -> int:
    """Messages of ``queue`` that a pull can get now: ready, delayed, or dead-lettered by
    Pub/Sub and not yet a jobfence dead letter (jobfence's own DLQ copies do not count).

    The emulator reports no backlog, so the probe pulls: a job message is put back as a
    new copy with the same attributes (pulling and nacking would count a delivery attempt),
    a delayed or dead-lettered one is nacked. Messages a worker holds are not visible.
    """
    from jobfence.transports.pubsub import DEAD_LETTER, PubSubTransport

    ps = PubSubTransport.from_url(url, lease=timedelta(seconds=30), worker_id="probe")
    await ps.open()
    try:
        names = ps.names(queue)
        total = 0
        for name in (names.subscription, names.delay_subscription, names.dlq_subscription):
            path = ps.subscription_path(name)
            held: list[Any] = []  # leased to the probe until it answers, so not pulled twice
            while True:
                try:
                    received = await ps._pull(name, 1000, 0.5)
                except Exception:  # not declared (yet): nothing queued there
                    break
                if not received:
                    break
                held += received
            own = [r for r in held if r.message.attributes.get(DEAD_LETTER)]
            others = [r for r in held if not r.message.attributes.get(DEAD_LETTER)]
            total += len(others)
            if own:
                await ps._ack_ids(path, [r.ack_id for r in own])
            if name == names.subscription and others:
                copies = [
                    type(r.message)(data=r.message.data, attributes=dict(r.message.attributes))
                    for r in others
                ]
                await ps._publish(names.topic, copies)
                await ps._ack_ids(path, [r.ack_id for r in others])
            elif others:
                await ps._modify(path, [r.ack_id for r in others], 0)
        return total
    finally:
        await ps.close()


async def pubsub_cleanup(url: str) -> None:
    """Delete every subscription and topic of the test's own project."""
    from jobfence.transports.pubsub import PubSubTransport

    ps = PubSubTransport.from_url(url, lease=timedelta(seconds=30), worker_id="cleanup")
    await ps.open()
    try:
        project = f"projects/{ps.project}"
        async for sub in await ps.subscriber.list_subscriptions(project=project):
            with contextlib.suppress(Exception):
                await ps.subscriber.delete_subscription(subscription=sub.name)
        async for topic in await ps.publisher.list_topics(project=project):
            with contextlib.suppress(Exception):
                await ps.publisher.delete_topic(topic=topic.name)
    finally:
        await ps.close()


def sweep_rabbitmq_session() -> None:
    """Delete this session's leftover RabbitMQ queues (delay buckets have varied names)."""
    try:
        out = subprocess.run(
            ["rabbitmqctl", "list_queues", "name", "--quiet", "--no-table-headers"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    names = [line.strip() for line in out.splitlines() if f"ct{SESSION}" in line]
    if not names:
        return

    async def go() -> None:
        import aio_pika

        conn = await aio_pika.connect(RABBITMQ_URL)
        try:
            channel = await conn.channel()
            for name in names:
                await channel.queue_delete(name)
        finally:
            await conn.close()

    with contextlib.suppress(Exception):
        asyncio.run(go())


def new_queue() -> tuple[str, str]:
    token = uuid.uuid4().hex[:8]
    return f"ct{SESSION}.{token}", token


# -- worker subprocesses --------------------------------------------------------------------


#: each started worker's log, by pid (stop_worker shows it when a worker does not stop)
_LOGS: dict[int, Path] = {}


def start_worker(env: dict[str, str], log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``jobfence worker tests.contract.apps:app`` as a real, killable process."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    log = open(log_path, "ab")  # noqa: SIM115 (the process keeps it)
    try:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "jobfence.cli", "worker", "tests.contract.apps:app",
                "--log-level", "INFO", *args,
            ],
            cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    finally:
        log.close()
    _LOGS[proc.pid] = log_path
    return proc


async def wait_started(log_path: Path, timeout: float = 180.0) -> None:
    """Until the worker logged that it runs (connected to its queue and database)."""
    from tests.helpers import eventually

    def started() -> bool:
        return log_path.exists() and "worker started" in log_path.read_text(errors="replace")

    await eventually(started, timeout=timeout, interval=0.05, what=f"{log_path.name} started")


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM and the exit code. A worker still running after ``timeout`` is asked where it
    waits (SIGUSR1: its tasks; then SIGABRT: its threads, by faulthandler) before it is
    killed, and the end of its log goes to stderr, so the failure says what it hung on."""
    (code,) = stop_workers([proc], timeout)
    return code


def stop_workers(procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> list[int]:
    """:func:`stop_worker` for several workers at once: SIGTERM to each, then wait for each
    (they stop side by side, not one after another); the exit codes, in order."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGUSR1, signal.SIGABRT):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=3)
            proc.kill()
            proc.wait(timeout=10)
            log_path = _LOGS.get(proc.pid)
            if log_path is not None and log_path.exists():
                tail = log_path.read_text(errors="replace")[-20000:]
                print(f"worker {proc.pid} did not stop within {timeout:g}s; its log ends:\n{tail}",
                      file=sys.stderr)  # fmt: skip
    return [int(proc.returncode) for proc in procs]


def kill_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {path.name}")
        time.sleep(0.02)


async def effects(database_url: str) -> list[tuple[str, int]]:
    from tests.helpers import query

    rows = await query(database_url, "SELECT job_id, attempt FROM effects ORDER BY job_id")
    return [(str(r[0]), int(r[1])) for r in rows]


def json_payload(**values: Any) -> bytes:
    return json.dumps(values).encode()


__all__ = ["BROKERS", "KINDS", "RabbitMQTransport", "Target"]
