"""The transactional outbox (SPEC O1–O3) against real PostgreSQL (and SQLite where it applies).

Writing in the caller's transaction, publishing with the event id as job_id, a relay killed
with SIGKILL between publish and mark, a transport that is down (5 attempts →
PUBLISH_FAILED_RETRY → alert → re-drive), several relays at once, same-key ordering, NOTIFY
wake-ups and retention cleanup.
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
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobfence import App, EnqueueError, Job, RetryPolicy, Tx, outbox
from jobfence.outbox.relay import Relay
from jobfence.runtime.harness import Outcome

from ..conftest import create_pg_database, drop_pg_database, pg_url
from ..helpers import RunningWorker, credit, eventually, query, scalar, table, wait_until

FAST_PUBLISH = RetryPolicy(
    max_retries=4,
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.2),
    justification="tests: 5 publish attempts within about a second",
)


def outbox_table(url: str) -> str:
    return table(url, "outbox")


async def test_rolled_back_transaction_publishes_nothing(ledger: str) -> None:
    """An event written in a transaction that rolls back never exists: only the committed
    event reaches the queue, and the consumer sees only it."""
    app = App(ledger, auto_migrate=True)
    seen: list[str] = []

    @app.consumer("points.credit")
    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append(job.job_id)
        await credit(tx, job.job_id, job.payload["member"], job.payload["points"])

    async with app:
        with pytest.raises(RuntimeError, match="domain rule broken"):  # noqa: PT012 - the rollback is what is tested
            async with app.db.transaction() as tx:
                await credit(tx, "rolled-back", "m-1", 500)
                await outbox.write(
                    tx,
                    "points.credit",
                    {"member": "m-1", "points": 500},
                    event_id="evt-rolled-back",
                )
                raise RuntimeError("domain rule broken")
        async with app.db.transaction() as tx:
            await outbox.write(
                tx, "points.credit", {"member": "m-2", "points": 7}, event_id="evt-committed"
            )
        relay = Relay(app, poll_interval=0.05)
        relay.start()
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled == 1, what="the committed event consumed")
            await eventually(lambda: relay.stats.rounds >= 3, what="relay rounds after it")
        await relay.stop()
        counts = await outbox.counts(app.db)
    assert seen == ["evt-committed"]
    assert await query(ledger, "SELECT job_id, member_id, points FROM ledger") == [
        ("evt-committed", "m-2", 7)
    ]
    assert counts == {"PENDING": 0, "PUBLISHED": 1, "PUBLISH_FAILED_RETRY": 0}
    assert relay.stats.published == 1


async def test_event_id_is_the_job_id_the_consumer_fences_on(pg_database: str) -> None:
    """The consumer receives the event id as job_id, carries the correlation id, and fences
    on it; publishing the same event again is a skipped duplicate (SPEC O3)."""
    app = App(pg_database)
    jobs: list[tuple[str, str | None]] = []

    @app.consumer("orders.created")
    async def handle(job: Job[Any], tx: Tx) -> None:
        jobs.append((job.job_id, job.correlation_id))

    async with app:
        async with app.db.transaction() as tx:
            event_id = await outbox.write(
                tx, "orders.created", {"order": 1}, event_id="evt-1", correlation_id="req-9"
            )
        relay = Relay(app)
        assert await relay.run_once() == 1
        # a relay bug that publishes the same event again (seed 004 E3)
        event = await outbox.get_event(app.db, "evt-1")
        assert event is not None
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="the relayed delivery")
            await app.transport.publish([app.job("orders.created", {"order": 1}, job_id="evt-1")])
            await eventually(lambda: w.stats.handled == 2, what="the second delivery")
        fenced = await scalar(
            pg_database, "SELECT count(*) FROM core.processed_jobs WHERE job_id = 'evt-1'"
        )
    assert event_id == "evt-1"
    assert jobs == [("evt-1", "req-9")]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert w.stats.outcomes[Outcome.DUPLICATE] == 1
    assert fenced == 1
    assert event.state == "PUBLISHED"
    assert event.attempts == 1


async def test_write_takes_psycopg_and_sync_connections(pg_database: str) -> None:
    """write() joins a psycopg AsyncConnection's transaction, write_sync() a sync psycopg
    Connection's; a duplicate event id raises EnqueueError without aborting the transaction."""
    async with await psycopg.AsyncConnection.connect(pg_database) as conn, conn.transaction():
        await outbox.write(conn, "q", {"n": 1}, event_id="async-1", key="k")
        with pytest.raises(EnqueueError, match="already in the outbox"):
            await outbox.write(conn, "q", {"n": 1}, event_id="async-1")
        await conn.execute("SELECT 1")  # the transaction is still usable
    with psycopg.connect(pg_database) as sync_conn:
        outbox.write_sync(sync_conn, "q", {"n": 2}, event_id="sync-1", key="k")
        sync_conn.rollback()
        outbox.write_sync(sync_conn, "q", b"raw bytes", event_id="sync-2")
    rows = await query(
        pg_database, "SELECT event_id, ordering_key, payload FROM core.outbox ORDER BY id"
    )
    assert rows == [("async-1", "k", b'{"n":1}'), ("sync-2", None, b"raw bytes")]


