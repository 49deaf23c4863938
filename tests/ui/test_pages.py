"""The console's other pages in the browser: the overview (queues, the last hour's chart drawn
from the database), the outbox (states, re-drive), the audit log's filters, Swagger UI behind
the sign-in, keyset pages; and the same pages served over SQLite (no browser needed)."""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.async_api import expect

from jobfence import App
from jobfence.ops.app import create_app

from ..deadletters.conftest import letter_params, make_tokens, seed_letters, serve
from ..helpers import query, scalar
from .conftest import Console


async def test_overview_counts_and_the_last_hour(console: Console) -> None:
    url = console.database_url
    await seed_letters(
        url,
        [letter_params("postgresql", f"p-{i}", queue="payments") for i in range(3)]
        + [letter_params("postgresql", "v-1", queue="payments", category="VALIDATION_ERROR")],
    )
    for n in range(4):
        await console.app.enqueue("emails", {"n": n}, job_id=f"e-{n}")
    await query(
        url,
        "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
        "SELECT 'emails', 'done-' || g, now() - (g %% 30) * interval '1 minute', "
        "now() + interval '1 day' FROM generate_series(1, 90) AS g",
    )
    page = await console.signed_in(console.tokens.operator)
    row = page.locator("#queues tr[data-queue=payments]")
    await expect(row).to_contain_text("3")
    await expect(page.locator("#queues tr[data-queue=emails]")).to_contain_text("4")
    await expect(page.locator(".legend")).to_contain_text("90 done")
    await expect(page.locator(".legend")).to_contain_text("4 dead-lettered")
    assert await page.locator("svg.chart rect.done").count() == 30
    assert await page.locator("svg.chart rect.fail").count() >= 1
    await console.shot(page, "overview")
    assert page.errors == []  # type: ignore[attr-defined]


async def test_audit_log_filters(console: Console) -> None:
    url = console.database_url
    a, b = await seed_letters(
        url, [letter_params("postgresql", "au-1"), letter_params("postgresql", "au-2")]
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto(f"/ui/dead-letters/{a}")
    await page.fill("form[action$='/discard'] input[name=reason]", "duplicate")
    await page.click("form[action$='/discard'] button")
    await page.goto(f"/ui/dead-letters/{b}")
    await page.click("form[action$='/replay'] button")
    await page.goto("/ui/audit")
    await expect(page.locator("table.audit tbody tr")).to_have_count(2)
    assert await page.locator("table.audit td.subject").all_inner_texts() == [
        f"dead letter {b}",
        f"dead letter {a}",
    ]
    assert await page.locator("table.audit td.via").all_inner_texts() == ["console", "console"]
    await page.fill("input[name=action]", "dead_letter.discard")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("table.audit tbody tr")).to_have_count(1)
    cells = await page.locator("table.audit tbody tr td").all_inner_texts()
    assert [c.strip() for c in cells[1:]] == [
        "otto",
        "console",
        "dead_letter.discard",
        f"dead letter {a}",
        "pending_review → discarded",
        "duplicate",
    ]
    await page.fill("input[name=action]", "dead_letter.")
    await page.fill("input[name=actor]", "otto")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("table.audit tbody tr")).to_have_count(2)
    await console.shot(page, "audit")
    await page.fill("input[name=actor]", "nobody")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("table.audit tbody tr")).to_have_count(0)
    await page.goto("/ui/audit?since=2999-01-01T00:00")
    await expect(page.locator("table.audit tbody tr")).to_have_count(0)
    await page.goto("/ui/audit?since=2000-01-01T00:00&until=2999-01-01T00:00")
    await expect(page.locator("table.audit tbody tr")).to_have_count(2)


async def test_outbox_states_and_redrive(console: Console) -> None:
    url = console.database_url
    await query(
        url,
        "INSERT INTO core.outbox (event_id, queue, payload, state, attempts, last_error) "
        "SELECT 'ev-' || g, 'orders.events', '{}'::bytea, "
        "CASE WHEN g <= 2 THEN 'PUBLISH_FAILED_RETRY' ELSE 'PENDING' END, "
        "CASE WHEN g <= 2 THEN 5 ELSE 0 END, "
        "CASE WHEN g <= 2 THEN 'broker unreachable' END FROM generate_series(1, 3) AS g",
    )
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/outbox")
    await expect(page.locator(".counts")).to_contain_text("PUBLISH_FAILED_RETRY: 2")
    await page.check("input[name=event_ids][value=ev-1]")
    await page.fill("input[name=reason]", "broker back")
    await console.shot(page, "outbox")
    await page.click("text=Re-drive selected")
    await expect(page.locator(".flash.ok")).to_have_text("1 event re-driven")
    assert await query(url, "SELECT event_id, state FROM core.outbox ORDER BY id") == [
        ("ev-1", "PENDING"),
        ("ev-2", "PUBLISH_FAILED_RETRY"),
        ("ev-3", "PENDING"),
    ]


