"""Flow control on the console's queues page (issue 26 §5): each limited queue's limit, how
full each key is, what waits on it and why, the held keys; an operator pauses one key and
resumes another (CSRF like the queue pause); a viewer sees the numbers without the buttons.
Outcomes checked in SQL."""

from __future__ import annotations

import re

from playwright.async_api import expect

from ..flow.test_operators import LIMIT, _noop, seed
from ..helpers import query
from .conftest import Console, csrf_of, origin


async def test_the_queues_page_shows_each_key_and_an_operator_pauses_one(
    console: Console,
) -> None:
    url = console.database_url
    console.app.consumer("orders", limit=LIMIT)(_noop)
    await seed(console.app, url)
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/queues")
    section = page.locator("section[data-flow-queue=orders]")
    await expect(section.locator(".limit")).to_have_text("2 at once, 10 per 0:01:00, per partner")
    await expect(section.locator(".in-use")).to_have_text("2")
    await expect(section.locator(".deferred")).to_have_text("5")
    await expect(section.locator(".unkeyed")).to_have_text("0")
    expected = {
        "acme": ("2 / 2", "0 / 10", "2", "concurrency full"),
        "globex": ("0 / 2", "3 / 10", "2", "paused"),
        "initech": ("0 / 2", "0 / 10", "1", "backing off"),
    }
    await expect(section.locator("table.flow-keys tbody tr")).to_have_count(3)
    for key, (running, starts, waiting, state) in expected.items():
        r = section.locator(f"table.flow-keys tr[data-key={key}]")
        await expect(r.locator(".running")).to_have_text(running)
        await expect(r.locator(".starts")).to_have_text(starts)
        await expect(r.locator(".waiting")).to_have_text(waiting)
        await expect(r.locator(".state")).to_have_text(state)
    holds = section.locator("table.flow-holds")
    await expect(holds.locator("tbody tr")).to_have_count(2)
    await expect(holds.locator("tr[data-key=globex] .for")).to_have_text("until resumed")
    await expect(holds.locator("tr[data-key=globex]")).to_contain_text("otto")
    await expect(holds.locator("tr[data-key=globex]")).to_contain_text("outage")
    await expect(holds.locator("tr[data-key=initech] .for")).to_have_text(
        re.compile(r"^1[01]\d s more$")
    )
    await expect(holds.locator("tr[data-key=initech]")).to_contain_text("partner 429")
    await console.shot(page, "queues-flow")
    assert page.errors == []  # type: ignore[attr-defined]

    # a forged pause (no CSRF token) is refused and changes nothing
    forged = await page.request.post(
        f"{console.url}/ui/flow/pause-key",
        form={"queue": "orders", "key": "acme"},
        headers={"Origin": origin(console.url)},
        max_redirects=0,
        timeout=10_000,
    )
    assert forged.status == 403
    assert await query(url, "SELECT count(*) FROM core.flow_holds WHERE key = 'acme'") == [(0,)]
    assert await csrf_of(page)

    # pause acme from its row, with a reason
    acme = section.locator("table.flow-keys tr[data-key=acme]")
    await acme.locator("input[name=reason]").fill("too many errors")
    await acme.locator("button").click()
    await expect(page.locator(".flash.ok")).to_contain_text("Key acme of queue orders paused")
    await expect(section.locator("table.flow-keys tr[data-key=acme] .state")).to_have_text("paused")
    await expect(section.locator(".deferred")).to_have_text("5")
    # resume globex from the holds table
    await section.locator("table.flow-holds tr[data-key=globex] button").click()
    await expect(page.locator(".flash.ok")).to_contain_text("Key globex of queue orders resumed")
    await expect(section.locator("table.flow-keys tr[data-key=globex] .state")).to_have_text(
        "has room"
    )
    await expect(section.locator(".deferred")).to_have_text("3")  # acme 2 + initech 1
    # and pause a key that has no jobs yet, by name
    form = section.locator("form.pause-key")
    await form.locator("input[name=key]").fill("umbrella")
    await form.locator("input[name=reason]").fill("contract ended")
    await form.locator("button").click()
    await expect(page.locator(".flash.ok")).to_contain_text("Key umbrella of queue orders paused")
    await expect(section.locator("table.flow-holds tr[data-key=umbrella]")).to_contain_text(
        "contract ended"
    )
    holds_now = await query(
        url, "SELECT key, kind, held_by FROM core.flow_holds WHERE queue = 'orders' ORDER BY key"
    )
    assert [tuple(h) for h in holds_now] == [
        ("acme", "pause", "otto"),
        ("initech", "backoff", "w1"),
        ("umbrella", "pause", "otto"),
    ]
    audit = await query(url, "SELECT action, actor, via, reason FROM core.audit_log ORDER BY id")
    assert [tuple(a) for a in audit][1:] == [
        ("key.pause", "otto", "console", "too many errors"),
        ("key.resume", "otto", "console", None),
        ("key.pause", "otto", "console", "contract ended"),
    ]


async def test_a_viewer_sees_the_flow_without_the_buttons(console: Console) -> None:
    console.app.consumer("orders", limit=LIMIT)(_noop)
    await seed(console.app, console.database_url)
    page = await console.signed_in(console.tokens.viewer)
    await page.goto("/ui/queues")
    section = page.locator("section[data-flow-queue=orders]")
    await expect(section.locator("table.flow-keys tr[data-key=acme] .running")).to_have_text(
        "2 / 2"
    )
    await expect(section.locator("form")).to_have_count(0)