async def test_write_sync_on_sqlite3_and_bad_events(sqlite_database: str) -> None:
    """write_sync() works on a plain sqlite3 connection; bad queues, ids and keys are refused
    with one clear line."""
    path = sqlite_database.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        outbox.write_sync(conn, "q", {"a": 1}, event_id="e-1", key="k-1")
    assert await query(sqlite_database, "SELECT event_id, state FROM core_outbox") == [
        ("e-1", "PENDING")
    ]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        with pytest.raises(EnqueueError, match="queue must be a non-empty string"):
            outbox.write_sync(conn, "", {"a": 1})
        with pytest.raises(EnqueueError, match="job_id is 256 characters"):
            outbox.write_sync(conn, "q", {"a": 1}, event_id="x" * 256)
        with pytest.raises(EnqueueError, match="ordering key is longer than 255"):
            outbox.write_sync(conn, "q", {"a": 1}, key="k" * 256)
        with pytest.raises(EnqueueError, match="cannot write an outbox event on a str"):
            outbox.write_sync("not a connection", "q", {"a": 1})


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args)


RELAY_SCRIPT = textwrap.dedent(
    """
    import asyncio, pathlib, sys
    from datetime import timedelta
    from jobfence import App
    from jobfence.outbox.relay import Relay, RelayObserver

    class HoldAfterPublish(RelayObserver):
        async def published(self, events):
            pathlib.Path(sys.argv[2]).write_text(",".join(e.event_id for e in events))
            await asyncio.Event().wait()  # published, not yet marked: kill me here

    async def main():
        app = App(sys.argv[1])
        relay = Relay(
            app,
            lease=timedelta(seconds=2),
            publish_timeout=timedelta(seconds=1),
            observers=[HoldAfterPublish()],
            one_transaction=sys.argv[3] == "1",
        )
        await relay.run()

    asyncio.run(main())
    """
)


async def test_relay_killed_after_publish_before_mark_is_absorbed_by_the_fence(
    pg_database: str, tmp_path: Path
) -> None:
    """A relay SIGKILLed after the transport accepted an event and before marking it: the
    claim expires, another relay publishes it again, and the consumer's fence makes one
    effect of the two deliveries."""
    await query(
        pg_database,
        "CREATE TABLE ledger (job_id TEXT NOT NULL, member_id TEXT NOT NULL, points INTEGER)",
    )
    app = App(pg_database)

    @app.consumer("points.credit")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, job.payload["member"], job.payload["points"])

    script = tmp_path / "relay.py"
    script.write_text(RELAY_SCRIPT)
    marker = tmp_path / "published"
    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(
                tx, "points.credit", {"member": "m-7", "points": 70}, event_id="evt-kill"
            )
        proc = _spawn([sys.executable, str(script), pg_database, str(marker), "0"])
        try:
            await eventually(marker.exists, timeout=30, what="the relay to publish")
            assert marker.read_text() == "evt-kill"
            os.kill(proc.pid, signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        published_once = await query(pg_database, "SELECT job_id FROM core.jobs")
        state = await query(
            pg_database, "SELECT state, attempts FROM core.outbox WHERE event_id = 'evt-kill'"
        )
        second = Relay(app, poll_interval=0.1)
        second.start()
        await eventually(
            lambda: second.stats.published == 1,
            timeout=30,
            what="the event published again after the claim expired",
        )
        await second.stop()
        published_twice = await query(pg_database, "SELECT job_id FROM core.jobs")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled == 2, what="both deliveries handled")
        event = await outbox.get_event(app.db, "evt-kill")
    assert published_once == [("evt-kill",)]
    assert state == [("PENDING", 1)]
    assert published_twice == [("evt-kill",), ("evt-kill",)]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert w.stats.outcomes[Outcome.DUPLICATE] == 1
    assert await query(pg_database, "SELECT job_id, points FROM ledger") == [("evt-kill", 70)]
    assert event is not None
    assert (event.state, event.attempts) == ("PUBLISHED", 2)


