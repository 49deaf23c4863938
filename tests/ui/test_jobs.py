"""Jobs and queues in the browser: cancel a retrying job (reason required), retry one now,
pause a queue and watch a running worker stop claiming from it, resume it; bulk discard of
dead letters with preview and reason. Outcomes checked in SQL."""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import expect

from jobfence import App, Job, Tx

from ..deadletters.conftest import letter_params, seed_letters
from ..helpers import RunningWorker, eventually, query, scalar
from ..jobctl.test_service import fail_once, row_ids
from .conftest import Console, csrf_of, origin


async def test_cancel_a_retrying_job(console: Console) -> None:
    url = console.database_url
    await console.app.enqueue("mail", {"to": "a@example.com"}, job_id="m-1")
    await console.app.enqueue("mail", {"to": "b@example.com"}, job_id="m-2")
    ids = await row_ids(url)
    await fail_once(url, ids["m-1"], "SMTP 451 try later")
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/jobs?state=retrying")
    await expect(page.locator("#jobs tbody tr")).to_have_count(1)
    await expect(page.locator("#jobs")).to_contain_text("SMTP 451 try later")
    await console.shot(page, "jobs-retrying")
    await page.click(f"a[href='/ui/jobs/{ids['m-1']}']")
    await expect(page.locator("pre.trace")).to_contain_text("Traceback (most recent call last)")
    await console.shot(page, "job")
    await page.fill("form[action$='/cancel'] input[name=reason]", "  ")  # blank: refused
    await page.click("form[action$='/cancel'] button")
    await expect(page.locator(".flash.error")).to_contain_text("reason")
    await expect(page.locator("h1")).to_contain_text("m-1")  # the job stays on screen
    await expect(page.locator("pre.trace")).to_contain_text("Traceback")
    assert await scalar(url, "SELECT count(*) FROM core.jobs WHERE job_id = 'm-1'") == 1
    await page.fill("form[action$='/cancel'] input[name=reason]", "customer withdrew, OPS-9")
    await page.click("form[action$='/cancel'] button")
    await expect(page.locator("h1 .badge")).to_have_text("discarded")
    await expect(page.locator(".flash.ok")).to_contain_text("cancelled")
    assert await query(url, "SELECT job_id FROM core.jobs") == [("m-2",)]
    assert await query(
        url, "SELECT job_id, status, error_code, review_reason FROM core.dead_letters"
    ) == [("m-1", "discarded", "CANCELLED", "customer withdrew, OPS-9")]


async def test_retry_now(console: Console) -> None:
    url = console.database_url
    await console.app.enqueue("mail", {}, job_id="r-1")
    ids = await row_ids(url)
    await fail_once(url, ids["r-1"], "SMTP 451")
    assert await scalar(url, "SELECT run_at > now() + interval '50 minutes' FROM core.jobs")
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/jobs/{ids['r-1']}")
    await page.click("form[action$='/retry-now'] button")
    await expect(page.locator(".flash.ok")).to_contain_text("due now")
    assert await scalar(url, "SELECT run_at <= now() FROM core.jobs WHERE job_id = 'r-1'")
    assert await query(url, "SELECT actor, action FROM core.audit_log") == [
        ("otto", "job.retry_now")
    ]


async def test_pause_stops_a_worker_claiming_and_resume_restarts_it(console: Console) -> None:
    """A worker runs on mail and sms. Paused from the page, mail keeps its job while the
    worker goes on with sms (so it is claiming); resumed, the mail job is done."""
    url = console.database_url
    worker_app = App(url)
    handled: list[str] = []

    @worker_app.consumer("mail")
    async def mail(job: Job[Any], tx: Tx) -> None:
        handled.append(job.job_id)

    @worker_app.consumer("sms")
    async def sms(job: Job[Any], tx: Tx) -> None:
        handled.append(job.job_id)

    for queue in ("mail", "sms"):  # the server knows the app's queues (as with ops serve --app)
        console.app.consumer(queue)(mail)
    await console.app.enqueue("mail", {}, job_id="before-pause")
    page = await console.signed_in(console.tokens.operator)
    async with worker_app, RunningWorker(worker_app, poll_interval=0.2):
        await eventually(lambda: "before-pause" in handled, what="the worker at work")
        await page.goto("/ui/queues")
        row = page.locator("tr[data-queue=mail]")
        await row.locator("input[name=reason]").fill("SMTP relay down")
        await row.locator("button").click()
        await expect(page.locator("tr[data-queue=mail]")).to_contain_text("paused")
        await console.shot(page, "queues-paused")
        await console.app.enqueue("mail", {}, job_id="m-paused")
        await console.app.enqueue("sms", {}, job_id="s-after")
        await eventually(lambda: "s-after" in handled, what="sms still claimed")
        assert "m-paused" not in handled
        assert (
            await scalar(url, "SELECT state FROM core.jobs WHERE job_id = 'm-paused'")
            == "available"
        )
        await page.locator("tr[data-queue=mail] button").click()
        await expect(page.locator("tr[data-queue=mail]")).to_contain_text("active")
        await eventually(lambda: "m-paused" in handled, what="mail claimed again after resume")
    assert await query(url, "SELECT action, reason FROM core.audit_log ORDER BY id") == [
        ("queue.pause", "SMTP relay down"),
        ("queue.resume", None),
    ]


