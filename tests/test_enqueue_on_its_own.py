"""An app that is not open enqueues on its own and lets the process exit (issue 23); so does a
worker or a relay that opened the app itself.

The README's "enqueue from code — on its own" (`await app.enqueue(...)` without
`async with app:`) connects for that one call and closes what it opened before returning: on
SQLite it used to leave aiosqlite's (non-daemon) connection thread behind, and the script
never exited. Each test runs the snippet as a real process and bounds the wait on it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

from jobfence import App, Job, Relay, Tx, outbox
from tests.helpers import eventually, query

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import jobfence

    app = jobfence.App(sys.argv[1])


    async def main() -> None:
        await app.enqueue("points.credit", {"member_id": "m-1", "points": 40}, job_id="order-42")
        await app.enqueue("points.credit", {"member_id": "m-2", "points": 7}, job_id="order-43")
        print("enqueued", app.is_open)


    asyncio.run(main())
    asyncio.run(main())  # a second event loop: nothing of the first one's call is reused
    """
)


def jobs_table(url: str) -> str:
    return "core_jobs" if url.startswith("sqlite") else "core.jobs"


def run_script(url: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, url], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the enqueue script did not exit within 30 s: {exc.stdout!r} {exc.stderr!r}"
        ) from None


async def test_a_script_that_enqueues_exits(database_url: str) -> None:
    done = run_script(database_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["enqueued False", "enqueued False"]
    rows = await query(
        database_url, f"SELECT job_id FROM {jobs_table(database_url)} ORDER BY job_id"
    )
    assert [r[0] for r in rows] == ["order-42", "order-42", "order-43", "order-43"]


async def test_an_open_app_keeps_its_connection_and_a_closed_one_opens_per_call(
    database_url: str,
) -> None:
    app = App(database_url)
    await app.enqueue("q", {"n": 1}, job_id="one")
    assert not app.is_open  # the call closed what it opened
    async with app:
        db = app.db
        await app.enqueue("q", {"n": 2}, job_id="two")
        assert app.db is db  # an open app enqueues on its own pool
    rows = await query(
        database_url, f"SELECT job_id FROM {jobs_table(database_url)} ORDER BY job_id"
    )
    assert [r[0] for r in rows] == ["one", "two"]


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import jobfence

    app = jobfence.App(sys.argv[1])


    @app.consumer("q")
    async def handle(job, tx):
        pass


    async def main() -> None:
        worker = app.worker(poll_interval=0.05)
        running = asyncio.create_task(worker.run())
        await app.enqueue("q", {}, job_id="w-1")
        while not worker.stats.handled:
            await asyncio.sleep(0.02)
        worker.request_stop()
        await running
        print("handled", worker.stats.handled, app.is_open)


    asyncio.run(main())
    """
)


def test_a_script_that_runs_a_worker_on_its_own_exits(sqlite_database: str) -> None:
    """A worker on an app nobody opened opens it and closes it when it stops (SQLite: the
    connection thread would keep the process alive)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", WORKER_SCRIPT, sqlite_database],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the worker script did not exit within 30 s: {exc.stderr!r}"
        ) from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "handled 1 False"


async def test_a_worker_and_a_relay_on_their_own_share_the_app_until_both_stop(
    sqlite_database: str,
) -> None:
    """`jobfence relay --with-worker`'s shape: the first to stop does not close the app under
    the other; the last one does. An app its owner opened stays open.

    SQLite only: the holding does not depend on the store, and on PostgreSQL a worker stopped
    within a second of its start can hang on a background task whose cancellation was lost
    in a pool call (Python 3.11's `asyncio.wait_for`, which psycopg_pool uses) — reported
    separately, it happens without this change too."""
    app = App(sqlite_database)

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        return None

    relay = Relay(app, poll_interval=0.05)
    worker = app.worker(poll_interval=0.05)
    relaying = relay.start()
    working = asyncio.create_task(worker.run())
    await eventually(lambda: app.is_open and worker.health.started, what="both started")
    worker.request_stop()
    await working
    assert app.is_open  # the relay still runs on it
    async with app.db.transaction() as tx:
        await outbox.write(tx, "q", {"n": 1}, event_id="e-1")
    await relay.stop()
    await relaying
    assert not app.is_open
    async with app:
        worker = app.worker(poll_interval=0.05)
        working = asyncio.create_task(worker.run())
        await eventually(lambda: worker.health.started, what="the worker started")
        worker.request_stop()
        await working
        assert app.is_open  # the owner's