async def test_relay_in_one_transaction_killed_after_its_commit_queued_the_event_once(
    pg_database: str, tmp_path: Path
) -> None:
    """On the database queue of the same database a round claims, queues and marks in one
    transaction: a relay SIGKILLed after it (in its observer) leaves the event queued once
    and PUBLISHED, and another relay has nothing to publish again."""
    app = App(pg_database)
    script = tmp_path / "relay.py"
    script.write_text(RELAY_SCRIPT)
    marker = tmp_path / "published"
    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {"n": 1}, event_id="evt-once")
        proc = _spawn([sys.executable, str(script), pg_database, str(marker), "1"])
        try:
            await eventually(marker.exists, timeout=30, what="the relay to publish")
            os.kill(proc.pid, signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        second = Relay(app, poll_interval=0.1)
        assert second.direct
        second.start()
        await eventually(lambda: second.stats.rounds >= 2, what="the second relay's rounds")
        await second.stop()
        event = await outbox.get_event(app.db, "evt-once")
    assert second.stats.published == 0
    assert await query(pg_database, "SELECT job_id FROM core.jobs") == [("evt-once",)]
    assert event is not None
    assert (event.state, event.attempts) == ("PUBLISHED", 1)


def _admin(sql: str) -> None:
    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def _transport_down(name: str) -> None:
    _admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    _admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )


def _transport_up(name: str) -> None:
    _admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')


@pytest.fixture
def transport_database(pg_template: str) -> Any:
    """A second migrated database used as the queue (a transport that can go down)."""
    name = create_pg_database(pg_template)
    try:
        yield name
    finally:
        _transport_up(name)
        drop_pg_database(name)


