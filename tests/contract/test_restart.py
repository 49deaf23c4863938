"""The queue's server stopped and started mid-run (SPEC Q1, H3): no acknowledged job is
lost, and every job ends as exactly one effect or one dead letter.

Each server is a private instance on its own port and data directory (the shared servers
are never touched). Redis and NATS are crashed (SIGKILL), PostgreSQL is shut down
immediately (no checkpoint: crash recovery on start). RabbitMQ is stopped cleanly
(SIGTERM): after a SIGKILL of its only node, RabbitMQ 3.10 sometimes kept refusing
consumers of the recovered quorum queue for minutes (INTERNAL_ERROR on basic.consume),
which would test the server's recovery time rather than jobfence. What an OS crash or
power loss can take from each broker is in docs/transports.md.

The Pub/Sub emulator is different: it keeps topics, subscriptions and messages in memory, so
a restart loses every message it had acknowledged and not yet delivered and acked. Its test
states exactly that, and what the workers do about it (they carry on and create the topics
and subscriptions again); on the real service a message is stored before a publish returns.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from jobfence import App

from ..helpers import eventually, query
from .servers import (
    NatsServer,
    PostgresServer,
    PubSubEmulator,
    RabbitServer,
    RedisServer,
    Server,
)
from .support import (
    Target,
    broker_url,
    cleanup,
    create_effects_table,
    new_queue,
    remaining,
    start_worker,
    stop_workers,
    wait_started,
)

SERVERS: dict[str, type[Server]] = {
    "postgresql": PostgresServer,
    "rabbitmq": RabbitServer,
    "nats": NatsServer,
    "redis": RedisServer,
}


@pytest.fixture(params=sorted(SERVERS))
def restartable(request: pytest.FixtureRequest) -> Iterator[tuple[Target, Server]]:
    """A transport on a private server this test may stop and start."""
    kind = str(request.param)
    server = SERVERS[kind]()
    try:
        server.start()
        queue, token = new_queue()
        if kind == "postgresql":
            database = server.url
            asyncio.run(App(database).migrate())
            transport = None
        else:
            database = str(request.getfixturevalue("pg_database"))
            transport = broker_url(kind, token, base=server.url)
        create_effects_table(database)
        target = Target(kind, database, transport, queue, token)
        yield target, server
        if transport is not None:
            asyncio.run(cleanup(target))
    finally:
        server.close()


async def publish(app: App, queue: str, job_id: str, timeout: float) -> bool:
    """True when the queue acknowledged the job within ``timeout``."""
    try:
        await asyncio.wait_for(
            app.enqueue(queue, {"mode": "sleep", "seconds": 0.02}, job_id=job_id), timeout
        )
    except Exception:
        return False
    return True


async def outcomes(database: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    done = collections.Counter(r[0] for r in await query(database, "SELECT job_id FROM effects"))
    dead = collections.Counter(
        r[0] for r in await query(database, "SELECT job_id FROM core.dead_letters")
    )
    return done, dead


async def test_restarting_the_server_mid_run_loses_no_acknowledged_job(
    restartable: tuple[Target, Server], tmp_path: Path
) -> None:
    """Two workers run; 40 jobs are published, the server goes down while they are being
    processed, publishes during the outage may fail, the server comes back, 40 more are
    published. Every acknowledged job ends as exactly one effect or one dead letter."""
    target, server = restartable
    env = target.env(tmp_path, lease=2.0)
    workers = [start_worker(env, tmp_path / f"w{i}.log", "--concurrency", "5") for i in range(2)]
    acknowledged: list[str] = []
    app = target.app(lease=2.0)
    try:
        for i in range(2):
            await wait_started(tmp_path / f"w{i}.log")
        for i in range(40):
            assert await publish(app, target.queue, f"a-{i:03d}", timeout=30)
            acknowledged.append(f"a-{i:03d}")
        await eventually(
            lambda: _count_done(target.database_url, 1), timeout=60, what="work under way"
        )
        if isinstance(server, RabbitServer):
            server.stop()
        else:
            server.kill()
        for i in range(5):
            if await publish(app, target.queue, f"b-{i:03d}", timeout=1):
                acknowledged.append(f"b-{i:03d}")
        server.start()
        for i in range(40):
            job_id = f"c-{i:03d}"
            await eventually(
                lambda job_id=job_id: publish(app, target.queue, job_id, timeout=5),  # type: ignore[misc]
                timeout=180,
                interval=0.2,
                what=f"publish {job_id} after the restart",
            )
            acknowledged.append(job_id)

        async def all_settled() -> bool:
            done, dead = await outcomes(target.database_url)
            return all(done[j] + dead[j] >= 1 for j in acknowledged)

        await eventually(all_settled, timeout=240, interval=0.2, what="every job settled")
    finally:
        with contextlib.suppress(Exception):
            await app.close()
        codes = stop_workers(workers)
    assert codes == [0, 0]
    done, dead = await outcomes(target.database_url)
    assert [j for j in acknowledged if done[j] + dead[j] != 1] == []
    assert [j for j, n in done.items() if n != 1] == []
    assert len(acknowledged) >= 80


async def _count_done(database: str, at_least: int) -> bool:
    done, _ = await outcomes(database)
    return sum(done.values()) >= at_least


async def test_a_pubsub_emulator_restart_loses_what_it_held_and_workers_carry_on(
    pg_database: str, tmp_path: Path
) -> None:
    """A private emulator, two workers on queue Q. Before the crash: 20 jobs of Q processed;
    20 jobs acknowledged on a queue nobody consumes (Q2) and 5 slow jobs of Q running. The
    emulator is crashed (SIGKILL) and started again, empty:

    * Q2's 20 acknowledged jobs are gone, with their subscription — the emulator keeps
      nothing (the real service would have stored them before the publish returned);
    * the 5 running jobs commit their work once; their acks fail, nothing comes back;
    * the workers keep running (errors logged while it is down), create Q's topics and
      subscriptions again (logged) before anyone else does, and process the 40 jobs published
      after the restart, each exactly once; exit 0.
    """
    emulator = PubSubEmulator()
    emulator.start()
    queue, token = new_queue()
    other, _ = new_queue()
    url = broker_url("pubsub", token, base=emulator.host)
    create_effects_table(pg_database)
    target = Target("pubsub", pg_database, url, queue, token)
    idle = Target("pubsub", pg_database, url, other, token)
    env = target.env(tmp_path, lease=2.0)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start_worker(env, log, "--concurrency", "5") for log in logs]
    app = target.app(lease=2.0)
    try:
        for log in logs:
            await wait_started(log)
        before = [f"a-{i:03d}" for i in range(20)]
        for job_id in before:
            assert await publish(app, queue, job_id, timeout=30)
        await eventually(lambda: _count_done(pg_database, 20), timeout=60, what="a-jobs done")
        for i in range(20):
            await app.enqueue(other, {"n": i}, job_id=f"q2-{i:03d}")
        assert await remaining(idle) == 20
        running = [f"c-{i:03d}" for i in range(5)]
        for job_id in running:
            await app.enqueue(queue, {"mode": "sleep", "seconds": 1.5}, job_id=job_id)
        marks = [tmp_path / f"{job_id}.started.1" for job_id in running]
        await eventually(lambda: all(m.exists() for m in marks), timeout=60, what="c running")
        emulator.kill()
        assert not await publish(app, queue, "during-outage", timeout=1)
        emulator.start()
        await app.close()
        assert await remaining(idle) == 0  # Q2 is gone, subscription and all
        await eventually(
            lambda: _declared_by_workers(url, queue), timeout=60, what="Q recreated by a worker"
        )
        after = [f"d-{i:03d}" for i in range(40)]
        for job_id in after:
            await eventually(
                lambda job_id=job_id: publish(app, queue, job_id, timeout=5),  # type: ignore[misc]
                timeout=120,
                interval=0.2,
                what=f"publish {job_id} after the restart",
            )

        async def all_after_done() -> bool:
            done, _ = await outcomes(pg_database)
            return all(done[j] >= 1 for j in after)

        await eventually(all_after_done, timeout=180, interval=0.2, what="d-jobs done")
    finally:
        with contextlib.suppress(Exception):
            await app.close()
        codes = stop_workers(workers)
        emulator.close()
    assert codes == [0, 0]
    done, dead = await outcomes(pg_database)
    assert {j: done[j] for j in before + running + after} == dict.fromkeys(
        before + running + after, 1
    )
    assert [j for j in done if j.startswith("q2-") or j == "during-outage"] == []
    assert sum(dead.values()) == 0
    text = "".join(log.read_text(errors="replace") for log in logs)
    assert "creating it again" in text


async def _declared_by_workers(url: str, queue: str) -> bool:
    """Q's topics and subscriptions exist (checked with create=0: this probe makes none)."""
    from jobfence.errors import ConfigurationError
    from jobfence.transports.pubsub import PubSubTransport

    probe = PubSubTransport.from_url(
        f"{url}&create=0", lease=timedelta(seconds=30), worker_id="probe"
    )
    await probe.open()
    try:
        await probe.declare(queue)
    except ConfigurationError:
        return False
    finally:
        await probe.close()
    return True
