"""Job control through the ops API (issue 14 §2), on both stores, on a real loopback server:
/v1/jobs (filters, keyset pages, a job with its tracebacks, cancel, retry-now), /v1/queues
(counts, pause/resume) and /v1/discards (bulk discard: preview → reason → done), with the
roles and partner scope, each result checked in SQL."""

from __future__ import annotations

import json

import httpx

from jobfence import App
from jobfence.ops.app import create_app

from ..deadletters.conftest import (
    OpsServer,
    Tokens,
    letter_params,
    make_tokens,
    ops,
    seed_letters,
    serve,
)
from ..helpers import query, table
from .test_service import dialect, fail_once, row_ids

__all__ = ["ops"]  # the fixture


async def test_jobs_list_show_cancel_and_retry_now(ops: OpsServer) -> None:
    url = ops.database_url
    async with App(url) as jf:
        for n in range(3):
            await jf.enqueue("mail", {"n": n, "note": "<b>"}, job_id=f"m-{n}")
    ids = await row_ids(url)
    await fail_once(url, ids["m-1"], "SMTP 451")
    async with ops.client(ops.tokens.viewer) as vera, ops.client(ops.tokens.operator) as otto:
        first = (await vera.get("/v1/jobs", params={"limit": 2})).json()
        rest = (await vera.get("/v1/jobs", params={"after": first["next_cursor"]})).json()
        retrying = (await vera.get("/v1/jobs", params={"state": "retrying"})).json()
        bad = await vera.get("/v1/jobs", params={"state": "sleeping"})
        shown = (await vera.get(f"/v1/jobs/{ids['m-1']}")).json()
        forbidden = await vera.post(f"/v1/jobs/{ids['m-0']}/cancel", json={"reason": "x"})
        blank = await otto.post(f"/v1/jobs/{ids['m-0']}/cancel", json={"reason": " "})
        cancelled = await otto.post(f"/v1/jobs/{ids['m-0']}/cancel", json={"reason": "sent twice"})
        gone = await vera.get(f"/v1/jobs/{ids['m-0']}")
        due = await otto.post(f"/v1/jobs/{ids['m-2']}/retry-now")
        now = await otto.post(f"/v1/jobs/{ids['m-1']}/retry-now", json={"reason": "SMTP back"})
    assert [j["job_id"] for j in first["items"] + rest["items"]] == ["m-0", "m-1", "m-2"]
    assert rest["next_cursor"] is None
    assert [(j["job_id"], j["last_error"]) for j in retrying["items"]] == [("m-1", "SMTP 451")]
    assert bad.status_code == 422
    assert "unknown job state" in bad.json()["detail"]
    assert shown["payload"]["encoding"] == "utf-8"
    assert json.loads(shown["payload"]["data"]) == {"n": 1, "note": "<b>"}
    assert shown["history"][0]["trace"].startswith("Traceback (most recent call last)")
    assert (forbidden.status_code, blank.status_code) == (403, 422)
    assert cancelled.status_code == 200, cancelled.text
    letter = cancelled.json()["dead_letter_id"]
    assert cancelled.json()["job"]["job_id"] == "m-0"
    assert gone.status_code == 404
    assert due.status_code == 409
    assert "already due" in due.json()["detail"]
    assert now.status_code == 200, now.text
    assert now.json()["state"] == "retrying"
    kept = await query(
        url,
        f"SELECT job_id, status, error_code, review_reason FROM {table(url, 'dead_letters')} "
        f"WHERE id = {letter}",
    )
    assert [tuple(r) for r in kept] == [("m-0", "discarded", "CANCELLED", "sent twice")]
    audit = await query(url, f"SELECT actor, action FROM {table(url, 'audit_log')} ORDER BY id")
    assert [tuple(a) for a in audit] == [("otto", "job.cancel"), ("otto", "job.retry_now")]


async def test_a_running_job_is_a_conflict_not_a_wait(ops: OpsServer) -> None:
    async with App(ops.database_url) as jf:
        await jf.enqueue("mail", {"n": 1}, job_id="m-1")
        (_claimed,) = await jf.transport.fetch(["mail"], 1, 0)
        (row,) = (await row_ids(ops.database_url)).values()
        async with ops.client(ops.tokens.operator) as otto:
            answer = await otto.post(f"/v1/jobs/{row}/cancel", json={"reason": "stop"})
            running = (await otto.get("/v1/jobs", params={"state": "running"})).json()
    assert answer.status_code == 409
    assert "running on worker" in answer.json()["detail"]
    assert [j["worker_id"] is not None for j in running["items"]] == [True]


