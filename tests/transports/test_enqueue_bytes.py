"""`jobfence enqueue --raw` takes bytes end to end (issue 10 §3.1).

The payload is read as bytes (stdin as bytes, argv through ``os.fsencode``) and reaches the
handler and the dead letter byte-exact on every transport; an id that cannot be UTF-8 is an
``EnqueueError`` (the CLI: one line, no traceback). Real `jobfence` subprocesses, real servers.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from jobfence import App, EnqueueError, Job, NonRetryableError, Tx

from ..contract.support import KINDS, Target, cleanup, make_target
from ..helpers import REPO, RunningWorker, eventually, query, table

#: invalid UTF-8 (a lone continuation byte, a truncated sequence, latin-1); argv cannot
#: carry NUL bytes
ARGV_PAYLOAD = b"\xff\xfe raw \xc3\x28 caf\xe9 \x80"
#: NUL bytes, invalid UTF-8, a UTF-8-encoded surrogate, CR/LF: only stdin carries these
STDIN_PAYLOAD = b"\x00\xff\x80 binary\r\n\x00 \xed\xa0\x80 end\n"


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


def jf(*args: str | bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """`jobfence ARGS` with byte arguments passed through unchanged (POSIX argv is bytes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def where(target: Target) -> list[str]:
    found = ["--database-url", target.database_url]
    if target.transport_url:
        found += ["--transport", target.transport_url]
    return found


def one_line_error(result: subprocess.CompletedProcess[bytes]) -> str:
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    assert result.returncode != 0, out + err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jobfence: error: "), err
    return lines[0]


async def test_raw_payload_bytes_reach_the_handler_and_the_dead_letter_exactly(
    target: Target,
) -> None:
    """Two raw payloads that are not UTF-8, one from argv, one (with NUL bytes) from stdin,
    enqueued by the real command on each transport: the handler receives the same bytes,
    and the dead letter it ends in keeps them."""
    argv = jf(
        "enqueue", target.queue, "--raw", "--payload", ARGV_PAYLOAD, "--job-id", "argv-1",
        *where(target),
    )  # fmt: skip
    assert argv.returncode == 0, argv.stderr.decode(errors="replace")
    assert argv.stdout.decode().strip() == "argv-1"
    piped = jf(
        "enqueue", target.queue, "--raw", "--payload", "-", "--job-id", "stdin-1",
        *where(target),
        stdin=STDIN_PAYLOAD,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr.decode(errors="replace")

    app = target.app()
    seen: dict[str, tuple[Any, bytes]] = {}

    @app.consumer(target.queue, schema=bytes)
    async def handle(job: Job[bytes], tx: Tx) -> None:
        seen[job.job_id] = (job.payload, job.raw)
        raise NonRetryableError("kept as evidence")

    db = target.database_url
    letters = f"SELECT job_id, payload, payload_size FROM {table(db, 'dead_letters')} ORDER BY 1"

    async with app, RunningWorker(app, concurrency=2, poll_interval=0.2):
        await eventually(lambda: _count(db, letters, 2), timeout=60, what="two dead letters")
    assert seen == {
        "argv-1": (ARGV_PAYLOAD, ARGV_PAYLOAD),
        "stdin-1": (STDIN_PAYLOAD, STDIN_PAYLOAD),
    }
    rows = [(job_id, bytes(payload), size) for job_id, payload, size in await query(db, letters)]
    assert rows == [
        ("argv-1", ARGV_PAYLOAD, len(ARGV_PAYLOAD)),
        ("stdin-1", STDIN_PAYLOAD, len(STDIN_PAYLOAD)),
    ]


async def _count(db: str, sql: str, n: int) -> bool:
    return len(await query(db, sql)) >= n


def test_a_job_id_that_is_not_utf8_is_one_clear_line(sqlite_database: str) -> None:
    """A job id (or correlation id) with bytes that are not UTF-8 cannot be stored or sent:
    one line that says which option and why, exit 1, nothing enqueued."""
    for option in ("--job-id", "--correlation-id"):
        result = jf(
            "enqueue", "q", "--payload", "{}", option, b"order-\xff\xfe",
            "--database-url", sqlite_database,
        )  # fmt: skip
        line = one_line_error(result)
        name = option.removeprefix("--").replace("-", "_")
        assert f"{name} " in line, line
        assert "is not valid UTF-8" in line, line
        assert result.returncode == 1
    rows = asyncio.run(query(sqlite_database, "SELECT count(*) FROM core_jobs"))
    assert rows == [(0,)]


def test_a_json_payload_that_is_not_utf8_is_one_clear_line(sqlite_database: str) -> None:
    """JSON must be UTF-8: bytes that are not are refused in one line that points to --raw
    (from argv and from stdin alike)."""
    for args, stdin in (((b'{"name": "caf\xe9"}',), None), (("-",), b'{"name": "caf\xe9"}')):
        result = jf(
            "enqueue", "q", "--payload", *args, "--database-url", sqlite_database, stdin=stdin
        )
        line = one_line_error(result)
        assert "not valid UTF-8" in line, line
        assert "--raw" in line, line


async def test_app_enqueue_refuses_ids_that_cannot_be_utf8(sqlite_database: str) -> None:
    """A lone surrogate (what Python makes of undecodable bytes) in a job id, correlation id
    or queue name: an EnqueueError that names the field, never a raw UnicodeEncodeError."""
    app = App(sqlite_database)
    async with app:
        with pytest.raises(EnqueueError, match=r"job_id .* is not valid UTF-8"):
            await app.enqueue("q", {}, job_id="a\udcff")
        with pytest.raises(EnqueueError, match=r"correlation_id .* is not valid UTF-8"):
            await app.enqueue("q", {}, correlation_id="req-\ud800")
        with pytest.raises(EnqueueError, match=r"queue .* is not valid UTF-8"):
            await app.enqueue("q\udcff", {})
        with pytest.raises(EnqueueError, match=r"job_id .* is not valid UTF-8"):
            app.enqueue_sync("q", {}, job_id="a\udcff")
    rows = await query(sqlite_database, "SELECT count(*) FROM core_jobs")
    assert rows == [(0,)]