async def test_swagger_ui_behind_the_sign_in(console: Console) -> None:
    context = await console.context()
    anonymous = await context.new_page()
    response = await anonymous.goto("/ui/api/openapi.json")
    assert response is not None
    assert anonymous.url.startswith(f"{console.url}/ui/login")
    page = await console.signed_in(console.tokens.viewer)
    await page.goto("/ui/api")
    await expect(page.locator(".swagger-ui .title")).to_contain_text("jobfence ops API")
    await expect(page.locator(".swagger-ui")).to_contain_text("/v1/dead-letters")
    await console.shot(page, "api")
    assert [e for e in page.errors if "Content Security Policy" in e] == []  # type: ignore[attr-defined]


async def test_dead_letter_pages_follow_the_keyset(console: Console) -> None:
    url = console.database_url
    await seed_letters(url, [letter_params("postgresql", f"k-{i:03}") for i in range(120)])
    page = await console.signed_in(console.tokens.viewer)
    await page.goto("/ui/dead-letters")
    seen: list[str] = []
    while True:
        seen += await page.locator("#letters tbody tr td.mono").all_inner_texts()
        more = page.locator("a[rel=next]")
        if await more.count() == 0:
            break
        await more.click()
        await expect(page).to_have_url(re.compile(r"before=\d+"))
    assert sorted(seen) == [f"k-{i:03}" for i in range(120)]
    assert len(seen) == 120


async def test_the_console_over_sqlite(sqlite_database: str) -> None:
    """Every page renders over SQLite too (its own SQL); the checks hold there as well."""
    url = sqlite_database
    tokens = await make_tokens(url)
    (letter,) = await seed_letters(url, [letter_params("sqlite", "lite-1")])
    app = App(url)
    async with serve(create_app(jobfence_app=app)) as base:
        await app.enqueue("mail", {}, job_id="j-1")
        async with httpx.AsyncClient(base_url=base, headers={"Origin": base}) as client:
            signin = await client.post("/ui/login", data={"token": tokens.operator})
            assert signin.status_code == 303
            for path, shown in (
                ("/ui/", ['data-queue="mail"', 'data-queue="points.credit"']),
                ("/ui/dead-letters", ["lite-1", "TEMPORARY_ERROR"]),
                (f"/ui/dead-letters/{letter}", ["lite-1", "ERP answered 503", " UTC<"]),
                ("/ui/jobs", ['data-job="j-1"', ">waiting<"]),
                ("/ui/queues", ['data-queue="mail"']),
                ("/ui/outbox", ["Outbox"]),
                ("/ui/audit?action=dead_letter.&since=2000-01-01T00:00", ["Nothing recorded"]),
                ("/ui/api", ["swagger-ui"]),
            ):
                r = await client.get(path)
                assert r.status_code == 200, (path, r.text[:500])
                for text in shown:
                    assert text in r.text, (path, text)
            csrf = re.search(r'name="csrf" value="([^"]+)"', r.text)
            assert csrf
            r = await client.post(
                f"/ui/dead-letters/{letter}/discard", data={"reason": "x", "csrf": "wrong"}
            )
            assert r.status_code == 403
            r = await client.post(
                f"/ui/dead-letters/{letter}/discard",
                data={"reason": "dup", "csrf": csrf.group(1)},
            )
            assert r.status_code == 303
            audit = await client.get("/ui/audit")
            assert "dead letter " + str(letter) in audit.text
            assert '<td class="via">console</td>' in audit.text
    await app.close()
    assert await scalar(url, "SELECT status FROM core_dead_letters") == "discarded"
    assert await scalar(url, "SELECT via FROM core_audit_log") == "console"


