"""Job control from the command line (issue 14 §2), both stores: ``jobfence jobs
list|show|cancel|retry-now``, ``jobfence queues list|pause|resume`` and ``jobfence dead-letters
discard-matching`` — the same services as the API and the console, results checked in SQL,
refusals in one line."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from jobfence import App

from ..deadletters.conftest import letter_params, seed_letters
from ..deadletters.test_cli import jobfence
from ..helpers import query, table
from .test_service import dialect, fail_once, row_ids

Capture = pytest.CaptureFixture[str]


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def enqueue(url: str, *job_ids: str, queue: str = "mail") -> dict[str, int]:
    async with App(url) as jf:
        for job_id in job_ids:
            await jf.enqueue(queue, {"to": job_id}, job_id=job_id)
    return await row_ids(url)


def test_jobs_list_show_cancel_and_retry_now(database_url: str, capsys: Capture) -> None:
    url = database_url
    ids = asyncio.run(enqueue(url, "m-1", "m-2", "m-3"))
    asyncio.run(fail_once(url, ids["m-2"], "SMTP 451"))
    db = ("--database-url", url)
    listed = jobfence(capsys, "jobs", "list", "--json", *db)
    retrying = jobfence(capsys, "jobs", "list", "--state", "retrying", "--json", *db)
    paged = jobfence(capsys, "jobs", "list", "--limit", "2", *db)
    shown = jobfence(capsys, "jobs", "show", "m-2", *db)
    blank = jobfence(capsys, "jobs", "cancel", "m-1", "--reason", " ", *db)
    cancelled = jobfence(
        capsys, "jobs", "cancel", "--id", str(ids["m-1"]), "--reason", "sent twice", "--json", *db
    )
    again = jobfence(capsys, "jobs", "cancel", "m-1", "--reason", "again", *db)
    gone = jobfence(capsys, "jobs", "show", "--id", str(ids["m-1"]), *db)
    due = jobfence(capsys, "jobs", "retry-now", "m-3", "--queue", "mail", *db)
    now = jobfence(capsys, "jobs", "retry-now", "m-2", "--actor", "otto", *db)
    assert [j["job_id"] for j in lines(listed[1])] == ["m-1", "m-2", "m-3"]
    assert [(j["job_id"], j["last_error"]) for j in lines(retrying[1])] == [("m-2", "SMTP 451")]
    assert paged[0] == 0
    assert f"more: --after {ids['m-2']}" in paged[1]
    assert shown[0] == 0
    assert "Traceback (most recent call last)" in shown[1]
    assert '"to": "m-2"' in shown[1]
    assert blank[0] == 1
    assert blank[2].count("\n") == 1
    assert "reason" in blank[2]
    assert cancelled[0] == 0, cancelled[2]
    letter = lines(cancelled[1])[0]["dead_letter_id"]
    assert again[0] == 1
    assert "job 'm-1' is not in the queue" in again[2]
    assert f"dead letter: {letter} (discarded, NON_RETRYABLE_ERROR)" in again[2]
    assert (gone[0], f"no job {ids['m-1']} in the queue" in gone[2]) == (1, True)
    assert "look it up by its job_id" in gone[2]
    assert (due[0], "already due" in due[2]) == (1, True)
    assert (now[0], now[1].strip()) == (0, f"job m-2 (id {ids['m-2']}) is due now")
    kept = asyncio.run(
        query(
            url,
            f"SELECT job_id, status, error_code FROM {table(url, 'dead_letters')} "
            f"WHERE id = {letter}",
        )
    )
    assert [tuple(r) for r in kept] == [("m-1", "discarded", "CANCELLED")]
    audit = asyncio.run(query(url, f"SELECT action FROM {table(url, 'audit_log')} ORDER BY id"))
    assert [a for (a,) in audit] == ["job.cancel", "job.retry_now"]


def test_a_running_job_is_refused_at_once(database_url: str, capsys: Capture) -> None:
    async def claim() -> int:
        ids = await enqueue(database_url, "m-1")
        async with App(database_url) as jf:
            assert len(await jf.transport.fetch(["mail"], 1, 0)) == 1
        return ids["m-1"]

    row = asyncio.run(claim())
    code, _, err = jobfence(
        capsys,
        "jobs",
        "cancel",
        "--id",
        str(row),
        "--reason",
        "stop",
        "--database-url",
        database_url,
    )
    assert code == 1
    assert "running on worker" in err


def test_queues_pause_list_and_resume(database_url: str, capsys: Capture) -> None:
    url = database_url
    asyncio.run(enqueue(url, "m-1", "m-2"))
    db = ("--database-url", url)
    paused = jobfence(capsys, "queues", "pause", "mail", "--reason", "SMTP down", *db)
    again = jobfence(capsys, "queues", "pause", "mail", *db)
    listed = jobfence(capsys, "queues", "list", "--json", *db)
    table_out = jobfence(capsys, "queues", "list", *db)
    resumed = jobfence(capsys, "queues", "resume", "mail", "--json", *db)
    assert (paused[0], paused[1].strip()) == (0, "queue mail paused (2 waiting)")
    assert again[0] == 1
    assert "already paused" in again[2]
    queues = [(q["queue"], q["waiting"], q["paused"], q["pause_reason"]) for q in lines(listed[1])]
    assert queues == [("mail", 2, True, "SMTP down")]
    assert "SMTP down" in table_out[1]
    assert lines(resumed[1])[0]["paused"] is False
    assert asyncio.run(query(url, f"SELECT count(*) FROM {table(url, 'queue_pauses')}")) == [(0,)]


def test_discard_matching_previews_confirms_and_discards(
    database_url: str, capsys: Capture
) -> None:
    url = database_url
    d = dialect(url)
    ids = asyncio.run(
        seed_letters(
            url,
            [
                letter_params(d, "a"),
                letter_params(d, "b"),
                letter_params(d, "c", error="BusinessError: unknown member"),
            ],
        )
    )
    db = ("--database-url", url)
    everything = jobfence(capsys, "dead-letters", "discard-matching", "--reason", "x", "-y", *db)
    wrong = jobfence(
        capsys, "dead-letters", "discard-matching", "--error", "erp answered",
        "--reason", "ERP outage", "--yes", "--expect", "5", *db,
    )  # fmt: skip
    done = jobfence(
        capsys, "dead-letters", "discard-matching", "--error", "erp answered",
        "--reason", "ERP outage", "--yes", "--expect", "2", "--json", *db,
    )  # fmt: skip
    assert everything[0] == 1
    assert "say which letters" in everything[2]
    assert wrong[0] == 1
    assert "2 letters match, not the 5 expected" in wrong[2]
    assert lines(done[1]) == [{"discarded": 2, "ids": ids[:2]}]
    rows = asyncio.run(
        query(url, f"SELECT job_id, status FROM {table(url, 'dead_letters')} ORDER BY id")
    )
    assert [tuple(r) for r in rows] == [
        ("a", "discarded"),
        ("b", "discarded"),
        ("c", "pending_review"),
    ]
