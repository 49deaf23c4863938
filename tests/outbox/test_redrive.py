"""Re-driving PUBLISH_FAILED_RETRY outbox events (SPEC O2) is explicit (issue 10 §3.4): name
the events, or ask for every failed one (``all``) after a preview, confirming its count.
Unknown fields are refused. The library, the ops API (a real loopback server) and the CLI,
on both stores."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from jobfence import App, outbox
from jobfence.errors import ReviewConflict
from jobfence.ops.app import create_app
from jobfence.review.deadletters import InvalidRequest

from ..deadletters.conftest import Tokens, make_tokens, serve
from ..helpers import query, table

FAILED = {"evt-a1": "q.a", "evt-a2": "q.a", "evt-b1": "q.b"}


async def seed_events(url: str) -> None:
    """Three PUBLISH_FAILED_RETRY events (two in q.a, one in q.b) and a pending one."""
    async with App(url) as app, app.db.transaction() as tx:
        for event_id, queue in FAILED.items():
            await outbox.write(tx, queue, {"e": event_id}, event_id=event_id)
        await outbox.write(tx, "q.a", {"e": "pending"}, event_id="evt-pending")
    await query(
        url,
        f"UPDATE {table(url, 'outbox')} SET state = 'PUBLISH_FAILED_RETRY', attempts = 5 "
        "WHERE event_id <> 'evt-pending'",
    )


async def states(url: str) -> dict[str, str]:
    rows = await query(url, f"SELECT event_id, state FROM {table(url, 'outbox')}")
    return {event_id: state for event_id, state in rows}


async def redrive_audit(url: str) -> list[tuple[Any, ...]]:
    return await query(
        url,
        f"SELECT actor, via, reason, details FROM {table(url, 'audit_log')} "
        "WHERE action = 'outbox.redrive' ORDER BY id",
    )


UNTOUCHED = {**dict.fromkeys(FAILED, "PUBLISH_FAILED_RETRY"), "evt-pending": "PENDING"}


# -- the library ---------------------------------------------------------------------------


async def test_the_library_needs_ids_or_an_explicit_all_with_the_confirmed_count(
    database_url: str,
) -> None:
    """redrive() without event_ids is no longer "everything": it refuses; all_failed needs
    the preview's total; a different total is a conflict; each refusal changes nothing."""
    await seed_events(database_url)
    async with App(database_url) as app:
        with pytest.raises(InvalidRequest, match="name the events"):
            await outbox.redrive(app.db, actor="bob", reason="broker back")
        with pytest.raises(InvalidRequest, match="goes with all_failed"):
            await outbox.redrive(app.db, actor="bob", reason="broker back", queue="q.a")
        with pytest.raises(InvalidRequest, match="preview"):
            await outbox.redrive(app.db, actor="bob", reason="broker back", all_failed=True)
        preview = await outbox.preview_redrive(app.db, queue="q.a", sample=1)
        with pytest.raises(ReviewConflict, match="2 events"):
            await outbox.redrive(
                app.db,
                actor="bob",
                reason="broker back",
                all_failed=True,
                queue="q.a",
                expected_total=3,
            )
        unchanged = await states(database_url)
        done = await outbox.redrive(
            app.db,
            actor="bob",
            reason="broker back",
            all_failed=True,
            queue="q.a",
            expected_total=preview.total,
        )
    assert unchanged == UNTOUCHED
    assert (preview.total, preview.queues) == (2, {"q.a": 2})
    assert [e.event_id for e in preview.sample] == ["evt-a2"]
    assert sorted(done) == ["evt-a1", "evt-a2"]
    assert await states(database_url) == {
        **UNTOUCHED,
        "evt-a1": "PENDING",
        "evt-a2": "PENDING",
    }


# -- the ops API -------------------------------------------------------------------------------


