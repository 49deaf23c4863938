"""The console's everyday friction (issue 23): the overview fits 1400 px with every category,
job ids never break at their hyphens, a delayed job says so and when, counts agree with their
nouns, every time has one format with its zone, the discard form keeps the letter on screen
when refused, audit rows name the job and the token, and console actions say `via console`."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from playwright.async_api import Locator, expect

from jobfence.ops.auth import create_token
from jobfence.review.deadletters import Actor

from ..deadletters.conftest import letter_params, opened, seed_letters
from ..helpers import query, scalar
from ..jobctl.test_service import fail_once, row_ids
from .conftest import Console

WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
LONG_ID = "invoice-2026-12-04-customer-000123-line-items-export"


async def lines_of(cell: Locator) -> int:
    """How many lines the browser broke ``cell``'s text into."""
    count: int = await cell.evaluate(
        "el => { const r = document.createRange(); r.selectNodeContents(el); "
        "return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; }"
    )
    return count


async def test_the_overview_fits_1400_px_with_six_categories(console: Console) -> None:
    categories = [
        "VALIDATION_ERROR",
        "BUSINESS_ERROR",
        "TEMPORARY_ERROR",
        "INTEGRATION_ERROR",
        "AUTHENTICATION_ERROR",
        "AUTHORIZATION_ERROR",
    ]
    await seed_letters(
        console.database_url,
        [
            letter_params("postgresql", f"{c}-{q}", queue=q, category=c)
            for c in categories
            for q in ("payments.settlement.eu-west-1", "emails")
        ],
    )
    await console.app.enqueue("payments.settlement.eu-west-1", {}, job_id="waiting-1")
    page = await (
        await console.browser.new_context(
            base_url=console.url, viewport={"width": 1400, "height": 900}
        )
    ).new_page()
    await page.goto("/ui/login")
    await page.fill("input[name=token]", console.tokens.viewer)
    await page.click("button[type=submit]")
    await expect(page.locator("#queues tbody tr")).to_have_count(2)
    heads = [h.replace("\u200b", "") for h in await page.locator("#queues th").all_inner_texts()]
    assert [h.replace("\n", "") for h in heads] == [
        "Queue",
        "Waiting",
        "Running",
        "Retrying",
        *sorted(categories),
        "State",
    ]
    row = page.locator("#queues tr[data-queue='payments.settlement.eu-west-1'] td")
    assert [t.strip() for t in await row.all_inner_texts()][1:] == [
        "1",
        "0",
        "0",
        *["1"] * 6,
        "active",
    ]
    await console.shot(page, "overview-six-categories")
    width = await page.evaluate("document.documentElement.scrollWidth")
    table = await page.locator("#queues").bounding_box()
    assert table is not None
    assert width <= 1400, f"the page is {width} px wide at a 1400 px window"
    assert table["x"] + table["width"] <= 1400


async def test_job_ids_stay_whole_and_delayed_jobs_say_when(console: Console) -> None:
    url = console.database_url
    await console.app.enqueue("mail", {}, job_id=LONG_ID)
    await console.app.enqueue("mail", {}, job_id="later-1", delay=timedelta(hours=2))
    await console.app.enqueue("mail", {}, job_id="now-1")
    ids = await row_ids(url)
    await fail_once(url, ids[LONG_ID], "SMTP 451 4.7.1 " + "greylisted, try again later " * 4)
    page = await console.signed_in(console.tokens.viewer)
    await page.goto("/ui/jobs")
    await expect(page.locator("#jobs tbody tr")).to_have_count(3)
    cell = page.locator(f"#jobs tr[data-job='{LONG_ID}'] td.mono")
    await expect(cell).to_have_text(LONG_ID)
    assert await lines_of(cell) == 1, "the job id broke at a hyphen"
    delayed = page.locator("#jobs tr[data-job='later-1']")
    await expect(delayed.locator(".badge")).to_have_text("delayed")
    await expect(delayed.locator("td.t")).to_have_text(re.compile(f"^{WHEN}$"))
    await expect(page.locator("#jobs tr[data-job='now-1'] .badge")).to_have_text("waiting")
    await expect(page.locator(f"#jobs tr[data-job='{LONG_ID}'] .badge")).to_have_text("retrying")
    await console.shot(page, "jobs-delayed")
    await page.goto(f"/ui/jobs/{ids['later-1']}")
    await expect(page.locator("h1 .badge")).to_have_text("delayed")
    await expect(page.locator("dl.facts")).to_contain_text("Delayed until")
    await expect(page.locator("#due")).to_have_text(re.compile(f"^{WHEN}$"))


