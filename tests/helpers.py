"""Test helpers: polling with a deadline (never fixed sleeps), ledger queries, workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jobfence import App, Tx
from jobfence.config import parse_database_url
from jobfence.db import connect

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]] | Callable[[], T],
    *,
    timeout: float = 20.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        last = result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], *, timeout: float = 20.0, what: str = "condition") -> Any:
    """Synchronous twin of :func:`eventually` for subprocess tests."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={result!r}")
        time.sleep(0.02)


def ph(dialect: str) -> str:
    return "%s" if dialect == "postgresql" else "?"


async def query(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Run one query on its own connection (outside any app)."""
    db = connect(parse_database_url(url))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            return await tx.fetchall(sql.replace("{p}", ph(db.dialect)), params)
    finally:
        await db.close()


async def scalar(url: str, sql: str, params: Any = ()) -> Any:
    rows = await query(url, sql, params)
    return rows[0][0]


def table(url: str, name: str) -> str:
    """A jobfence table's name in a dialect: core.x on PostgreSQL, core_x on SQLite."""
    return f"core.{name}" if url.startswith("postgresql") else f"core_{name}"


async def credit(tx: Tx, job_id: str, member: str, points: int) -> None:
    p = ph(tx.dialect)
    await tx.execute(
        f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})",
        (job_id, member, points),
    )


class RunningWorker:
    """A worker running in the background of the test's event loop."""

    def __init__(self, app: App, **kwargs: Any) -> None:
        self.worker = app.worker(**kwargs)
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> RunningWorker:
        self.task = asyncio.create_task(self.worker.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker.request_stop()
        assert self.task is not None
        done, _ = await asyncio.wait([self.task], timeout=60)
        if not done:
            # say where it hangs (every task of the loop and the line it waits on), then stop it
            import io

            report = io.StringIO()
            for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
                report.write(f"--- {task.get_name()}\n")
                task.print_stack(limit=12, file=report)
            self.worker.force_stop()
            await asyncio.wait([self.task], timeout=15)
            raise AssertionError(f"the worker did not stop within 60 s:\n{report.getvalue()}")
        self.task.result()

    @property
    def stats(self) -> Any:
        return self.worker.stats


REPO = __import__("pathlib").Path(__file__).resolve().parent.parent


def start_worker(app_spec: str, env: dict[str, str], log_path: Any, *args: str) -> Any:
    """Start ``jobfence worker APP`` as a real subprocess (killable with SIGKILL)."""
    import os
    import subprocess
    import sys

    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "ab")  # noqa: SIM115 - closed by the process' end
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "worker", app_spec, "--log-level", "DEBUG", *args],
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop_process(proc: Any, timeout: float = 30) -> int:
    """SIGTERM and wait; SIGKILL if it does not stop. Returns the exit code."""
    (code,) = stop_processes([proc], timeout)
    return code


def stop_processes(procs: Any, timeout: float = 30) -> list[int]:
    """:func:`stop_process` for several processes at once: SIGTERM to each, then wait for
    each (so they stop side by side, not one after another); the exit codes, in order."""
    import signal
    import subprocess

    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [int(proc.returncode) for proc in procs]
