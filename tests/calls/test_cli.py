"""``jobfence calls list|show|settle`` on both stores: the in-doubt calls of parked jobs, one
call, and a settlement that replays the parked job — with --json, and refusals in one line."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from jobfence.calls import default_key

from ..deadletters.test_cli import jobfence
from ..helpers import query, table
from .support import STEP, Orders

Capture = pytest.CaptureFixture[str]


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def _park(url: str, jobs: dict[str, str | None]) -> None:
    orders = Orders(url)
    async with orders.app:
        await orders.park(jobs)


def test_calls_list_show_and_settle(database_url: str, capsys: Capture) -> None:
    url = database_url
    asyncio.run(_park(url, {"po-1": "acme", "po-2": None}))
    db = ("--database-url", url)
    listed = lines(jobfence(capsys, "calls", "list", "--json", *db)[1])
    table_out = jobfence(capsys, "calls", "list", *db)
    by_job = {c["job_id"]: c for c in listed}
    first = by_job["po-1"]["id"]
    shown = jobfence(capsys, "calls", "show", str(first), *db)
    shown_json = json.loads(jobfence(capsys, "calls", "show", str(first), "--json", *db)[1])
    blank = jobfence(capsys, "calls", "settle", str(first), "applied", "--reason", " ", *db)
    no_ref = jobfence(capsys, "calls", "settle", str(first), "applied", "--reason", "found", *db)
    bad = jobfence(capsys, "calls", "settle", str(first), "maybe", "--reason", "found", *db)
    missing = jobfence(capsys, "calls", "show", "999999", *db)
    settled = jobfence(
        capsys, "calls", "settle", str(first), "applied", "--reference", "PO-1",
        "--reason", "PO-1 found in the ERP", "--actor", "otto", "--json", *db,
    )  # fmt: skip
    again = jobfence(capsys, "calls", "settle", str(first), "not_applied", "--reason", "hm", *db)
    plain = jobfence(
        capsys, "calls", "settle", str(by_job["po-2"]["id"]), "not_applied",
        "--reason", "nothing in the ERP", *db,
    )  # fmt: skip
    applied = lines(jobfence(capsys, "calls", "list", "--state", "applied", "--json", *db)[1])
    in_doubt = lines(jobfence(capsys, "calls", "list", "--json", *db)[1])

    assert sorted(by_job) == ["po-1", "po-2"]
    assert by_job["po-1"]["key"] == default_key("po-1", STEP)
    assert by_job["po-1"]["state"] == "in_doubt"
    assert "read timeout" in by_job["po-1"]["last_error"]
    assert table_out[0] == 0
    # the table at the console's width (80 columns here): the key may be cut, never missing
    assert default_key("po-2", STEP)[:6] in table_out[1]
    assert shown[0] == 0
    assert "parked as" in shown[1]
    assert f"jobfence calls settle {first} applied --reference REF" in shown[1]
    assert shown_json["dead_letter_id"] is not None
    assert shown_json["partner"] == "acme"
    for refused in (blank, no_ref):
        assert refused[0] == 1
        assert refused[2].count("\n") == 1
    assert "needs a reason" in blank[2]
    assert "needs the downstream's reference" in no_ref[2]
    assert bad[0] == 2
    assert "'maybe' is not one of 'applied', 'not_applied'" in bad[2]
    assert missing[0] == 1
    assert missing[2] == "jobfence: error: no call 999999\n"
    assert settled[0] == 0, settled[2]
    result = json.loads(settled[1])
    assert result["call"]["state"] == "applied"
    assert result["call"]["settled_by"] == "otto"
    assert result["replay"] == {
        "dead_letter_id": shown_json["dead_letter_id"],
        "outcome": "published",
        "detail": None,
    }
    assert again[0] == 1
    assert "already settled as applied by otto" in again[2]
    assert plain[0] == 0
    assert "settled as not_applied" in plain[1]
    assert "replayed (published)" in plain[1]
    assert [c["job_id"] for c in applied] == ["po-1"]
    assert in_doubt == []
    # both parked jobs are back in the queue (the replays), their letters decided
    jobs = asyncio.run(query(url, f"SELECT job_id FROM {table(url, 'jobs')} ORDER BY job_id"))
    assert jobs == [("po-1",), ("po-2",)]
    letters = asyncio.run(
        query(url, f"SELECT status FROM {table(url, 'dead_letters')} ORDER BY job_id")
    )
    assert letters == [("replayed",), ("replayed",)]