async def test_counts_agree_with_their_nouns(console: Console) -> None:
    async def mail(job: object, tx: object) -> None:
        return None

    console.app.consumer("mail")(mail)
    await console.app.enqueue("typo.queue", {}, job_id="lost-1")
    page = await console.signed_in(console.tokens.operator)
    await expect(page.locator(".flash.warn")).to_have_text(
        "1 job waits in a queue that no consumer of this app serves."
    )
    await page.goto("/ui/queues")
    await expect(page.locator(".flash.warn")).to_have_text(
        "1 job waits in a queue that no consumer of this app serves."
    )
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "one-1")])
    await page.goto("/ui/dead-letters")
    await page.click("button[value=filter]:has-text('Replay all matching')")
    await expect(page.locator(".preview .big")).to_have_text(
        "This replay would republish 1 dead letter."
    )
    await expect(page.locator("button:has-text('Confirm')")).to_have_text(
        "Confirm: replay 1 letter"
    )
    await page.goto("/ui/dead-letters")
    await page.click("button[value=filter]:has-text('Discard all matching')")
    await expect(page.locator("button:has-text('Confirm')")).to_have_text(
        "Confirm: discard 1 letter"
    )
    await page.fill("input[name=reason]", "duplicate of one-0")
    await page.click("button:has-text('Confirm')")
    await expect(page.locator(".flash.ok")).to_have_text("1 dead letter discarded")
    assert await scalar(
        console.database_url, "SELECT status FROM core.dead_letters WHERE id = %s", (letter,)
    ) == ("discarded")


async def test_the_letter_page_has_one_time_format_with_its_zone(console: Console) -> None:
    history = [
        {
            "attempt": 1,
            "at": "2026-12-04T14:00:00.123456+00:00",
            "category": "TEMPORARY_ERROR",
            "error": "ERP answered 503",
            "retry_at": "2026-12-04T14:00:05+00:00",
        },
        {
            "attempt": 2,
            "at": "2026-12-04T15:00:05+01:00",
            "category": "TEMPORARY_ERROR",
            "error": "ERP answered 503",
        },
    ]
    params = {**letter_params("postgresql", "t-1"), "history": json.dumps(history)}
    (letter,) = await seed_letters(console.database_url, [params])
    await query(
        console.database_url,
        "UPDATE core.dead_letters SET enqueued_at = failed_at - interval '5 minutes'",
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{letter}")
    facts = dict(
        zip(
            await page.locator("dl.facts dt").all_inner_texts(),
            await page.locator("dl.facts dd").all_inner_texts(),
            strict=True,
        )
    )
    assert re.fullmatch(WHEN, facts["Enqueued"]), facts
    assert re.fullmatch(WHEN, facts["Failed"]), facts
    attempts = await page.locator("ol.attempts li p").all_inner_texts()
    assert attempts[:2] == [
        "Attempt 1 · 2026-12-04 14:00:00 UTC · TEMPORARY_ERROR · next try 2026-12-04 14:00:05 UTC",
        "Attempt 2 · 2026-12-04 14:00:05 UTC · TEMPORARY_ERROR",
    ]
    assert re.fullmatch(f"Attempt 6 · {WHEN} · TEMPORARY_ERROR", attempts[2]), attempts
    text = await page.locator("main").inner_text()
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", text), "an ISO time slipped through"


async def test_a_refused_discard_keeps_the_letter_on_screen(console: Console) -> None:
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "d-9")])
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{letter}")
    reason = page.locator("form[action$='/discard'] input[name=reason]")
    assert await reason.get_attribute("required") is not None
    await page.click("form[action$='/discard'] button")  # the browser keeps it: required
    assert await reason.evaluate("el => el.validity.valueMissing") is True
    await expect(page).to_have_url(f"{console.url}/ui/dead-letters/{letter}")
    await reason.fill("   ")  # passes the browser's check, not the server's
    async with page.expect_response(f"**/ui/dead-letters/{letter}/discard") as answer:
        await page.click("form[action$='/discard'] button")
    assert (await answer.value).status == 422
    await expect(page.locator(".flash.error")).to_contain_text("a discard needs a reason")
    await expect(page.locator("h1")).to_contain_text(f"Dead letter {letter}")
    await expect(page.locator("dl.facts")).to_contain_text("d-9")
    await expect(page.locator("pre.payload")).to_contain_text('"member_id": "d-9"')
    await console.shot(page, "letter-discard-refused")
    await page.fill("form[action$='/discard'] input[name=reason]", "order cancelled")
    await page.click("form[action$='/discard'] button")
    await expect(page.locator("h1 .badge")).to_have_text("discarded")


async def test_audit_rows_name_the_job_and_the_token(console: Console) -> None:
    url = console.database_url
    await console.app.enqueue("mail", {}, job_id="r-77")
    ids = await row_ids(url)
    await fail_once(url, ids["r-77"], "SMTP 451")
    async with opened(url) as db:
        await create_token(db, name="deploy-bot", role="viewer", actor=Actor("admin", "cli"))
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/jobs/{ids['r-77']}")
    await page.click("form[action$='/retry-now'] button")
    await expect(page.locator(".flash.ok")).to_contain_text("due now")
    await page.goto("/ui/audit")
    rows = page.locator("table.audit tbody tr")
    await expect(rows).to_have_count(2)
    retry = page.locator("table.audit tr[data-action='job.retry_now']")
    await expect(retry.locator("td.subject")).to_have_text("job r-77 in mail")
    await expect(retry.locator("td.via")).to_have_text("console")
    await expect(retry.locator("td.who")).to_have_text("otto")
    token = page.locator("table.audit tr[data-action='ops.token.create']")
    await expect(token.locator("td.subject")).to_have_text("token deploy-bot")
    await expect(token.locator("td.via")).to_have_text("cli")
    await console.shot(page, "audit-subjects")
    assert await query(url, "SELECT via, action FROM core.audit_log ORDER BY id") == [
        ("cli", "ops.token.create"),
        ("console", "job.retry_now"),
    ]