async def test_transport_down_five_attempts_then_failed_retry_then_redrive_delivers_once(
    pg_database: str, transport_database: str
) -> None:
    """With the queue unreachable an event is tried 5 times with growing delays, becomes
    PUBLISH_FAILED_RETRY and queues an alert; a later event of the same key waits behind it
    while an unkeyed one goes out; once the queue is back an operator re-drives it (CLI) and
    it is delivered once, before the event queued behind it."""
    transport_url = pg_url(transport_database)
    app = App(pg_database, transport=transport_url)
    consumed: list[str] = []

    @app.consumer("erp.send")
    async def handle(job: Job[Any], tx: Tx) -> None:
        consumed.append(job.job_id)

    async with app:
        relay = Relay(
            app,
            poll_interval=0.05,
            policy=FAST_PUBLISH,
            publish_timeout=timedelta(seconds=0.5),
            lease=timedelta(seconds=5),
        )
        _transport_down(transport_database)
        async with app.db.transaction() as tx:
            await outbox.write(tx, "erp.send", {"po": 1}, event_id="evt-head", key="po-1")
        relay.start()
        failed = await eventually(
            lambda: outbox.list_events(app.db, state="PUBLISH_FAILED_RETRY"),
            timeout=60,
            what="PUBLISH_FAILED_RETRY",
        )
        head = await outbox.get_event(app.db, "evt-head")
        alerts = await query(
            pg_database,
            "SELECT source, queue, category, title, details->>'event_id' FROM core.alert_events",
        )
        _transport_up(transport_database)
        async with app.db.transaction() as tx:
            await outbox.write(tx, "erp.send", {"po": 1, "v": 2}, event_id="evt-next", key="po-1")
            await outbox.write(tx, "erp.send", {"po": 2}, event_id="evt-other")
        await eventually(
            lambda: relay.stats.published == 1,
            timeout=60,
            what="the unkeyed event published once the queue is back",
        )
        waiting = await outbox.get_event(app.db, "evt-next")
        cli = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "jobfence.cli",
                "outbox",
                "redrive",
                "evt-head",
                "--database-url",
                pg_database,
                "--reason",
                "queue back after outage",
                "--actor",
                "ops-alice",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        await eventually(lambda: relay.stats.published == 3, timeout=30, what="re-driven events")
        await relay.stop()
        order = await query(transport_url, "SELECT job_id FROM core.jobs ORDER BY id")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 3, what="three deliveries")
        redriven = await outbox.get_event(app.db, "evt-head")
    assert [e.event_id for e in failed] == ["evt-head"]
    assert head is not None
    assert head.attempts == 5
    assert [h["attempt"] for h in head.history] == [1, 2, 3, 4, 5]
    assert {h["category"] for h in head.history} == {"TEMPORARY_ERROR"}
    assert alerts == [
        (
            "outbox",
            "erp.send",
            "TEMPORARY_ERROR",
            "outbox event could not be published to 'erp.send' after 5 attempts "
            "(PUBLISH_FAILED_RETRY)",
            "evt-head",
        )
    ]
    assert relay.stats.gave_up == 1
    assert waiting is not None
    assert (waiting.state, waiting.attempts) == ("PENDING", 0)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines()[0] == "evt-head"
    assert order == [("evt-other",), ("evt-head",), ("evt-next",)]
    assert sorted(consumed) == ["evt-head", "evt-next", "evt-other"]
    assert w.stats.outcomes[Outcome.PROCESSED] == 3
    assert redriven is not None
    assert (redriven.state, redriven.attempts) == ("PUBLISHED", 1)
    assert redriven.history[-1]["action"] == "redrive"
    assert redriven.history[-1]["by"] == "ops-alice"
    assert redriven.history[-1]["reason"] == "queue back after outage"


async def test_several_relays_publish_each_event_once_and_each_key_in_order(
    pg_database: str,
) -> None:
    """Four relays share 400 events (300 over 10 ordering keys, 100 unkeyed): every event is
    published exactly once and each key's events reach the queue in the order written."""
    app = App(pg_database)
    async with app:
        async with app.db.transaction() as tx:
            for n in range(300):
                key = f"key-{n % 10}"
                await outbox.write(tx, "q", {"key": key, "seq": n // 10}, key=key)
            for n in range(100):
                await outbox.write(tx, "q", {"free": n})
        relays = [Relay(app, batch_size=7, poll_interval=0.05) for _ in range(4)]
        for relay in relays:
            relay.start()
        await eventually(
            lambda: sum(r.stats.published for r in relays) == 400, timeout=60, what="400 events"
        )
        for relay in relays:
            await relay.stop()
        rows = await query(pg_database, "SELECT job_id, payload FROM core.jobs ORDER BY id")
        counts = await outbox.counts(app.db)
    ids = [job_id for job_id, _ in rows]
    assert len(ids) == 400
    assert len(set(ids)) == 400
    sequences: dict[str, list[int]] = {}
    for _, payload in rows:
        data = json.loads(payload)
        if "key" in data:
            sequences.setdefault(data["key"], []).append(data["seq"])
    assert sequences == {f"key-{k}": list(range(30)) for k in range(10)}
    assert all(r.stats.published > 0 for r in relays)
    assert counts == {"PENDING": 0, "PUBLISHED": 400, "PUBLISH_FAILED_RETRY": 0}


async def test_relay_wakes_on_notify_not_on_its_poll(pg_database: str) -> None:
    """With a 60 s polling fallback, an idle PostgreSQL relay still publishes a new event
    within seconds: the insert's NOTIFY wakes it."""
    app = App(pg_database)
    async with app:
        relay = Relay(app, poll_interval=60)
        relay.start()
        await eventually(lambda: relay.stats.rounds >= 1, what="a first idle round")
        await asyncio.sleep(0)  # let it go idle
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {"n": 1}, event_id="evt-notify")
        await eventually(lambda: relay.stats.published == 1, timeout=10, what="NOTIFY wake-up")
        await relay.stop()
    assert relay.stats.published == 1


async def test_relay_publishes_on_sqlite_by_polling(sqlite_database: str) -> None:
    """On SQLite (no NOTIFY) the relay polls: an event reaches the database queue and the
    consumer, and is PUBLISHED."""
    app = App(sqlite_database)
    seen: list[str] = []

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append(job.job_id)

    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {"n": 1}, event_id="evt-lite", key="k")
            await outbox.write(tx, "q", {"n": 2}, event_id="evt-lite-2", key="k")
        relay = Relay(app, poll_interval=0.05)
        relay.start()
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="both events consumed")
        await relay.stop()
        counts = await outbox.counts(app.db)
    assert sorted(seen) == ["evt-lite", "evt-lite-2"]
    assert counts == {"PENDING": 0, "PUBLISHED": 2, "PUBLISH_FAILED_RETRY": 0}


