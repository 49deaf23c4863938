"""The console in a real browser: sign-in and sign-out, dead letters (filter, replay, discard,
bulk replay), what a viewer and another partner cannot do, CSRF and Origin, inert payloads.
Every outcome is checked in SQL, not only on the page."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from playwright.async_api import expect

from ..deadletters.conftest import letter_params, seed_letters
from ..helpers import query, scalar
from .conftest import Console, csrf_of, origin


async def status_of(console: Console, letter: int) -> str:
    return str(
        await scalar(
            console.database_url, "SELECT status FROM core.dead_letters WHERE id = %s", (letter,)
        )
    )


async def test_sign_in_and_sign_out(console: Console) -> None:
    """No session → the sign-in page; a wrong token is refused; the right one gives an
    HttpOnly, SameSite=Strict cookie; sign-out ends the session on the server (the old
    cookie no longer works)."""
    context = await console.context()
    page = await context.new_page()
    await page.goto("/ui/dead-letters")
    await expect(page).to_have_url(f"{console.url}/ui/login?next=/ui/dead-letters")
    await page.fill("input[name=token]", "jfo_wrong")
    await page.click("button[type=submit]")
    await expect(page.locator(".flash.error")).to_contain_text("unknown, revoked or expired")
    await console.shot(page, "signin")
    await page.fill("input[name=token]", console.tokens.operator)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(f"{console.url}/ui/dead-letters")
    await expect(page.locator("header .who")).to_contain_text("otto")
    (cookie,) = [c for c in await context.cookies() if c["name"] == "jobfence_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert console.tokens.operator not in cookie["value"]
    await page.click("text=Sign out")
    await expect(page).to_have_url(f"{console.url}/ui/login")
    async with httpx.AsyncClient(
        base_url=console.url, cookies={"jobfence_session": cookie["value"]}
    ) as client:
        stale = await client.get("/ui/")
    assert stale.status_code == 303
    assert stale.headers["location"].startswith("/ui/login")


async def test_a_revoked_token_ends_its_sessions(console: Console) -> None:
    page = await console.signed_in(console.tokens.viewer)
    await query(
        console.database_url,
        "UPDATE core.ops_tokens SET revoked_at = now() WHERE name = 'vera'",
    )
    await page.goto("/ui/dead-letters")
    await expect(page).to_have_url(f"{console.url}/ui/login?next=/ui/dead-letters")


async def test_filter_dead_letters(console: Console) -> None:
    url = console.database_url
    await seed_letters(
        url,
        [
            letter_params("postgresql", "pay-1", queue="payments", category="TEMPORARY_ERROR"),
            letter_params(
                "postgresql",
                "pay-2",
                queue="payments",
                category="VALIDATION_ERROR",
                error="ValidationError: amount must be positive",
            ),
            letter_params("postgresql", "mail-1", queue="emails", category="TEMPORARY_ERROR"),
        ],
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/dead-letters")
    await expect(page.locator("#letters tbody tr")).to_have_count(3)
    await page.fill("input[name=queue]", "payments")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("#letters tbody tr")).to_have_count(2)
    await expect(page).to_have_url(
        f"{console.url}/ui/dead-letters?status=pending_review&queue=payments&consumer=&category=&error=&job_id=&since=&until="
    )
    await page.select_option("select[name=category]", "VALIDATION_ERROR")
    await expect(page.locator("#letters tbody tr")).to_have_count(1)
    await expect(page.locator("#letters")).to_contain_text("pay-2")
    await page.fill("input[name=queue]", "")
    await page.select_option("select[name=category]", "")
    await page.fill("input[name=error]", "positive")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("#letters tbody tr")).to_have_count(1)
    await console.shot(page, "dead-letters-filtered")
    await page.fill("input[name=since]", "2030-01-02T00:00")
    await page.fill("input[name=until]", "2030-01-01T00:00")
    await page.click("form.filters button[type=submit]")  # refused: shown in place (422)
    await expect(page.locator("#results .flash.error")).to_contain_text("since must be before")
    await expect(page.locator("#letters")).to_have_count(0)
    errors = [e for e in page.errors if "422" not in e]  # type: ignore[attr-defined]
    assert errors == []  # no CSP violation, no script error


async def test_replay_one_letter(console: Console) -> None:
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "o-1")])
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{letter}")
    facts = dict(
        zip(
            await page.locator("dl.facts dt").all_inner_texts(),
            await page.locator("dl.facts dd").all_inner_texts(),
            strict=True,
        )
    )
    assert {k: facts[k] for k in ("Queue", "Consumer", "Job id", "Category", "Attempts")} == {
        "Queue": "points.credit",
        "Consumer": "points.credit",
        "Job id": "o-1",
        "Category": "TEMPORARY_ERROR TemporaryError",
        "Attempts": "6",
    }
    await expect(page.locator("pre.error").first).to_have_text("TemporaryError: ERP answered 503")
    await expect(page.locator("pre.payload")).to_contain_text('"member_id": "o-1"')
    await console.shot(page, "letter")
    await page.fill("form[action$='/replay'] input[name=reason]", "ERP is back")
    await page.click("form[action$='/replay'] button")
    await expect(page.locator(".flash.ok")).to_contain_text("published")
    await expect(page.locator("h1 .badge")).to_have_text("replayed")
    assert await status_of(console, letter) == "replayed"
    assert await query(
        console.database_url, "SELECT job_id FROM core.jobs WHERE queue = 'points.credit'"
    ) == [("o-1",)]
    assert await query(
        console.database_url,
        "SELECT actor, via, action, reason FROM core.audit_log WHERE dead_letter_id = %s",
        (letter,),
    ) == [("otto", "console", "dead_letter.replay", "ERP is back")]


async def test_discard_needs_a_reason(console: Console) -> None:
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "d-1")])
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{letter}")
    await page.fill("form[action$='/discard'] input[name=reason]", " ")
    await page.click("form[action$='/discard'] button")
    await expect(page.locator(".flash.error")).to_contain_text("a discard needs a reason")
    await expect(page.locator("h1")).to_have_text(f"Dead letter {letter} pending_review")
    assert await status_of(console, letter) == "pending_review"
    await page.fill("form[action$='/discard'] input[name=reason]", "order cancelled, OPS-7")
    await page.click("form[action$='/discard'] button")
    await expect(page.locator("h1 .badge")).to_have_text("discarded")
    assert await query(
        console.database_url,
        "SELECT status, reviewed_by, review_reason FROM core.dead_letters WHERE id = %s",
        (letter,),
    ) == [("discarded", "otto", "order cancelled, OPS-7")]


async def test_bulk_replay_preview_confirm_done(console: Console) -> None:
    """Replay everything a filter matches: the preview shows the total, the breakdown by
    queue and category, how many are already applied, and the letters themselves (ids,
    queues, job ids), and changes nothing; the confirmation runs it; the page follows it to
    done; the database agrees."""
    url = console.database_url
    ids = await seed_letters(
        url,
        [letter_params("postgresql", f"b-{i}", queue="bulk") for i in range(5)]
        + [
            letter_params("postgresql", f"b-{i}", queue="bulk", category="VALIDATION_ERROR")
            for i in (5, 6)
        ]
        + [letter_params("postgresql", "other-1", queue="other")],
    )
    await query(  # b-0 was applied meanwhile: its fence exists
        url,
        "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
        "VALUES ('bulk', 'b-0', now(), now() + interval '1 day')",
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/dead-letters?queue=bulk")
    await page.click("button[value=filter]:has-text('Replay all matching')")
    await expect(page.locator("#total")).to_have_text("7")
    rows = page.locator("#breakdown tbody tr")
    await expect(rows).to_have_count(2)
    assert [t.split("\t") for t in await rows.all_inner_texts()] == [
        ["bulk", "TEMPORARY_ERROR", "5", "1", "0"],
        ["bulk", "VALIDATION_ERROR", "2", "0", "0"],
    ]
    await expect(page.locator("#applied")).to_have_text(
        "1 of them was applied meanwhile (the job_id is fenced): marked replayed without "
        "being republished."
    )
    letters = page.locator("#replay-items tbody tr")
    await expect(letters).to_have_count(7)
    assert await letters.locator("td.mono").all_inner_texts() == [f"b-{i}" for i in range(7)]
    links = await letters.locator("a").evaluate_all("els => els.map(e => e.textContent)")
    assert links == [str(i) for i in ids[:7]]
    await expect(page.locator("nav a")).to_have_count(9)  # the navigation is intact too
    await console.shot(page, "bulk-replay-preview")
    assert await scalar(url, "SELECT count(*) FROM core.jobs") == 0
    await page.fill("input[name=rate]", "4")  # slow enough to watch it run
    await page.click("text=Confirm: replay 7 letters")
    await expect(page.locator("#replay-state")).to_have_text("running")
    await page.evaluate("window.sameDocument = true")  # progress comes without a reload
    await expect(page.locator("#replay-state")).to_have_text("done", timeout=20_000)
    assert await page.evaluate("window.sameDocument") is True
    await expect(page.locator("td[data-outcome=published]")).to_have_text("6")
    await expect(page.locator("td[data-outcome=already_applied]")).to_have_text("1")
    await console.shot(page, "bulk-replay-done")
    assert await query(
        url,
        "SELECT queue, status, count(*) FROM core.dead_letters GROUP BY 1, 2 ORDER BY 1",
    ) == [("bulk", "replayed", 7), ("other", "pending_review", 1)]
    assert await scalar(url, "SELECT count(*) FROM core.jobs WHERE queue = 'bulk'") == 6


async def test_bulk_replay_of_selected_letters(console: Console) -> None:
    ids = await seed_letters(
        console.database_url, [letter_params("postgresql", f"s-{i}") for i in range(4)]
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/dead-letters")
    for letter in ids[:2]:
        await page.check(f"input[name=ids][value='{letter}']")
    await page.click("button[value=selected]:has-text('Replay selected')")
    await expect(page.locator("#total")).to_have_text("2")
    await expect(page.locator("#breakdown tbody tr")).to_have_text(
        ["points.credit TEMPORARY_ERROR 2 0 0"], use_inner_text=True
    )
    assert await page.locator("#replay-items td.mono").all_inner_texts() == ["s-0", "s-1"]
    await page.click("text=Confirm: replay 2 letters")
    await expect(page.locator("#replay-state")).to_have_text("done", timeout=20_000)
    assert await query(
        console.database_url,
        "SELECT id FROM core.dead_letters WHERE status = 'replayed' ORDER BY id",
    ) == [(i,) for i in sorted(ids[:2])]


async def test_a_viewer_cannot_act(console: Console) -> None:
    """No control is shown to a viewer, and a forged POST (right cookie, right CSRF token,
    right Origin) is refused with 403 all the same; nothing changes."""
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "v-1")])
    page = await console.signed_in(console.tokens.viewer)
    await page.goto("/ui/dead-letters")
    await expect(page.locator("#letters tbody tr")).to_have_count(1)
    await expect(page.locator("input[name=ids]")).to_have_count(0)
    await expect(page.locator("button:has-text('Replay')")).to_have_count(0)
    await page.goto(f"/ui/dead-letters/{letter}")
    await expect(page.locator("form[action$='/replay']")).to_have_count(0)
    await expect(page.locator("form[action$='/discard']")).to_have_count(0)
    await console.shot(page, "viewer-letter")
    token = await csrf_of(page)
    for action, form in (("replay", {}), ("discard", {"reason": "forged"})):
        r = await page.request.post(
            f"/ui/dead-letters/{letter}/{action}",
            form={**form, "csrf": token},
            headers={"Origin": origin(console.url)},
        )
        assert r.status == 403, await r.text()
    r = await page.request.post(
        "/ui/replays",
        form={"csrf": token, "scope": "filter"},
        headers={"Origin": origin(console.url)},
    )
    assert r.status == 403
    assert await status_of(console, letter) == "pending_review"
    assert await scalar(console.database_url, "SELECT count(*) FROM core.audit_log") == 0


async def test_cross_site_posts_are_refused(console: Console) -> None:
    """A page on another origin auto-submitting a form to the console: the browser does not
    send the SameSite=Strict cookie, so nothing happens. And with the cookie (as an older
    browser might send it), a POST without the CSRF token, or from another Origin, is 403."""
    (letter,) = await seed_letters(console.database_url, [letter_params("postgresql", "x-1")])
    page = await console.signed_in(console.tokens.operator)
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from ..deadletters.conftest import serve

    target = f"{console.url}/ui/dead-letters/{letter}/discard"

    async def evil(request: object) -> HTMLResponse:
        return HTMLResponse(
            f'<form id="f" method="post" action="{target}"><input name="reason" value="pwned">'
            "<button>win a prize</button></form>"
        )

    async with serve(Starlette(routes=[Route("/", evil)])) as evil_url:
        other = await page.context.new_page()
        await other.goto(evil_url)
        await other.click("text=win a prize")
        await other.wait_for_load_state()
        assert "/ui/" in other.url
    assert await status_of(console, letter) == "pending_review"

    token = await csrf_of(page)
    here = origin(console.url)
    for form, headers in (
        ({"reason": "no token"}, {"Origin": here}),
        ({"reason": "stale", "csrf": "not-the-token"}, {"Origin": here}),
        ({"reason": "other site", "csrf": token}, {"Origin": "https://evil.example"}),
    ):
        r = await page.request.post(
            f"/ui/dead-letters/{letter}/discard", form=form, headers=headers
        )
        assert r.status == 403, (form, headers, await r.text())
    assert await status_of(console, letter) == "pending_review"


async def test_hostile_payloads_are_rendered_inert(console: Console) -> None:
    """A payload with <script> and an attribute break-out is shown as text, runs nothing;
    binary payloads are hex with their size; a large one is cut with a download link."""
    hostile = {
        "partner_note": "<script>window.pwned = 1</script>",
        "name": '"><img src=x onerror="window.pwned=2">',
    }
    raw = json.dumps(hostile).encode()
    binary = bytes(range(256)) * 2
    big = b"A" * (200 * 1024)
    hostile_id, binary_id, big_id = await seed_letters(
        console.database_url,
        [
            letter_params(
                "postgresql", "h-1", payload=raw, error='<img src=x onerror="window.pwned=3">'
            ),
            letter_params("postgresql", "bin-1", payload=binary),
            letter_params("postgresql", "big-1", payload=big),
        ],
    )
    page = await console.signed_in(console.tokens.operator)
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    await page.goto("/ui/dead-letters")
    await page.goto(f"/ui/dead-letters/{hostile_id}")
    await expect(page.locator("pre.payload")).to_contain_text("<script>window.pwned = 1</script>")
    await expect(page.locator("pre.payload")).to_contain_text('"><img src=x onerror=')
    await expect(page.locator("pre.error").first).to_contain_text("<img src=x")
    assert await page.evaluate("typeof window.pwned") == "undefined"
    assert await page.locator("main img").count() == 0
    assert await page.locator("main script").count() == 0
    await console.shot(page, "letter-hostile-payload")
    assert dialogs == []

    await page.goto(f"/ui/dead-letters/{binary_id}")
    await expect(page.locator("h2:has-text('Payload')")).to_contain_text("512 B")
    await expect(page.locator("pre.hex")).to_contain_text("00000000  00 01 02 03")
    await page.goto(f"/ui/dead-letters/{big_id}")
    await expect(page.locator("text=Only the first 64 KiB are shown")).to_be_visible()
    async with page.expect_download() as download:
        await page.click("text=Download the payload")
    saved = await (await download.value).path()
    assert saved is not None
    assert await asyncio.to_thread(saved.read_bytes) == big


async def test_another_partners_letters_are_invisible(console: Console) -> None:
    acme, globex = await seed_letters(
        console.database_url,
        [
            letter_params("postgresql", "a-1", payload=b'{"partner_id": "acme", "po": 1}'),
            letter_params(
                "postgresql",
                "g-1",
                payload=b'{"partner_id": "globex", "po": 2}',
                category="VALIDATION_ERROR",
            ),
        ],
    )
    page = await console.signed_in(console.tokens.partner_a)
    await expect(page.locator("#queues")).not_to_contain_text("VALIDATION_ERROR")
    await page.goto("/ui/dead-letters")
    await expect(page.locator("#letters tbody tr")).to_have_count(1)
    await expect(page.locator("#letters")).to_contain_text("a-1")
    await expect(page.locator("#letters")).not_to_contain_text("g-1")
    response = await page.goto(f"/ui/dead-letters/{globex}")
    assert response is not None
    assert response.status == 404
    response = await page.goto(f"/ui/dead-letters/{globex}/payload")
    assert response is not None
    assert response.status == 404
    await expect(page.locator("nav")).not_to_contain_text("Outbox")
    response = await page.goto("/ui/outbox")
    assert response is not None
    assert response.status == 403
    response = await page.goto(f"/ui/dead-letters/{acme}")
    assert response is not None
    assert response.status == 200

    await console.app.enqueue("orders", {"partner_id": "acme"}, job_id="job-acme")
    await console.app.enqueue("orders", {"partner_id": "globex"}, job_id="job-globex")
    rows = dict(await query(console.database_url, "SELECT job_id, id FROM core.jobs"))
    await page.goto("/ui/jobs")
    await expect(page.locator("#jobs tbody tr")).to_have_count(1)
    await expect(page.locator("#jobs")).to_contain_text("job-acme")
    response = await page.goto(f"/ui/jobs/{rows['job-globex']}")
    assert response is not None
    assert response.status == 404
    await page.goto("/ui/queues")
    await expect(page.locator("tr[data-queue=orders]")).to_contain_text("1")
    await expect(page.locator("tr[data-queue=orders] button")).to_have_count(0)


async def test_a_real_failure_shows_its_traceback(console: Console) -> None:
    """A worker's handler fails for good; the letter's page shows the attempt's traceback
    (the frames, down to the function that raised)."""
    from jobfence import App, Job, NonRetryableError, Tx

    from ..helpers import RunningWorker, eventually

    worker_app = App(console.database_url)

    def charge_card(order: str) -> None:
        raise NonRetryableError(f"card declined for {order}")

    @worker_app.consumer("payments")
    async def pay(job: Job[Any], tx: Tx) -> None:
        charge_card(job.job_id)

    await console.app.enqueue("payments", {"amount": 5}, job_id="order-77")
    async with worker_app, RunningWorker(worker_app, poll_interval=0.2):
        letter = await eventually(
            lambda: scalar(console.database_url, "SELECT max(id) FROM core.dead_letters"),
            what="the dead letter",
        )
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{letter}")
    await page.click("summary:has-text('Traceback')")
    trace = page.locator("pre.trace")
    await expect(trace).to_contain_text("charge_card")
    await expect(trace).to_contain_text("card declined for order-77")
    await console.shot(page, "letter-traceback")
