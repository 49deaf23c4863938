"""The Prometheus series (docs/metrics.md): the database gauges read real rows on both
stores, the background duties count what they do, and the document and the registry agree."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client import REGISTRY, generate_latest

import jobfence.alerts.dispatcher
import jobfence.outbox.relay
import jobfence.runtime.cleanup
import jobfence.runtime.health
from jobfence import App, outbox
from jobfence.review.deadletters import Actor
from jobfence.review.jobctl import pause_queue
from jobfence.review.stats import GaugesFailed, refresh_gauges
from jobfence.runtime.cleanup import cleanup_loop

from .helpers import eventually

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_database_gauges_read_the_backlogs(database_url: str) -> None:
    app = App(database_url)
    async with app:
        await app.enqueue("gauge.a", {"n": 1}, job_id="a1")
        await app.enqueue("gauge.a", {"n": 2}, job_id="a2")
        await app.enqueue("gauge.b", {"n": 3}, job_id="b1", delay=timedelta(hours=1))
        await pause_queue(app.db, "gauge.a", actor=Actor("tester"), queue_db=app.queue_db)
        async with app.db.transaction() as tx:
            await outbox.write(tx, "gauge.out", {"n": 4}, event_id="e1")
        await refresh_gauges(app.db, app.queue_db)

    # gauge.b's only job is not due for an hour: it has not waited at all
    assert value("jobfence_queue_oldest_due_job_age_seconds", queue="gauge.b") is None
    assert value("jobfence_queue_depth", queue="gauge.a", state="available") == 2
    assert value("jobfence_queue_depth", queue="gauge.b", state="available") == 1
    oldest = value("jobfence_queue_oldest_due_job_age_seconds", queue="gauge.a")
    assert oldest is not None
    assert 0 <= oldest < 60
    assert value("jobfence_queue_paused", queue="gauge.a") == 1
    assert value("jobfence_queue_paused", queue="gauge.b") is None
    assert value("jobfence_outbox_backlog", queue="gauge.out", state="PENDING") == 1
    age = value("jobfence_outbox_oldest_pending_age_seconds", queue="gauge.out")
    assert age is not None
    assert 0 <= age < 60
    assert value("jobfence_fences") == 0
    assert (value("jobfence_gauges_refreshed_timestamp_seconds") or 0) > 0
    if database_url.startswith("postgresql"):
        assert (value("jobfence_fence_table_bytes") or 0) > 0


async def test_cleanup_reports_its_last_caught_up_run(database_url: str) -> None:
    before = value("jobfence_fence_cleanup_last_success_timestamp_seconds") or 0.0
    app = App(database_url)
    async with app:
        task = asyncio.create_task(
            cleanup_loop(app.db, min_age=timedelta(0), interval=timedelta(seconds=60))
        )
        try:
            await eventually(
                lambda: (
                    (value("jobfence_fence_cleanup_last_success_timestamp_seconds") or 0) > before
                ),
                what="a cleanup run recorded",
            )
        finally:
            task.cancel()


def exposed() -> dict[str, str]:
    """jobfence's series as a scrape shows them: name -> type."""
    text = generate_latest(REGISTRY).decode()
    found = re.findall(r"^# TYPE (jobfence_\w+) (\w+)$", text, re.MULTILINE)
    return {n: t for n, t in found if not n.endswith("_created")}  # a counter's start time


def documented() -> dict[str, str]:
    """The rows of docs/metrics.md's tables: | `name` | type | …"""
    rows = re.findall(r"^\| `(jobfence_\w+)` \| (\w+) \|", DOC.read_text(), re.MULTILINE)
    return dict(rows)


def test_docs_metrics_lists_every_series_of_the_registry() -> None:
    # the modules that define series are imported above, so the registry holds them all
    assert jobfence.outbox.relay.PUBLISHED_EVENTS
    registry, doc = exposed(), documented()
    missing = sorted(set(registry) - set(doc))
    stale = sorted(set(doc) - set(registry))
    assert not missing, f"series missing from docs/metrics.md: {missing}"
    assert not stale, f"docs/metrics.md lists series that do not exist: {stale}"
    wrong = {n: (doc[n], t) for n, t in registry.items() if doc[n] != t}
    assert not wrong, f"documented type differs (doc, registry): {wrong}"


async def test_a_failing_gauge_query_leaves_the_others_refreshing(pg_database: str) -> None:
    """A role without one grant (here: no SELECT on queue_pauses) still gets every other
    gauge refreshed; the failure is raised, naming the query."""

    role = f"jf_gauges_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_database, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]
        admin.execute(f"GRANT USAGE ON SCHEMA core TO {role}")  # type: ignore[arg-type]
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA core TO {role}")  # type: ignore[arg-type]
        admin.execute(f"REVOKE SELECT ON core.queue_pauses FROM {role}")  # type: ignore[arg-type]
    try:
        async with App(pg_database) as app:
            await app.enqueue("gauge.grant", {"n": 1}, job_id="g1")
        limited = pg_database.replace("postgres@", f"{role}@")
        async with App(limited, auto_migrate=False) as app:
            with pytest.raises(GaugesFailed) as failed:
                await refresh_gauges(app.db, app.queue_db)
        assert set(failed.value.failed) == {"queue_pauses"}
        assert value("jobfence_queue_depth", queue="gauge.grant", state="available") == 1
    finally:
        with psycopg.connect(pg_database, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
            admin.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]
