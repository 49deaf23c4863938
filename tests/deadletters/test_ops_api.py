"""The ops HTTP API (SPEC K3) on a real loopback server, on both stores: deny by default
(401, 403, 404 out of scope, 413), audited writes, the same behaviour as the service."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

from jobfence.review.validation import MAX_PAGE

from ..helpers import eventually, query, table
from .conftest import OpsServer, letter_params, seed_letters


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


async def audit_actions(url: str) -> list[tuple[str, str, Any]]:
    rows = await query(
        url, f"SELECT actor, action, dead_letter_id FROM {table(url, 'audit_log')} ORDER BY id"
    )
    return [(a, b, c) for a, b, c in rows]


async def seed_scoped(url: str) -> dict[str, int]:
    d = dialect(url)
    acme, globex, plain = await seed_letters(
        url,
        [
            letter_params(d, "a-1", payload=b'{"partner_id": "acme", "po": 1}'),
            letter_params(d, "g-1", payload=b'{"partner_id": "globex", "po": 2}'),
            letter_params(d, "p-1"),
        ],
    )
    return {"acme": acme, "globex": globex, "plain": plain}


def routes(letter: int, replay: int) -> list[tuple[str, str, dict[str, Any] | None, str, bool]]:
    """(method, path, body, role, scoped) for every route that needs a token."""
    return [
        ("GET", "/metrics", None, "viewer", False),
        ("GET", "/openapi.json", None, "viewer", False),
        ("GET", "/v1/stats", None, "viewer", False),
        ("GET", "/v1/dead-letters", None, "viewer", False),
        ("GET", f"/v1/dead-letters/{letter}", None, "viewer", True),
        ("POST", f"/v1/dead-letters/{letter}/replay", {}, "operator", True),
        ("POST", f"/v1/dead-letters/{letter}/discard", {"reason": "dup"}, "operator", True),
        ("POST", "/v1/replays", {"filter": {"queue": "points.credit"}}, "operator", False),
        ("POST", f"/v1/replays/{replay}/run", {"expected_total": 3}, "operator", True),
        ("GET", f"/v1/replays/{replay}", None, "viewer", True),
        ("GET", f"/v1/replays/{replay}/items", None, "viewer", True),
        ("GET", "/v1/audit", None, "viewer", False),
        ("GET", "/v1/outbox/events", None, "viewer", False),
        ("GET", "/v1/outbox/events/00000000-0000-0000-0000-000000000000", None, "viewer", False),
        ("POST", "/v1/outbox/events/redrive", {"reason": "broker back"}, "operator", False),
        ("GET", "/v1/outbox/events/redrive/preview", None, "operator", False),
        ("GET", "/v1/jobs", None, "viewer", False),
        ("GET", "/v1/jobs/1", None, "viewer", False),
        ("POST", "/v1/jobs/1/cancel", {"reason": "dup"}, "operator", False),
        ("POST", "/v1/jobs/1/retry-now", {}, "operator", False),
        ("GET", "/v1/queues", None, "viewer", False),
        ("POST", "/v1/queues/points.credit/pause", {}, "operator", False),
        ("POST", "/v1/queues/points.credit/resume", {}, "operator", False),
        ("POST", "/v1/discards", {"filter": {"queue": "points.credit"}}, "operator", False),
        ("POST", "/v1/discards/run", {"upto_id": 1, "expect": 1}, "operator", False),
    ]


async def test_every_route_denies_by_default(ops: OpsServer) -> None:
    """Each route: no token, an unknown token or an expired one → 401 (WWW-Authenticate:
    Bearer); a viewer on a write route → 403; another partner's letter or replay → 404; a
    body over the limit → 413. Refusals change nothing and audit nothing."""
    letters = await seed_scoped(ops.database_url)
    async with ops.client(ops.tokens.operator) as admin:
        made = await admin.post("/v1/replays", json={"filter": {"queue": "points.credit"}})
        assert made.status_code == 201, made.text
    replay = made.json()["replay_id"]
    before = await audit_actions(ops.database_url)
    big = {"reason": "x" * 20_000}
    table_ = routes(letters["globex"], replay)
    checked = 0
    async with (
        ops.client(None) as anonymous,
        ops.client("jfo_not-a-real-token") as unknown,
        ops.client(ops.tokens.expired) as expired,
        ops.client(ops.tokens.viewer) as viewer,
        ops.client(ops.tokens.partner_a) as acme,
        ops.client(ops.tokens.operator) as operator,
    ):
        for method, path, body, role, scoped in table_:
            for client in (anonymous, unknown, expired):
                r = await client.request(method, path, json=body)
                assert r.status_code == 401, (method, path, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["code"] == "UNAUTHORIZED"
            if role == "operator":
                r = await viewer.request(method, path, json=body)
                assert (r.status_code, r.json()["code"]) == (403, "FORBIDDEN"), (path, r.text)
            if scoped:  # acme's operator token asking for globex's letter / an unscoped replay
                r = await acme.request(method, path, json=body)
                assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND"), (path, r.text)
            r = await operator.request(method, path, json=big)
            assert (r.status_code, r.json()["code"]) == (413, "PAYLOAD_TOO_LARGE"), path
            checked += 1
        health = await anonymous.get("/healthz")
    assert checked == 25
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert await audit_actions(ops.database_url) == before
    state = await query(
        ops.database_url, f"SELECT status FROM {table(ops.database_url, 'dead_letters')}"
    )
    assert state == [("pending_review",)] * 3


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // 1024):
        yield b"x" * 1024


async def test_a_streamed_body_over_the_limit_is_refused_too(ops: OpsServer) -> None:
    """Without Content-Length (chunked), the limit still holds: 413 before the route runs."""
    letters = await seed_scoped(ops.database_url)
    async with ops.client(ops.tokens.operator) as operator:
        r = await operator.post(
            f"/v1/dead-letters/{letters['plain']}/discard",
            content=_chunks(32 * 1024),
            headers={"content-type": "application/json"},
        )
        ok = await operator.post(
            f"/v1/dead-letters/{letters['plain']}/discard",
            content=_small(b'{"reason": "duplicate of po 1"}'),
            headers={"content-type": "application/json"},
        )
    assert (r.status_code, r.json()["code"]) == (413, "PAYLOAD_TOO_LARGE")
    assert (ok.status_code, ok.json()["status"]) == (200, "discarded")


async def _small(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_every_write_leaves_an_audit_row(ops: OpsServer) -> None:
    """Replay, discard, bulk preview and bulk run through the API: each is in the audit log
    under the token's name, with the letter or replay it touched."""
    letters = await seed_scoped(ops.database_url)
    async with ops.client(ops.tokens.operator) as otto, ops.client(ops.tokens.partner_a) as acme:
        assert (
            await acme.post(f"/v1/dead-letters/{letters['acme']}/replay", json={})
        ).status_code == 200
        discarded = await otto.post(
            f"/v1/dead-letters/{letters['plain']}/discard", json={"reason": "test order"}
        )
        preview = await otto.post("/v1/replays", json={"filter": {"queue": "points.credit"}})
        replay = preview.json()["replay_id"]
        run = await otto.post(f"/v1/replays/{replay}/run", json={"expected_total": 1, "rate": None})

        async def finished() -> bool:
            return (await otto.get(f"/v1/replays/{replay}")).json()["state"] == "done"

        await eventually(finished, what="bulk replay done")
        log = await otto.get("/v1/audit", params={"limit": 10})
        acme_log = await acme.get("/v1/audit")
    assert (discarded.status_code, run.status_code) == (200, 202)
    assert await audit_actions(ops.database_url) == [
        ("acme-ops", "dead_letter.replay", letters["acme"]),
        ("otto", "dead_letter.discard", letters["plain"]),
        ("otto", "replay.preview", None),
        ("otto", "replay.start", None),
        ("otto", "dead_letter.replay", letters["globex"]),
        ("otto", "replay.finish", None),
    ]
    assert [(e["action"], e["old_state"], e["new_state"]) for e in log.json()["items"]][:2] == [
        ("replay.finish", "running", "done"),
        ("dead_letter.replay", "pending_review", "replayed"),
    ]
    assert [(e["actor"], e["via"]) for e in acme_log.json()["items"]] == [("acme-ops", "api")]


