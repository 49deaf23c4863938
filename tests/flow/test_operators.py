"""Operators see flow control and pause one key (issue 26 §5): the flow view of a limited
queue (how full each key is, what waits on it and why, the held keys), the Prometheus gauges
made of it with a bounded set of key labels, the deferral counter's bound, and pausing and
resuming one key from the CLI and the ops API (audited)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from jobfence import App, Job, Limit, Rate, Tx
from jobfence.core.jobs import Delivery
from jobfence.metrics import FLOW_COUNTER_KEYS, MetricsObserver
from jobfence.review import jobctl
from jobfence.review.deadletters import Actor
from jobfence.runtime import flow
from jobfence.runtime.flow_view import METRIC_KEYS, OTHER, queue_flow, refresh_flow_gauges

from ..deadletters.conftest import OpsServer, ops
from ..deadletters.test_cli import jobfence
from ..helpers import query, table

__all__ = ["ops"]  # the fixture

LIMIT = Limit(concurrency=2, rate=Rate(10, per=timedelta(minutes=1)), key="partner")


def limited_app(url: str) -> App:
    app = App(url)

    @app.consumer("orders", limit=LIMIT)
    async def handle(job: Job[Any], tx: Tx) -> None:
        pass

    return app


async def seed(app: App, url: str) -> None:
    """acme: 4 jobs, 2 of them running (its 2 slots); globex: 2 waiting, 3 starts in the
    window, paused by otto; initech: 1 waiting, backing off for 2 minutes."""
    jobs = [app.job("orders", {"partner_id": p}, job_id=f"{p}{i}")
            for p, n in (("acme", 4), ("globex", 2), ("initech", 1)) for i in range(n)]  # fmt: skip
    await app.enqueue_many(jobs)
    jobs_table = table(url, "jobs")
    token = "gen_random_uuid()" if url.startswith("postgresql") else "'t-' || id"
    now = "now()" if url.startswith("postgresql") else "((julianday('now') - 2440587.5) * 86400.0)"
    lease = "interval '5 minutes'" if url.startswith("postgresql") else "300"
    await query(
        url,
        f"UPDATE {jobs_table} SET state = 'running', attempts = 1, lease_token = {token}, "
        f"lease_expires_at = {now} + {lease}, worker_id = 'w1' "
        "WHERE job_id IN ('acme0', 'acme1')",
    )
    db = app.transport.jobs_db or app.db
    async with db.transaction() as tx:
        await flow.record_starts(tx, db, "orders", ["globex"] * 3, db.at(datetime.now(UTC)))
    await flow.hold(
        db, "orders", "initech", kind="backoff", seconds=120, reason="partner 429", held_by="w1"
    )
    await jobctl.pause_key(app.db, "orders", "globex", actor=Actor("otto"), reason="outage")


async def test_the_flow_view_says_how_full_each_key_is_and_why_jobs_wait(
    database_url: str,
) -> None:
    app = limited_app(database_url)
    async with app:
        await seed(app, database_url)
        view = await queue_flow(app.transport.jobs_db or app.db, "orders", LIMIT)
    keys = {k.key: (k.in_use, k.starts, k.waiting, k.held, k.deferred) for k in view.keys}
    assert keys == {
        "acme": (2, 0, 2, None, "concurrency"),
        "globex": (0, 3, 2, "pause", "hold"),
        "initech": (0, 0, 1, "backoff", "hold"),
    }
    assert (view.in_use, view.deferred, view.unkeyed) == (2, 5, 0)
    holds = {(h.key, h.kind, h.held_by, h.reason) for h in view.holds}
    assert holds == {
        ("globex", "pause", "otto", "outage"),
        ("initech", "backoff", "w1", "partner 429"),
    }
    backoff = next(h for h in view.holds if h.kind == "backoff")
    assert backoff.held_for is not None
    assert 100 < backoff.held_for <= 120


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_the_flow_gauges_name_at_most_the_busiest_keys(pg_database: str) -> None:
    """The gauges after a refresh: slots in use and deferred jobs per key and reason, held
    keys per kind; with 15 keys waiting, METRIC_KEYS of them are named and the rest are
    summed as "(other)"."""
    app = limited_app(pg_database)
    async with app:
        await seed(app, pg_database)
        await app.enqueue_many(
            [app.job("orders", {"partner_id": f"p{n:02d}"}, job_id=f"p{n:02d}") for n in range(15)]
        )
        await refresh_flow_gauges(app.db, {"orders": LIMIT})
    assert _sample("jobfence_flow_slots_in_use", queue="orders", key="acme") == 2
    assert (
        _sample("jobfence_flow_deferred_jobs", queue="orders", reason="concurrency", key="acme")
        == 2
    )
    assert _sample("jobfence_flow_deferred_jobs", queue="orders", reason="hold", key="globex") == 2
    assert _sample("jobfence_flow_deferred_jobs", queue="orders", reason="hold", key="initech") == 1
    assert _sample("jobfence_flow_keys_held", queue="orders", kind="pause") == 1
    assert _sample("jobfence_flow_keys_held", queue="orders", kind="backoff") == 1
    named = {
        s.labels["key"]
        for metric in REGISTRY.collect()
        if metric.name == "jobfence_flow_slots_in_use"
        for s in metric.samples
        if s.labels["queue"] == "orders"
    }
    assert len(named) == METRIC_KEYS + 1  # 18 keys: the 10 busiest by name, then (other)
    assert OTHER in named
    assert "acme" in named
    # the p00..p14 keys have nothing running: 15 - (10 - 3) of them are summed in (other)
    assert _sample("jobfence_flow_slots_in_use", queue="orders", key=OTHER) == 0


def test_the_deferral_counter_names_a_bounded_set_of_keys() -> None:
    observer = MetricsObserver({"bounded": "bounded"})
    for n in range(FLOW_COUNTER_KEYS + 5):
        delivery = Delivery(queue="bounded", job_id=f"j{n}", payload=b"{}", attempt=1)
        observer.job_deferred(delivery, "bounded", "rate", f"k{n}", timedelta(seconds=1))
    keys = {
        s.labels["key"]: s.value
        for metric in REGISTRY.collect()
        if metric.name == "jobfence_flow_deferrals"
        for s in metric.samples
        if s.labels.get("queue") == "bounded" and s.name.endswith("_total")
    }
    assert len(keys) == FLOW_COUNTER_KEYS + 1
    assert keys["(other)"] == 5
    assert keys["k0"] == 1


def test_pause_and_resume_one_key_from_the_cli(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ("--database-url", database_url)
    code, out, err = jobfence(
        capsys, "queues", "pause-key", "orders", "acme", "--reason", "partner outage", *db
    )
    assert (code, out.strip()) == (0, "key acme of queue orders paused"), err
    code, _, err = jobfence(capsys, "queues", "pause-key", "orders", "acme", *db)
    assert code == 1
    assert err.count("\n") == 1
    assert "already paused" in err
    code, out, err = jobfence(capsys, "queues", "resume-key", "orders", "acme", "--json", *db)
    assert code == 0, err
    assert json.loads(out) == {"queue": "orders", "key": "acme", "paused": False}
    code, _, err = jobfence(capsys, "queues", "resume-key", "orders", "acme", *db)
    assert (code, "not paused" in err) == (1, True)
    audit = asyncio.run(
        query(
            database_url,
            f"SELECT action, reason FROM {table(database_url, 'audit_log')} ORDER BY id",
        )
    )
    assert [tuple(a) for a in audit] == [("key.pause", "partner outage"), ("key.resume", None)]


async def test_the_ops_api_shows_the_flow_and_pauses_one_key(ops: OpsServer) -> None:
    """GET /v1/flow (the app's limited queues), POST /v1/flow/keys/pause|resume (operator
    only, 409 on a repeat); a partner-scoped viewer sees its own key only."""
    app = ops.app
    app.consumer("orders", limit=LIMIT)(_noop)
    await seed(app, ops.database_url)
    async with httpx.AsyncClient(base_url=ops.url) as client:

        def auth(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        got = await client.get("/v1/flow", headers=auth(ops.tokens.viewer))
        assert got.status_code == 200, got.text
        (orders,) = got.json()["queues"]
        assert orders["limit"]["concurrency"] == 2
        assert {k["key"]: (k["in_use"], k["waiting"], k["deferred"]) for k in orders["keys"]} == {
            "acme": (2, 2, "concurrency"),
            "globex": (0, 2, "hold"),
            "initech": (0, 1, "hold"),
        }
        body = {"queue": "orders", "key": "acme", "reason": "too many errors"}
        refused = await client.post(
            "/v1/flow/keys/pause", json=body, headers=auth(ops.tokens.viewer)
        )
        assert refused.status_code == 403
        paused = await client.post(
            "/v1/flow/keys/pause", json=body, headers=auth(ops.tokens.operator)
        )
        assert paused.status_code == 200, paused.text
        assert paused.json() == {"queue": "orders", "key": "acme", "paused": True}
        again = await client.post(
            "/v1/flow/keys/pause", json=body, headers=auth(ops.tokens.operator)
        )
        assert again.status_code == 409
        scoped = await client.get("/v1/flow", headers=auth(ops.tokens.partner_b_viewer))
        assert [k["key"] for k in scoped.json()["queues"][0]["keys"]] == ["globex"]
        resumed = await client.post(
            "/v1/flow/keys/resume", json={"queue": "orders", "key": "acme"},
            headers=auth(ops.tokens.operator),
        )  # fmt: skip
        assert resumed.json()["paused"] is False
    audit = await query(
        ops.database_url,
        f"SELECT action, actor FROM {table(ops.database_url, 'audit_log')} ORDER BY id",
    )
    assert [a for a, _ in audit] == ["key.pause", "key.pause", "key.resume"]


async def _noop(job: Job[Any], tx: Tx) -> None:
    pass
