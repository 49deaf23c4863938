"""A job looked up by its job_id (issue 23), both stores: the service (`jobfind.find_job`)
and the CLI (`jobfence jobs show|cancel|retry-now JOB_ID [--queue Q]`, `--id N`). A finished
job says it finished, with its fence (consumer, processed_at); a dead-lettered one names its
letter; several queued jobs with the job_id are listed, not guessed between."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from jobfence import App, BusinessError, Job, Tx
from jobfence.errors import InvalidRequest, NotFound
from jobfence.ops.app import create_app
from jobfence.review.deadletters import Actor
from jobfence.review.jobfind import find_job

from ..deadletters.conftest import make_tokens, serve
from ..deadletters.test_cli import jobfence
from ..helpers import RunningWorker, eventually, query, table

Capture = pytest.CaptureFixture[str]
ME = Actor("ann", "library")


def make_app(url: str) -> App:
    app = App(url)

    @app.consumer("points.credit", name="credits")
    async def credit(job: Job[Any], tx: Tx) -> None:
        if job.payload["points"] > 10_000:
            raise BusinessError("credit above the daily limit")

    return app


async def run_jobs(url: str) -> App:
    """order-42 succeeds (a fence of consumer `credits`), order-43 is dead-lettered, order-44
    waits in two queues."""
    app = make_app(url)
    async with app:
        await app.enqueue("points.credit", {"points": 40}, job_id="order-42")
        await app.enqueue("points.credit", {"points": 99_999}, job_id="order-43")
        async with RunningWorker(app, concurrency=2):

            async def settled() -> bool:
                rows = await query(url, f"SELECT count(*) FROM {table(url, 'jobs')}")
                return rows[0][0] == 0

            await eventually(settled, what="both jobs done")
        await app.enqueue("mail", {"points": 1}, job_id="order-44")
        await app.enqueue("sms", {"points": 1}, job_id="order-44")
    return app


async def test_find_by_job_id_says_what_became_of_the_job(database_url: str) -> None:
    app = await run_jobs(database_url)
    consumers = {q: c.name for q, c in app.consumers.items()}
    async with App(database_url) as jf:
        waiting = await find_job(jf.db, "order-44", actor=ME, queue="sms")
        with pytest.raises(InvalidRequest) as several:
            await find_job(jf.db, "order-44", actor=ME)
        with pytest.raises(NotFound) as finished:
            await find_job(jf.db, "order-42", actor=ME, consumers=consumers)
        with pytest.raises(NotFound) as by_queue:
            await find_job(jf.db, "order-42", actor=ME, queue="points.credit", consumers=consumers)
        with pytest.raises(NotFound) as lettered:
            await find_job(jf.db, "order-43", actor=ME, consumers=consumers)
        with pytest.raises(NotFound) as unknown:
            await find_job(jf.db, "order-99", actor=ME, consumers=consumers)
        with pytest.raises(NotFound) as no_app:
            await find_job(jf.db, "order-42", actor=ME)
        with pytest.raises(NotFound) as partner:
            await find_job(jf.db, "order-42", actor=Actor("p", "api", partner="acme"))
    rows = await query(database_url, f"SELECT id FROM {table(database_url, 'jobs')} ORDER BY id")
    assert waiting == rows[1][0]
    assert "matches several queued jobs" in str(several.value)
    assert " in mail (waiting), " in str(several.value)
    assert " in sms (waiting)" in str(several.value)
    for found in (finished, by_queue):
        text = str(found.value)
        assert "job 'order-42'" in text
        assert "finished: consumer credits processed it at " in text
        assert " UTC (its fence, kept until " in text
    assert "is not in the queue" in str(lettered.value)
    assert "dead letter: " in str(lettered.value)
    assert "(pending_review, BUSINESS_ERROR)" in str(lettered.value)
    assert "never enqueued, or finished before its fence expired" in str(unknown.value)
    assert "name its queue or the app" in str(no_app.value)
    assert "processed it" not in str(partner.value)  # a fence carries no partner: not shown


def test_cli_takes_the_job_id_and_says_a_finished_job_finished(
    database_url: str, capsys: Capture, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(run_jobs(database_url))
    module = f"finder_{tmp_path.name.replace('-', '_').replace('[', '_').replace(']', '_')}"
    (tmp_path / f"{module}.py").write_text(
        f"from tests.jobctl.test_find import make_app\napp = make_app({database_url!r})\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    db = ("--database-url", database_url)
    app = ("--app", f"{module}:app")
    finished = jobfence(capsys, "jobs", "show", "order-42", *app)
    cancel_done = jobfence(
        capsys, "jobs", "cancel", "order-42", "--queue", "points.credit", "--reason", "x", *app
    )
    no_app = jobfence(capsys, "jobs", "show", "order-42", "--queue", "points.credit", *db)
    several = jobfence(capsys, "jobs", "show", "order-44", *db)
    shown = jobfence(capsys, "jobs", "show", "order-44", "--queue", "sms", *db)
    neither = jobfence(capsys, "jobs", "show", *db)
    both = jobfence(capsys, "jobs", "show", "order-44", "--id", "3", *db)
    retried = jobfence(capsys, "jobs", "retry-now", "order-44", "--queue", "mail", *db)
    cancelled = jobfence(
        capsys, "jobs", "cancel", "order-44", "--queue", "mail", "--reason", "dup", *db
    )
    assert finished[0] == 1
    assert finished[2].count("\n") == 1
    assert "job 'order-42' finished: consumer credits processed it at " in finished[2]
    assert cancel_done[0] == 1
    assert "finished: consumer credits processed it" in cancel_done[2]  # the queue's consumer
    assert no_app[0] == 1
    assert "name the app (whose consumers say so)" in no_app[2]
    assert several[0] == 1
    assert "matches several queued jobs" in several[2]
    assert shown[0] == 0, shown[2]
    assert "job order-44 (id " in shown[1]
    assert "sms" in shown[1]
    assert neither[0] == 2
    assert "by its job_id" in neither[2]
    assert both[0] == 2
    assert "one of the two" in both[2]
    assert (retried[0], "already due" in retried[2]) == (1, True)
    assert cancelled[0] == 0, cancelled[2]
    assert "job order-44 (id " in cancelled[1]
    assert "cancelled" in cancelled[1]


async def test_the_api_finds_a_job_by_its_job_id(database_url: str) -> None:
    """`GET /v1/jobs/by-job-id/{job_id}` answers what `jobfence jobs show JOB_ID` does."""
    await run_jobs(database_url)
    tokens = await make_tokens(database_url)
    app = make_app(database_url)
    async with (
        serve(create_app(jobfence_app=app)) as url,
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {tokens.viewer}"}, timeout=30
        ) as vera,
    ):
        shown = await vera.get("/v1/jobs/by-job-id/order-44", params={"queue": "sms"})
        several = await vera.get("/v1/jobs/by-job-id/order-44")
        finished = await vera.get("/v1/jobs/by-job-id/order-42")
        lettered = await vera.get("/v1/jobs/by-job-id/order-43")
    await app.close()
    assert shown.status_code == 200, shown.text
    assert (shown.json()["job_id"], shown.json()["queue"]) == ("order-44", "sms")
    assert several.status_code == 422
    assert "matches several queued jobs" in several.json()["detail"]
    assert finished.status_code == 404
    assert "finished: consumer credits processed it at " in finished.json()["detail"]
    assert lettered.status_code == 404
    assert "(pending_review, BUSINESS_ERROR)" in lettered.json()["detail"]