async def test_discard_without_a_reason_is_422_and_changes_nothing(ops: OpsServer) -> None:
    """A missing reason fails the schema; an empty or blank one fails the service: 422."""
    letters = await seed_scoped(ops.database_url)
    path = f"/v1/dead-letters/{letters['plain']}/discard"
    async with ops.client(ops.tokens.operator) as otto:
        missing = await otto.post(path, json={})
        empty = await otto.post(path, json={"reason": ""})
        blank = await otto.post(path, json={"reason": " \t\n "})
        no_body = await otto.post(path)
    for response in (missing, empty, blank, no_body):
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
    assert blank.json()["detail"].startswith("a discard needs a reason")
    assert missing.json()["errors"][0]["loc"] == ["body", "reason"]
    assert await audit_actions(ops.database_url) == []


async def test_a_replay_and_a_discard_racing_via_the_api_one_gets_409(ops: OpsServer) -> None:
    """Ten letters, each replayed and discarded at once by two operators: one 200 and one
    409 REVIEW_CONFLICT per letter."""
    d = dialect(ops.database_url)
    ids = await seed_letters(ops.database_url, [letter_params(d, f"r-{i}") for i in range(10)])
    async with ops.client(ops.tokens.operator) as otto:
        for letter in ids:
            replayed, discarded = await asyncio.gather(
                otto.post(f"/v1/dead-letters/{letter}/replay", json={"reason": "ERP back"}),
                otto.post(f"/v1/dead-letters/{letter}/discard", json={"reason": "dup"}),
            )
            codes = sorted([replayed.status_code, discarded.status_code])
            assert codes == [200, 409], (replayed.text, discarded.text)
            loser = replayed if replayed.status_code == 409 else discarded
            assert loser.json()["code"] == "REVIEW_CONFLICT"
            assert f"dead letter {letter} was already" in loser.json()["detail"]