@dataclass
class Ops:
    url: str
    database_url: str
    tokens: Tokens

    def client(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


@pytest.fixture
async def ops(database_url: str) -> AsyncIterator[Ops]:
    await seed_events(database_url)
    tokens = await make_tokens(database_url)
    app = App(database_url)
    async with serve(create_app(jobfence_app=app)) as url:
        yield Ops(url, database_url, tokens)
    await app.close()


async def test_a_redrive_with_unknown_fields_or_no_choice_is_422_and_touches_nothing(
    ops: Ops,
) -> None:
    """{"event_id": …} (a typo for event_ids) used to re-drive every failed event. Unknown
    fields, no choice at all, both choices, a queue without all, and all without the
    confirmed count are each a 422 problem; nothing is re-driven or audited."""
    bodies = [
        {"event_id": ["evt-a1"], "reason": "typo"},
        {"reason": "no choice"},
        {"event_ids": ["evt-a1"], "all": True, "expected_total": 3, "reason": "both"},
        {"queue": "q.a", "reason": "queue without all"},
        {"all": True, "reason": "no count"},
        {"all_failed": True, "expected_total": 3, "reason": "the Python name"},
        {"event_ids": [], "reason": "empty list"},
    ]
    async with ops.client(ops.tokens.operator) as otto:
        answers = [await otto.post("/v1/outbox/events/redrive", json=b) for b in bodies]
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
    assert answers[0].json()["errors"][0]["loc"] == ["body", "event_id"]
    assert "preview" in answers[4].text
    assert await states(ops.database_url) == UNTOUCHED
    assert await redrive_audit(ops.database_url) == []


async def test_redrive_all_previews_then_needs_the_confirmed_count(ops: Ops) -> None:
    """GET …/redrive/preview counts the failed events (per queue, with a sample) and says
    what to confirm; all with another count is 409 and changes nothing; with the count it
    re-drives exactly those, audited with the confirmation; named events still go alone."""
    async with ops.client(ops.tokens.operator) as otto, ops.client(ops.tokens.viewer) as vera:
        viewer = await vera.get("/v1/outbox/events/redrive/preview")
        everything = await otto.get("/v1/outbox/events/redrive/preview")
        preview = await otto.get("/v1/outbox/events/redrive/preview", params={"queue": "q.a"})
        wrong = await otto.post(
            "/v1/outbox/events/redrive",
            json={"all": True, "queue": "q.a", "expected_total": 3, "reason": "broker back"},
        )
        unchanged = await states(ops.database_url)
        done = await otto.post(
            "/v1/outbox/events/redrive",
            json={**preview.json()["confirm"], "reason": "broker back"},
        )
        named = await otto.post(
            "/v1/outbox/events/redrive", json={"event_ids": ["evt-b1"], "reason": "that one"}
        )
    assert viewer.status_code == 403
    assert everything.json()["total"] == 3
    body = preview.json()
    assert (body["total"], body["queues"]) == (2, [{"queue": "q.a", "events": 2}])
    assert [e["event_id"] for e in body["sample"]] == ["evt-a2", "evt-a1"]
    assert body["confirm"] == {"all": True, "queue": "q.a", "expected_total": 2}
    assert (wrong.status_code, wrong.json()["code"]) == (409, "CONFLICT")
    assert "preview again" in wrong.json()["detail"]
    assert unchanged == UNTOUCHED
    assert done.status_code == 200, done.text
    assert (sorted(done.json()["redriven"]), done.json()["count"]) == (["evt-a1", "evt-a2"], 2)
    assert named.json() == {"redriven": ["evt-b1"], "count": 1}
    assert await states(ops.database_url) == dict.fromkeys(UNTOUCHED, "PENDING")
    audit = [
        (a, v, r, d if isinstance(d, dict) else json.loads(d))
        for a, v, r, d in await redrive_audit(ops.database_url)
    ]
    assert [(a, v, r) for a, v, r, _ in audit] == [
        ("otto", "api", "broker back"),
        ("otto", "api", "that one"),
    ]
    assert audit[0][3]["all"] is True
    assert audit[0][3]["expected_total"] == 2


# -- the CLI -----------------------------------------------------------------------------------


def jobfence(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobfence.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_redrive_all_shows_the_count_and_asks_first(database_url: str) -> None:
    """`outbox redrive --all` previews (count per queue, a sample) and asks; "no" changes
    nothing; --yes with a wrong --expect is refused in one line; --yes re-drives them."""
    asyncio.run(seed_events(database_url))
    common = ["--database-url", database_url, "--reason", "broker back", "--actor", "ops-cli"]
    declined = jobfence("outbox", "redrive", "--all", "--queue", "q.a", *common, stdin="n\n")
    after_no = asyncio.run(states(database_url))
    pinned = jobfence("outbox", "redrive", "--all", "--yes", "--expect", "5", *common)
    after_pinned = asyncio.run(states(database_url))
    done = jobfence("outbox", "redrive", "--all", "--yes", "--expect", "3", *common)
    assert (declined.returncode, declined.stderr) == (1, "not confirmed: nothing was re-driven\n")
    assert "2 PUBLISH_FAILED_RETRY event(s)" in declined.stdout
    assert "Re-drive these 2 events?" in declined.stdout
    assert after_no == UNTOUCHED
    assert pinned.returncode == 1
    assert pinned.stderr.strip().splitlines() == [
        "jobfence: error: 3 events are PUBLISH_FAILED_RETRY, not the 5 expected; "
        "preview again (without --yes) to see them"
    ]
    assert after_pinned == UNTOUCHED
    assert done.returncode == 0, done.stderr
    assert {"evt-a1", "evt-a2", "evt-b1"} <= set(done.stdout.splitlines())
    assert "re-drove 3 event(s)" in done.stdout
    assert asyncio.run(states(database_url)) == dict.fromkeys(UNTOUCHED, "PENDING")
