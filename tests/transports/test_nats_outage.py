"""A NATS outage is logged in jobfence's format, a few one-line warnings, no tracebacks
(issue 10 §3.2). nats-py's default error callback logs a traceback for every failed
reconnection attempt (twice a second); the NATS transport routes the client's callbacks
and logger through jobfence's logging instead.

The worker is a real `jobfence worker` process with JSON logs; its NATS server is a private
instance (tests/contract/servers.py) that the test crashes and starts again.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence.core.jobs import OutgoingJob
from jobfence.transports.nats import UNAVAILABLE, NatsTransport

from ..contract.servers import NatsServer, free_port
from ..contract.support import (
    Target,
    broker_url,
    cleanup,
    create_effects_table,
    effects,
    new_queue,
    start_worker,
    stop_worker,
    wait_started,
)
from ..helpers import REPO, eventually

REFUSED = "Connect call failed"  # what each failed reconnection attempt reports


@pytest.fixture
def private_nats(pg_database: str) -> Iterator[tuple[Target, NatsServer]]:
    server = NatsServer()
    try:
        server.start()
        queue, token = new_queue()
        create_effects_table(pg_database)
        target = Target(
            "nats", pg_database, broker_url("nats", token, base=server.url), queue, token
        )
        yield target, server
    finally:
        server.close()


def _entries(log: Path) -> list[dict[str, Any]]:
    """Every line of the worker's output, each of which must be one JSON log entry."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                found.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a jobfence log line: {line!r}") from None
    return found


async def test_a_nats_outage_is_a_few_one_line_warnings_without_tracebacks(
    private_nats: tuple[Target, NatsServer], tmp_path: Path
) -> None:
    """Worker running (one job processed), NATS crashed: at least 4 reconnection attempts
    fail, then NATS comes back and a new job is processed. The worker's whole output is
    JSON log lines, without a traceback; the outage is a handful of WARNING lines (lost,
    the distinct errors, restored) however many attempts failed — the repeats are DEBUG."""
    target, server = private_nats
    log = tmp_path / "worker.log"
    worker = start_worker(
        target.env(tmp_path, lease=5.0), log, "--log-format", "json", "--log-level", "DEBUG"
    )
    try:
        await wait_started(log)
        app = target.app()
        async with app:
            await app.enqueue(target.queue, {"n": 0}, job_id="before-outage")

        async def first() -> bool:
            return await effects(target.database_url) == [("before-outage", 1)]

        await eventually(first, timeout=60, what="the job enqueued before the outage")
        server.kill()

        def attempts_failed() -> int:
            return log.read_text(errors="replace").count(REFUSED) >= 4

        await eventually(attempts_failed, timeout=60, what="4 failed reconnection attempts")
        server.start()
        app = target.app()
        async with app:
            await app.enqueue(target.queue, {"n": 1}, job_id="after-outage")

        async def processed() -> bool:
            return len(await effects(target.database_url)) == 2

        await eventually(processed, timeout=60, what="the job enqueued after the outage")
    finally:
        code = stop_worker(worker)
        await cleanup(target)
    assert code == 0
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    entries = _entries(log)
    warnings = [e for e in entries if e["level"] == "warning"]
    events = [e["event"] for e in warnings]
    assert "NATS connection lost; reconnecting" in events
    assert "NATS connection restored" in events
    refused = [e for e in entries if REFUSED in str(e.get("error", ""))]
    assert len(refused) >= 4
    assert len(warnings) <= 6, events
    assert all("exception" not in e for e in entries)
    restored = next(e for e in warnings if e["event"] == "NATS connection restored")
    assert restored["failed_attempts"] >= 4
    assert await effects(target.database_url) == [("after-outage", 1), ("before-outage", 1)]


async def test_a_fetch_that_needs_the_server_during_an_outage_returns_nothing(
    private_nats: tuple[Target, NatsServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A fetch on a queue not declared yet needs JetStream's API; with the server down the
    request times out. The fetch returns nothing after one WARNING line (the worker would
    otherwise log a traceback per fetch), and works once the server is back."""
    target, server = private_nats
    assert target.transport_url is not None
    transport = NatsTransport.from_url(
        target.transport_url, lease=timedelta(seconds=5), worker_id="outage"
    )
    transport.api_timeout = 1.0
    await transport.open()
    try:
        server.kill()
        with caplog.at_level(logging.DEBUG, logger="jobfence.transport.nats"):
            assert await transport.fetch([target.queue], 5, 0.2) == []
            assert await transport.fetch([target.queue], 5, 0.2) == []
        lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.exc_info is None]
        assert ("WARNING", "NATS unavailable while fetching; trying again") in lines
        assert all(r.exc_info is None for r in caplog.records)
        unavailable = [m for level, m in lines if "unavailable" in m and level == "WARNING"]
        assert len(unavailable) == 1  # the second time is a DEBUG line
        server.start()

        async def works_again() -> bool:
            try:
                await transport.publish([OutgoingJob(target.queue, "back-1", b"{}")])
            except UNAVAILABLE:
                return False  # still reconnecting
            got = await transport.fetch([target.queue], 5, 0.5)
            for delivery in got:
                await transport.ack(delivery)
            return bool(got)

        await eventually(works_again, timeout=60, what="a fetch after the restart")
    finally:
        await transport.close()
        await cleanup(target)


def test_the_cli_with_an_unreachable_nats_says_so_in_one_line(sqlite_database: str) -> None:
    """`jobfence enqueue` with NATS not there: the client used to retry its first
    connection forever (printing a traceback per attempt). Now a few attempts, then one
    line that says where and why (the password masked), exit 1."""
    url = f"nats://jobs:s3cret@127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    result = subprocess.run(
        [
            sys.executable, "-m", "jobfence.cli", "enqueue", "q", "--payload", "{}",
            "--database-url", sqlite_database, "--transport", url,
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobfence: error: cannot connect to NATS at nats://jobs:***@")
    assert "Connect call failed" in lines[0]
    assert "s3cret" not in result.stderr