async def test_show_gives_payload_attempts_error_and_correlation_id(ops: OpsServer) -> None:
    """The detail view: payload (UTF-8 as text, other bytes as base64), every attempt, the
    error and correlation_id; lists never carry payloads."""
    d = dialect(ops.database_url)
    raw = b"\xff\x00binary"
    text_letter, binary_letter = await seed_letters(
        ops.database_url,
        [
            letter_params(d, "t-1", payload='{"name": "Zoë"}'.encode(), correlation_id="req-5"),
            letter_params(d, "b-1", payload=raw),
        ],
    )
    await query(
        ops.database_url,
        f"UPDATE {table(ops.database_url, 'dead_letters')} SET history = "
        + (
            '\'[{"attempt": 1, "at": "2024-01-01T00:00:00Z", "category": '
            '"TEMPORARY_ERROR", "error": "503", "retry_at": "2024-01-01T00:00:30Z"}]\''
        ),
    )
    async with ops.client(ops.tokens.viewer) as vera:
        text = (await vera.get(f"/v1/dead-letters/{text_letter}")).json()
        binary = (await vera.get(f"/v1/dead-letters/{binary_letter}")).json()
        listing = (await vera.get("/v1/dead-letters")).json()
        missing = await vera.get("/v1/dead-letters/987654")
    assert text["payload"] == {
        "encoding": "utf-8",
        "data": '{"name": "Zoë"}',
        "size": 16,
        "truncated": False,
    }
    assert binary["payload"]["encoding"] == "base64"
    assert base64.b64decode(binary["payload"]["data"]) == raw
    assert (text["correlation_id"], text["last_error"], text["job_id"]) == (
        "req-5",
        "TemporaryError: ERP answered 503",
        "t-1",
    )
    assert text["history"] == [
        {
            "attempt": 1,
            "at": "2024-01-01T00:00:00Z",
            "category": "TEMPORARY_ERROR",
            "error": "503",
            "retry_at": "2024-01-01T00:00:30Z",
            "trace": None,  # written without a traceback: null, never missing
        }
    ]
    assert all("payload" not in item for item in listing["items"])
    assert [item["id"] for item in listing["items"]] == [binary_letter, text_letter]
    assert missing.status_code == 404