async def test_a_session_expires(pg_database: str) -> None:
    """A sign-in lasts --session-ttl at most: then every page sends you to sign in again."""
    from datetime import timedelta

    from ..helpers import eventually

    tokens = await make_tokens(pg_database)
    app = App(pg_database)
    api = create_app(jobfence_app=app, session_ttl=timedelta(seconds=1))
    async with (
        serve(api) as base,
        httpx.AsyncClient(base_url=base, headers={"Origin": base}) as client,
    ):
        signin = await client.post("/ui/login", data={"token": tokens.viewer})
        assert signin.status_code == 303
        assert "Max-Age=1;" in signin.headers["set-cookie"]
        assert (await client.get("/ui/")).status_code == 200

        async def signed_out() -> bool:
            r = await client.get("/ui/audit")
            return r.status_code == 303 and r.headers["location"].startswith("/ui/login")

        await eventually(signed_out, timeout=10, what="the session to expire")
    await app.close()


async def test_static_files_are_gzipped_and_pages_are_not(sqlite_database: str) -> None:
    """CSS and JavaScript go gzipped to clients that accept it; pages (they carry the CSRF
    token beside text a link chooses) never are, so their sizes leak nothing (BREACH)."""
    tokens = await make_tokens(sqlite_database)
    app = App(sqlite_database)
    async with (
        serve(create_app(jobfence_app=app)) as base,
        httpx.AsyncClient(base_url=base, headers={"Origin": base}) as client,
    ):
        await client.post("/ui/login", data={"token": tokens.viewer})
        gzip = {"Accept-Encoding": "gzip"}
        script = await client.get("/ui/static/vendor/htmx.min.js", headers=gzip)
        plain = await client.get("/ui/static/vendor/htmx.min.js", headers={"Accept-Encoding": ""})
        html = await client.get("/ui/dead-letters?queue=anything", headers=gzip)
    await app.close()
    assert script.headers["content-encoding"] == "gzip"
    assert int(script.headers["content-length"]) < len(script.content) / 2  # decoded by httpx
    assert script.content == plain.content
    assert "content-encoding" not in plain.headers
    assert html.status_code == 200
    assert "content-encoding" not in html.headers


async def test_overview_refreshes_share_recent_counts(pg_database: str) -> None:
    """The automatic refresh reuses counts made within `reuse` seconds (for every open tab);
    opening the page counts afresh."""
    tokens = await make_tokens(pg_database)
    app = App(pg_database)
    api = create_app(jobfence_app=app)
    api.state.ui_refreshes.reuse = 3600.0
    async with (
        serve(api) as base,
        httpx.AsyncClient(base_url=base, headers={"Origin": base}) as client,
    ):
        await client.post("/ui/login", data={"token": tokens.viewer})
        await app.enqueue("mail", {}, job_id="one")

        def waiting(html: str) -> str:
            found = re.search(r'data-queue="mail">.*?<td class="n">(\d+)</td>', html, re.S)
            assert found, html[:2000]
            return found.group(1)

        assert waiting((await client.get("/ui/")).text) == "1"
        await app.enqueue("mail", {}, job_id="two")
        panel = await client.get("/ui/overview-panel", headers={"HX-Request": "true"})
        assert waiting(panel.text) == "1"  # the refresh reused the page's counts
        assert waiting((await client.get("/ui/")).text) == "2"
        api.state.ui_refreshes.reuse = 0.0
        await app.enqueue("mail", {}, job_id="three")
        assert waiting((await client.get("/ui/overview-panel")).text) == "3"
    await app.close()


async def test_jobs_nobody_serves_are_counted(console: Console) -> None:
    """With the app's consumers known (ops serve --app), jobs in a queue none of them takes
    are counted on the overview and the queue is marked on the queues page."""

    async def mail(job: Any, tx: Any) -> None:
        return None

    console.app.consumer("mail")(mail)
    await console.app.enqueue("mail", {}, job_id="served-1")
    await console.app.enqueue("typo.queue", {}, job_id="lost-1")
    await console.app.enqueue("typo.queue", {}, job_id="lost-2")
    page = await console.signed_in(console.tokens.viewer)
    await expect(page.locator(".flash.warn")).to_contain_text(
        "2 jobs wait in queues that no consumer of this app serves"
    )
    await page.goto("/ui/queues")
    await expect(page.locator("tr[data-queue='typo.queue']")).to_contain_text("unserved")
    await expect(page.locator("tr[data-queue=mail]")).not_to_contain_text("unserved")
