"""Two replicas of `jobfence ops serve` behind one address with no session affinity (as the
Kubernetes manifests run it): a browser signs in through one, acts with its CSRF token through
the other, and signing out ends the session on both. Real server processes, a round-robin
proxy that sends each request to the next replica."""

from __future__ import annotations

from pathlib import Path

import httpx
from playwright.async_api import Browser, expect

from ..deadletters.conftest import letter_params, make_tokens, seed_letters
from ..helpers import query
from ..ops_servers import RoundRobinProxy, ops_servers
from .conftest import csrf_of


async def test_sessions_work_across_two_replicas(
    pg_database: str, chromium: Browser, tmp_path: Path
) -> None:
    url = pg_database
    tokens = await make_tokens(url)
    first, second, third = await seed_letters(
        url, [letter_params("postgresql", f"rr-{i}", queue="orders") for i in range(3)]
    )
    async with (
        ops_servers(url, tmp_path, 2) as (a, b),
        RoundRobinProxy([a.port, b.port]) as proxy,
    ):
        context = await chromium.new_context(base_url=proxy.url)
        page = await context.new_page()
        await page.goto("/ui/login")
        await page.fill("input[name=token]", tokens.operator)
        await page.click("button[type=submit]")
        await page.wait_for_url("**/ui/")
        await expect(page.locator("header .who")).to_contain_text("otto")
        await expect(page.locator("#queues tr[data-queue=orders]")).to_contain_text("3")
        for letter, why in ((first, "duplicate order"), (second, "test order")):
            await page.goto(f"/ui/dead-letters/{letter}")
            await expect(page.locator("dl.facts")).to_contain_text(f"rr-{letter - first}")
            await page.fill("form[action$='/discard'] input[name=reason]", why)
            await page.click("form[action$='/discard'] button")
            await expect(page.locator("h1 .badge")).to_have_text("discarded")
            await expect(page.locator(".flash.ok")).to_have_text(f"Dead letter {letter} discarded")
        assert proxy.backends_of("GET /ui") == {0, 1}, proxy.requests
        assert proxy.backends_of("POST /ui") == {0, 1}, proxy.requests

        # the same session, asked for by name on each replica: the one that did not sign it
        # in takes its cookie and its CSRF token
        (login,) = [i for i, line in proxy.requests if line.startswith("POST /ui/login")]
        other = (a, b)[1 - login]
        cookie = {c["name"]: c["value"] for c in await context.cookies()}["jobfence_session"]
        csrf = await csrf_of(page)
        async with httpx.AsyncClient(
            base_url=other.url, cookies={"jobfence_session": cookie}, headers={"Origin": other.url}
        ) as client:
            shown = await client.get(f"/ui/dead-letters/{third}")
            assert shown.status_code == 200
            assert "rr-2" in shown.text
            done = await client.post(
                f"/ui/dead-letters/{third}/discard", data={"reason": "via the other", "csrf": csrf}
            )
            assert done.status_code == 303, done.text
        assert await query(
            url, "SELECT id, status, review_reason FROM core.dead_letters ORDER BY id"
        ) == [
            (first, "discarded", "duplicate order"),
            (second, "discarded", "test order"),
            (third, "discarded", "via the other"),
        ]

        await page.click("text=Sign out")
        await expect(page).to_have_url(f"{proxy.url}/ui/login")
        for server in (a, b):
            async with httpx.AsyncClient(
                base_url=server.url, cookies={"jobfence_session": cookie}
            ) as client:
                stale = await client.get("/ui/")
            assert stale.status_code == 303, server.url
            assert stale.headers["location"].startswith("/ui/login")
        await context.close()
    assert await query(url, "SELECT via, count(*) FROM core.audit_log GROUP BY via") == [
        ("console", 3)
    ]