async def test_lists_page_with_a_cursor_and_a_capped_page_size(ops: OpsServer) -> None:
    """limit over MAX_PAGE (the CLI's --limit cap too) → 422; pages of 2 walk all letters
    newest first; filters apply."""
    d = dialect(ops.database_url)
    ids = await seed_letters(ops.database_url, [letter_params(d, f"j-{i}") for i in range(5)])
    async with ops.client(ops.tokens.viewer) as vera:
        too_big = await vera.get("/v1/dead-letters", params={"limit": MAX_PAGE + 1})
        seen, cursor = [], None
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor is not None:
                params["before"] = cursor
            page = (await vera.get("/v1/dead-letters", params=params)).json()
            seen.append([item["id"] for item in page["items"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        filtered = (await vera.get("/v1/dead-letters", params={"job_id": "j-3"})).json()
        bad = await vera.get("/v1/dead-letters", params={"category": "NOPE"})
    assert too_big.status_code == 422
    assert seen == [[ids[4], ids[3]], [ids[2], ids[1]], [ids[0]]]
    assert [item["id"] for item in filtered["items"]] == [ids[3]]
    assert bad.status_code == 422


async def test_a_bulk_replay_through_the_api_previews_then_needs_the_confirmed_count(
    ops: OpsServer,
) -> None:
    """POST /v1/replays is the dry run (nothing republished); running it with another count
    is 409; with the count it runs in the background; its status and items report each
    letter."""
    d = dialect(ops.database_url)
    ids = await seed_letters(ops.database_url, [letter_params(d, f"b-{i}") for i in range(4)])
    async with ops.client(ops.tokens.operator) as otto:
        no_filter = await otto.post("/v1/replays", json={})
        preview = await otto.post("/v1/replays", json={"filter": {"ids": ids[:3]}, "sample": 2})
        body = preview.json()
        queued = await query(
            ops.database_url, f"SELECT count(*) FROM {table(ops.database_url, 'jobs')}"
        )
        wrong = await otto.post(body["confirm"], json={"expected_total": 4})
        run = await otto.post(
            body["confirm"],
            json={"expected_total": 3, "rate": 100, "reason": "partner fixed the ERP, OPS-9"},
        )

        async def finished() -> dict[str, Any] | None:
            status = (await otto.get(f"/v1/replays/{body['replay_id']}")).json()
            return status if status["state"] == "done" else None

        status = await eventually(finished, what="bulk replay done")
        items = (await otto.get(f"/v1/replays/{body['replay_id']}/items")).json()
        again = await otto.post(body["confirm"], json={"expected_total": 3})
    assert no_filter.status_code == 422
    assert preview.status_code == 201
    assert (body["total"], body["already_applied"], body["truncated"]) == (3, 0, 0)
    assert [s["id"] for s in body["sample"]] == ids[:2]
    assert body["confirm"] == f"/v1/replays/{body['replay_id']}/run"
    assert queued == [(0,)]
    assert (wrong.status_code, wrong.json()["code"]) == (409, "REVIEW_CONFLICT")
    assert run.status_code == 202
    assert (status["done"], status["counts"]) == (3, {"published": 3})
    assert [(i["dead_letter_id"], i["outcome"]) for i in items["items"]] == [
        (letter, "published") for letter in ids[:3]
    ]
    assert again.status_code == 409
    jobs = await query(
        ops.database_url, f"SELECT job_id FROM {table(ops.database_url, 'jobs')} ORDER BY job_id"
    )
    assert jobs == [("b-0",), ("b-1",), ("b-2",)]
    # the run's reason is kept on each letter (issue 12: the API takes it as the CLI does)
    reasons = await query(
        ops.database_url,
        f"SELECT DISTINCT review_reason FROM {table(ops.database_url, 'dead_letters')} "
        "WHERE status = 'replayed'",
    )
    assert reasons == [("partner fixed the ERP, OPS-9",)]


async def test_metrics_openapi_and_stats(ops: OpsServer) -> None:
    """/metrics has the pending-review and queue-depth gauges; the OpenAPI document lists
    every route; stats count letters by queue, category and status."""
    await seed_scoped(ops.database_url)
    async with ops.client(ops.tokens.viewer) as vera:
        metrics = await vera.get("/metrics")
        spec = (await vera.get("/openapi.json")).json()
        stats = (await vera.get("/v1/stats")).json()
    assert (
        'jobfence_dead_letters_pending_review{category="TEMPORARY_ERROR",queue="points.credit"} 3.0'
        in metrics.text
    )
    assert "jobfence_queue_depth" in metrics.text
    assert "jobfence_alert_deliveries_pending" in metrics.text
    assert sorted(spec["paths"]) == [
        "/healthz",
        "/livez",
        "/metrics",
        "/readyz",
        "/v1/audit",
        "/v1/calls",
        "/v1/calls/{call_id}",
        "/v1/calls/{call_id}/settle",
        "/v1/dead-letters",
        "/v1/dead-letters/{letter_id}",
        "/v1/dead-letters/{letter_id}/discard",
        "/v1/dead-letters/{letter_id}/replay",
        "/v1/discards",
        "/v1/discards/run",
        "/v1/flow",
        "/v1/flow/keys/{action}",
        "/v1/jobs",
        "/v1/jobs/by-job-id/{job_id}",
        "/v1/jobs/{job}",
        "/v1/jobs/{job}/cancel",
        "/v1/jobs/{job}/retry-now",
        "/v1/outbox/events",
        "/v1/outbox/events/redrive",
        "/v1/outbox/events/redrive/preview",
        "/v1/outbox/events/{event_id}",
        "/v1/queues",
        "/v1/queues/{queue}/{action}",
        "/v1/replays",
        "/v1/replays/{replay_id}",
        "/v1/replays/{replay_id}/items",
        "/v1/replays/{replay_id}/run",
        "/v1/schedules",
        "/v1/stats",
    ]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert stats == {
        "letters": [
            {
                "queue": "points.credit",
                "category": "TEMPORARY_ERROR",
                "status": "pending_review",
                "letters": 3,
            }
        ],
        "queue_depth": [],
        "queues": [],
    }


async def test_the_outbox_routes_are_served_by_the_ops_api(ops: OpsServer) -> None:
    """`jobfence ops serve` carries the outbox routes: a viewer lists events, a partner-scoped
    token is refused (the outbox spans every partner)."""
    async with ops.client(ops.tokens.viewer) as viewer, ops.client(ops.tokens.partner_a) as acme:
        listed = await viewer.get("/v1/outbox/events")
        scoped = await acme.get("/v1/outbox/events")
        spec = (await viewer.get("/openapi.json")).json()
    assert listed.status_code == 200, listed.text
    assert scoped.status_code == 403, scoped.text
    assert "/v1/outbox/events/redrive" in spec["paths"]


async def test_metrics_are_refused_to_partner_scoped_tokens(ops: OpsServer) -> None:
    """/metrics is process- and database-wide (every partner's pending letters, every queue's
    depth; no partner label to filter on): a partner-scoped token gets 403 pointing at the
    filtered /v1/stats, and learns nothing; unscoped tokens still scrape."""
    await seed_scoped(ops.database_url)
    async with (
        ops.client(ops.tokens.partner_b_viewer) as globex,
        ops.client(ops.tokens.partner_a) as acme,
        ops.client(ops.tokens.viewer) as vera,
    ):
        scoped_viewer = await globex.get("/metrics")
        scoped_operator = await acme.get("/metrics")
        scoped_stats = await globex.get("/v1/stats")
        unscoped = await vera.get("/metrics")
    for refused in (scoped_viewer, scoped_operator):
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "FORBIDDEN"
        assert "/v1/stats" in refused.json()["detail"]
        assert "jobfence_" not in refused.text
    assert scoped_stats.json() == {
        "letters": [
            {
                "queue": "points.credit",
                "category": "TEMPORARY_ERROR",
                "status": "pending_review",
                "letters": 1,
            }
        ],
        "queue_depth": None,
        "queues": None,
    }
    assert unscoped.status_code == 200
    assert "jobfence_dead_letters_pending_review" in unscoped.text


BIG = 2**63  # one past PostgreSQL's bigint and SQLite's INTEGER


def oversized(
    letter: int, replay: int
) -> list[tuple[str, str, dict[str, Any] | None, Any, list[Any]]]:
    """(method, path, query, body, where the error is): every integer the ops API takes, one
    past int64."""
    return [
        ("GET", "/v1/dead-letters", {"before": BIG}, None, ["query", "before"]),
        ("GET", "/v1/dead-letters", {"before": -BIG - 1}, None, ["query", "before"]),
        ("GET", f"/v1/dead-letters/{BIG}", None, None, ["path", "letter_id"]),
        ("POST", f"/v1/dead-letters/{BIG}/replay", None, {}, ["path", "letter_id"]),
        ("POST", f"/v1/dead-letters/{BIG}/discard", None, {"reason": "x"}, ["path", "letter_id"]),
        (
            "POST",
            "/v1/replays",
            None,
            {"filter": {"ids": [letter, BIG]}},
            ["body", "filter", "ids", 1],
        ),
        ("POST", f"/v1/replays/{BIG}/run", None, {"expected_total": 1}, ["path", "replay_id"]),
        (
            "POST",
            f"/v1/replays/{replay}/run",
            None,
            {"expected_total": BIG},
            ["body", "expected_total"],
        ),
        ("GET", f"/v1/replays/{BIG}", None, None, ["path", "replay_id"]),
        ("GET", f"/v1/replays/{BIG}/items", None, None, ["path", "replay_id"]),
        ("GET", f"/v1/replays/{replay}/items", {"after": BIG}, None, ["query", "after"]),
        ("GET", "/v1/audit", {"dead_letter_id": BIG}, None, ["query", "dead_letter_id"]),
        ("GET", "/v1/audit", {"replay_id": BIG}, None, ["query", "replay_id"]),
        ("GET", "/v1/audit", {"before": BIG}, None, ["query", "before"]),
    ]


async def test_integers_beyond_int64_are_422_problems_never_500(ops: OpsServer) -> None:
    """Each id, cursor and count parameter, one past int64 (PostgreSQL: out of range for
    bigint; SQLite: OverflowError): 422 problem+json naming the parameter, nothing changed,
    and the server keeps answering."""
    letters = await seed_scoped(ops.database_url)
    async with ops.client(ops.tokens.operator) as otto:
        made = await otto.post("/v1/replays", json={"filter": {"queue": "points.credit"}})
        replay = made.json()["replay_id"]
        before = await audit_actions(ops.database_url)
        answers, expected = [], []
        for method, path, params, body, where in oversized(letters["plain"], replay):
            r = await otto.request(method, path, params=params, json=body)
            loc = r.json().get("errors", [{}])[0].get("loc") if r.status_code == 422 else None
            answers.append((method, path, r.status_code, r.headers.get("content-type"), loc))
            expected.append((method, path, 422, "application/problem+json", where))
        still = await otto.get(f"/v1/dead-letters/{letters['plain']}")
    assert answers == expected
    assert await audit_actions(ops.database_url) == before
    assert still.status_code == 200


async def test_a_value_the_database_refuses_is_a_422_problem(ops: OpsServer) -> None:
    """The last line of defence: a value that passes the schema but not the driver (a NUL
    in a text filter: PostgreSQL text cannot hold it, psycopg raises DataError) is a 422
    problem, never a 500. (SQLite stores it: an empty page.)"""
    async with ops.client(ops.tokens.viewer) as vera:
        r = await vera.get("/v1/audit", params={"actor": "alice\x00"})
    if dialect(ops.database_url) == "postgresql":
        assert (r.status_code, r.headers["content-type"]) == (422, "application/problem+json")
        assert r.json()["code"] == "INVALID_REQUEST"
        assert "out of range or malformed" in r.json()["detail"]
    else:
        assert (r.status_code, r.json()) == (200, {"items": [], "next_cursor": None})


async def test_status_all_lists_every_status_as_the_cli_does(ops: OpsServer) -> None:
    """status=all (what `jobfence dead-letters list --status all` takes) means no status filter;
    an unknown status is a 422 that names `all` among the choices."""
    d = dialect(ops.database_url)
    kept, dropped = await seed_letters(
        ops.database_url, [letter_params(d, "s-1"), letter_params(d, "s-2")]
    )
    async with ops.client(ops.tokens.operator) as olga:
        discarded = await olga.post(
            f"/v1/dead-letters/{dropped}/discard", json={"reason": "duplicate of s-1"}
        )
        every = await olga.get("/v1/dead-letters", params={"status": "all"})
        pending = await olga.get("/v1/dead-letters", params={"status": "pending_review"})
        bogus = await olga.get("/v1/dead-letters", params={"status": "everything"})
    assert discarded.status_code == 200, discarded.text
    assert every.status_code == 200, every.text
    assert [(x["id"], x["status"]) for x in every.json()["items"]] == [
        (dropped, "discarded"),
        (kept, "pending_review"),
    ]
    assert [x["id"] for x in pending.json()["items"]] == [kept]
    assert bogus.status_code == 422
    assert "all" in bogus.text


async def test_stats_mark_queues_the_app_does_not_serve(ops: OpsServer) -> None:
    """Issue 12 §5: /v1/stats lists each queue's backlog (waiting, running, the oldest waiting
    job's age) and says whether one of the app's consumers serves it."""

    @ops.app.consumer("points.credit")
    async def credit(job: Any, tx: Any) -> None:
        pass

    await ops.app.enqueue("no.such.queue", {}, job_id="typo-1")
    await ops.app.enqueue("points.credit", {}, job_id="ok-1")
    async with ops.client(ops.tokens.viewer) as viewer:
        found = (await viewer.get("/v1/stats")).json()
    queues = {q["queue"]: q for q in found["queues"]}
    assert queues["no.such.queue"]["served"] is False
    assert queues["points.credit"]["served"] is True
    assert queues["no.such.queue"]["waiting"] == 1
    assert queues["no.such.queue"]["oldest_waiting_s"] >= 0