async def test_cleanup_deletes_only_published_events_past_the_retention(
    database_url: str,
) -> None:
    """Cleanup removes published events older than the retention (in bounded batches) and
    keeps recent, pending and failed ones."""
    app = App(database_url, auto_migrate=True)
    async with app:
        async with app.db.transaction() as tx:
            for n in range(5):
                await outbox.write(tx, "q", {"n": n}, event_id=f"old-{n}")
            await outbox.write(tx, "q", {}, event_id="recent")
        relay = Relay(app)
        await relay.run_once()
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="pending")
        eight_days = 8 * 86400
        if app.url.dialect == "postgresql":
            shift = (
                "UPDATE core.outbox SET published_at = published_at - interval '8 days', "
                "created_at = created_at - interval '8 days' WHERE substr(event_id, 1, 4) = 'old-'"
            )
        else:
            shift = (
                f"UPDATE core_outbox SET published_at = published_at - {eight_days}, "
                f"created_at = created_at - {eight_days} WHERE substr(event_id, 1, 4) = 'old-'"
            )
        await query(database_url, shift)
        deleted = await outbox.cleanup(app.db, timedelta(days=7), batch=2)
        left = await query(
            database_url, f"SELECT event_id, state FROM {outbox_table(database_url)} ORDER BY id"
        )
    assert deleted == 5
    assert left == [("recent", "PUBLISHED"), ("pending", "PENDING")]


async def test_redrive_needs_failed_events_and_is_harmless_twice(pg_database: str) -> None:
    """Re-driving touches only PUBLISH_FAILED_RETRY events; a second re-drive, or one of an
    unknown or pending event, re-drives nothing."""
    app = App(pg_database)
    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="evt-failed")
            await outbox.write(tx, "q", {}, event_id="evt-pending")
        await query(
            pg_database,
            "UPDATE core.outbox SET state = 'PUBLISH_FAILED_RETRY', attempts = 5 "
            "WHERE event_id = 'evt-failed'",
        )
        first = await outbox.redrive(
            app.db, actor="bob", reason="broker back", all_failed=True, queue="q", expected_total=1
        )
        again = await outbox.redrive(
            app.db, actor="bob", reason="again", event_ids=["evt-failed", "evt-pending", "nope"]
        )
        event = await outbox.get_event(app.db, "evt-failed")
    assert first == ["evt-failed"]
    assert again == []
    assert event is not None
    assert (event.state, event.attempts) == ("PENDING", 0)


def test_cli_lists_outbox_events_as_json_and_refuses_bad_redrive(pg_database: str) -> None:
    """`jobfence outbox list --json` prints one JSON line per event; `outbox redrive` without
    ids or --all is a usage error (exit 2) in one line."""

    async def seed() -> None:
        async with App(pg_database) as app, app.db.transaction() as tx:
            await outbox.write(tx, "q", {"x": 1}, event_id="evt-cli", key="k-cli")

    asyncio.run(seed())
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobfence.cli",
            "outbox",
            "list",
            "--json",
            "--database-url",
            pg_database,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobfence.cli",
            "outbox",
            "redrive",
            "--reason",
            "x",
            "--database-url",
            pg_database,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    event = json.loads(listed.stdout.splitlines()[0])
    assert (event["event_id"], event["ordering_key"], event["state"]) == (
        "evt-cli",
        "k-cli",
        "PENDING",
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "jobfence: error: name the events to re-drive, or pass --all (not both) "
        "(see: jobfence outbox redrive --help)"
    ]