async def test_queues_pause_and_resume(ops: OpsServer) -> None:
    url = ops.database_url
    async with App(url) as jf:
        await jf.enqueue("mail", {"n": 1}, job_id="m-1")
    async with ops.client(ops.tokens.operator) as otto, ops.client(ops.tokens.partner_a) as acme:
        paused = await otto.post("/v1/queues/mail/pause", json={"reason": "SMTP relay down"})
        again = await otto.post("/v1/queues/mail/pause")
        scoped = await acme.post("/v1/queues/mail/resume")
        listed = (await otto.get("/v1/queues")).json()
        metrics = (await otto.get("/metrics")).text
        pauses = await query(url, f"SELECT queue, paused_by FROM {table(url, 'queue_pauses')}")
        resumed = await otto.post("/v1/queues/mail/resume")
        unknown = await otto.post("/v1/queues/mail/stop")
        after = (await otto.get("/metrics")).text
    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused"], paused.json()["pause_reason"]) == (True, "SMTP relay down")
    assert again.status_code == 409
    assert scoped.status_code == 422  # queues are shared by every partner
    assert [(q["queue"], q["waiting"], q["paused"]) for q in listed["queues"]] == [
        ("mail", 1, True)
    ]
    assert [tuple(p) for p in pauses] == [("mail", "otto")]
    assert 'jobfence_queue_paused{queue="mail"} 1.0' in metrics
    assert 'jobfence_queue_paused{queue="mail"}' not in after
    assert (resumed.status_code, resumed.json()["paused"]) == (200, False)
    assert unknown.status_code == 422
    assert await query(url, f"SELECT count(*) FROM {table(url, 'queue_pauses')}") == [(0,)]


async def test_bulk_discard_previews_then_discards_with_a_reason(ops: OpsServer) -> None:
    url = ops.database_url
    d = dialect(url)
    ids = await seed_letters(
        url,
        [
            letter_params(d, "a"),
            letter_params(d, "b"),
            letter_params(d, "c", error="BusinessError: unknown member"),
        ],
    )
    flt = {"filter": {"error": "erp answered"}}
    async with ops.client(ops.tokens.operator) as otto, ops.client(ops.tokens.viewer) as vera:
        everything = await otto.post("/v1/discards", json={})
        viewer = await vera.post("/v1/discards", json=flt)
        preview = (await otto.post("/v1/discards", json=flt)).json()
        confirm = {**flt, "upto_id": preview["upto_id"], "expect": preview["total"]}
        no_reason = await otto.post("/v1/discards/run", json={**confirm, "reason": ""})
        done = await otto.post("/v1/discards/run", json={**confirm, "reason": "ERP outage"})
    assert everything.status_code == 422
    assert "say which letters" in everything.json()["detail"]
    assert viewer.status_code == 403
    assert (preview["total"], preview["upto_id"]) == (2, ids[1])
    assert no_reason.status_code == 422
    assert done.json() == {"discarded": 2, "ids": ids[:2]}
    rows = await query(url, f"SELECT job_id, status FROM {table(url, 'dead_letters')} ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("a", "discarded"),
        ("b", "discarded"),
        ("c", "pending_review"),
    ]


async def test_with_a_broker_transport_the_job_routes_say_where_the_jobs_are(
    sqlite_database: str,
) -> None:
    """The jobs live in the broker: 404 naming the reason, not an empty list that would read
    as "no jobs"; dead letters still work (they live in the database)."""
    tokens = await make_tokens(sqlite_database)
    app = App(sqlite_database, transport="redis://127.0.0.1:6379/0?prefix=jf-i14g-api")
    async with serve(create_app(jobfence_app=app)) as base, ops_client(base, tokens) as otto:
        jobs = await otto.get("/v1/jobs")
        queues = await otto.get("/v1/queues")
        letters = await otto.get("/v1/dead-letters")
    await app.close()
    assert (jobs.status_code, queues.status_code, letters.status_code) == (404, 404, 200)
    assert "keeps its jobs in a broker" in jobs.json()["detail"]


def ops_client(base: str, tokens: Tokens) -> httpx.AsyncClient:
    auth = {"Authorization": f"Bearer {tokens.operator}"}
    return httpx.AsyncClient(base_url=base, headers=auth)