async def test_a_running_job_shows_its_worker_and_cannot_be_cancelled(console: Console) -> None:
    """The handler works inside its transaction: the page shows the job running on its worker
    with no Cancel; a POST anyway is refused at once (409), not held until the handler ends."""
    url = console.database_url
    worker_app = App(url)
    inside, release = asyncio.Event(), asyncio.Event()

    @worker_app.consumer("mail")
    async def mail(job: Job[Any], tx: Tx) -> None:
        inside.set()
        await release.wait()

    await console.app.enqueue("mail", {}, job_id="busy-1")
    (row,) = (await row_ids(url)).values()
    page = await console.signed_in(console.tokens.operator)
    async with worker_app, RunningWorker(worker_app) as w:
        await asyncio.wait_for(inside.wait(), timeout=30)
        await page.goto(f"/ui/jobs/{row}")
        await expect(page.locator("h1 .badge")).to_have_text("running")
        await expect(page.locator("dl.facts")).to_contain_text("lease until")
        await expect(page.locator("form[action$='/cancel']")).to_have_count(0)
        r = await page.request.post(
            f"/ui/jobs/{row}/cancel",
            form={"csrf": await csrf_of(page), "reason": "stop it"},
            headers={"Origin": origin(console.url)},
            timeout=10_000,
        )
        assert r.status == 409
        assert "running on worker" in await r.text()
        release.set()
        await eventually(lambda: w.stats.handled == 1, what="the job done")
    assert await scalar(url, "SELECT count(*) FROM core.dead_letters") == 0


async def test_a_viewer_cannot_control_jobs_or_queues(console: Console) -> None:
    url = console.database_url
    await console.app.enqueue("mail", {}, job_id="v-1")
    ids = await row_ids(url)
    await fail_once(url, ids["v-1"], "SMTP 451")
    page = await console.signed_in(console.tokens.viewer)
    await page.goto(f"/ui/jobs/{ids['v-1']}")
    await expect(page.locator("form[action$='/cancel']")).to_have_count(0)
    await page.goto("/ui/queues")
    await expect(page.locator("tr[data-queue=mail] button")).to_have_count(0)
    token = await csrf_of(page)
    for path in (
        f"/ui/jobs/{ids['v-1']}/cancel",
        f"/ui/jobs/{ids['v-1']}/retry-now",
        "/ui/queues/mail/pause",
    ):
        r = await page.request.post(
            path,
            form={"csrf": token, "reason": "forged"},
            headers={"Origin": origin(console.url)},
        )
        assert r.status == 403, path
    assert await scalar(url, "SELECT count(*) FROM core.audit_log") == 0
    assert await scalar(url, "SELECT count(*) FROM core.queue_pauses") == 0


async def test_bulk_discard_with_preview_and_reason(console: Console) -> None:
    url = console.database_url
    await seed_letters(
        url,
        [letter_params("postgresql", f"x-{i}", queue="exports") for i in range(5)]
        + [letter_params("postgresql", "keep-1", queue="payments")],
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/dead-letters?queue=exports")
    await page.click("button[value=filter]:has-text('Discard all matching')")
    await expect(page.locator("#total")).to_have_text("5")
    await expect(page.locator("table.grid").first.locator("tbody tr")).to_have_text(
        ["exports TEMPORARY_ERROR 5"], use_inner_text=True
    )
    assert sorted(await page.locator("td.mono").all_inner_texts()) == [f"x-{i}" for i in range(5)]
    await console.shot(page, "bulk-discard-preview")
    await page.click("text=Confirm: discard 5 letters")
    await expect(page.locator(".flash.error")).to_contain_text("reason")
    assert (
        await scalar(url, "SELECT count(*) FROM core.dead_letters WHERE status = 'discarded'") == 0
    )
    await expect(page.locator("#total")).to_have_text("5")
    await page.fill("input[name=reason]", "export job retired, OPS-11")
    await page.click("text=Confirm: discard 5 letters")
    await expect(page.locator(".flash.ok")).to_contain_text("5 dead letters discarded")
    assert await query(
        url, "SELECT queue, status, count(*) FROM core.dead_letters GROUP BY 1, 2 ORDER BY 1"
    ) == [("exports", "discarded", 5), ("payments", "pending_review", 1)]