def test_relay_command_runs_until_sigterm(pg_database: str) -> None:
    """`jobfence relay --database-url …` publishes pending events and exits 0 on SIGTERM."""

    async def seed() -> None:
        async with App(pg_database) as app, app.db.transaction() as tx:
            await outbox.write(tx, "q", {"x": 1}, event_id="evt-relay-cli")

    asyncio.run(seed())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobfence.cli",
            "relay",
            "--database-url",
            pg_database,
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def published() -> bool:
            rows = asyncio.run(query(pg_database, "SELECT state FROM core.outbox"))
            return rows == [("PUBLISHED",)]

        wait_until(published, timeout=30, what="the CLI relay to publish")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert asyncio.run(query(pg_database, "SELECT job_id FROM core.jobs")) == [("evt-relay-cli",)]


def test_relay_embedded_in_a_worker_publishes_and_consumes(pg_database: str) -> None:
    """`jobfence relay APP --with-worker` runs the relay and APP's worker in one process: an
    event written in a transaction is published and consumed (one ledger row), and SIGTERM
    stops both (exit 0)."""

    async def seed() -> None:
        await query(
            pg_database,
            "CREATE TABLE ledger (job_id TEXT NOT NULL, member_id TEXT NOT NULL, points INTEGER)",
        )
        async with App(pg_database) as app, app.db.transaction() as tx:
            await outbox.write(
                tx, "ledger.credit", {"member": "m-1", "points": 5}, event_id="evt-embedded"
            )

    asyncio.run(seed())
    proc = _spawn_cli(
        [
            "relay",
            "tests.outbox.relay_app:app",
            "--with-worker",
            "--database-url",
            pg_database,
            "--log-level",
            "WARNING",
        ]
    )
    try:

        def credited() -> list[tuple[Any, ...]]:
            return asyncio.run(query(pg_database, "SELECT job_id, points FROM ledger"))

        rows = wait_until(credited, timeout=60, what="the event consumed in the same process")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert rows == [("evt-embedded", 5)]


def _spawn_cli(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_idle_relay_sleeps_until_timed_work_and_never_spins_on_a_blocked_key(
    database_url: str,
) -> None:
    """An event waiting behind its key's failed head gives the relay nothing to wake for (it
    sleeps its whole polling interval); another relay's claim running out in 20 s, or a
    retry falling due in 30 s, bound the sleep (the earlier of the two)."""
    table_name = outbox_table(database_url)
    now = (
        "now()"
        if database_url.startswith("postgresql")
        else ("((julianday('now') - 2440587.5) * 86400.0)")
    )
    in_30s = f"{now} + interval '30 seconds'" if "now()" in now else f"{now} + 30"
    app = App(database_url, auto_migrate=True)
    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="head", key="k")
            await outbox.write(tx, "q", {}, event_id="behind", key="k")
        await query(
            database_url,
            f"UPDATE {table_name} SET state = 'PUBLISH_FAILED_RETRY', attempts = 5 "
            "WHERE event_id = 'head'",
        )
        relay = Relay(app, poll_interval=60)
        assert await relay.run_once() == 0
        blocked = await relay.idle_wait()
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="retry-soon")
        await query(
            database_url,
            f"UPDATE {table_name} SET next_attempt_at = {in_30s}, attempts = 1 "
            "WHERE event_id = 'retry-soon'",
        )
        retry_only = await relay.idle_wait()
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="claimed-elsewhere")
        held = await app.db.run(
            "outbox_claim", {"limit": 10, "lease": 20.0, "relay_id": "another relay"}
        )
        both = await relay.idle_wait()
    assert blocked == 60
    assert 29 < retry_only <= 30
    assert [row["event_id"] for row in held] == ["claimed-elsewhere"]
    assert 19 < both <= 20
