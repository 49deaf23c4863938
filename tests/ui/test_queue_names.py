"""Issue 28, point 5, in the browser: the queues page's forms and links work for every legal
queue name — ``/``, ``%``, spaces, unicode — (the API and the CLI: tests/jobctl)."""

from __future__ import annotations

from playwright.async_api import expect

from ..helpers import query
from .conftest import Console

NAMES = ["erp/send", "100% sure", "a b/c%2Fd", "über/队列"]


async def test_pause_resume_and_links_of_any_queue_name(console: Console) -> None:
    for n, name in enumerate(NAMES):
        await console.app.enqueue(name, {}, job_id=f"job-{n}")
    page = await console.signed_in(console.tokens.operator)
    await page.goto("/ui/queues")
    for name in NAMES:
        row = page.locator(f'#queue-list tr[data-queue="{name}"]')
        await expect(row).to_contain_text("active")
        await row.locator("input[name=reason]").fill(f"pausing {name}")
        await row.locator("button").click()
        await expect(page.locator(".flash")).to_contain_text(f"Queue {name} paused")
        row = page.locator(f'#queue-list tr[data-queue="{name}"]')
        await expect(row).to_contain_text("paused")
        await expect(row).to_contain_text(f"pausing {name}")
    pauses = await query(console.database_url, "SELECT queue, reason FROM core.queue_pauses")
    assert sorted(pauses) == sorted((name, f"pausing {name}") for name in NAMES)
    await console.shot(page, "queues-odd-names")

    for n, name in enumerate(NAMES):
        await page.goto("/ui/queues")
        await page.locator(f'#queue-list tr[data-queue="{name}"] td a').first.click()
        await expect(page.locator("main")).to_contain_text(f"job-{n}")
        for other in range(len(NAMES)):
            if other != n:
                await expect(page.locator("main")).not_to_contain_text(f"job-{other}")

    await page.goto("/ui/queues")
    row = page.locator('#queue-list tr[data-queue="über/队列"]')
    await row.locator("button").click()
    await expect(page.locator('#queue-list tr[data-queue="über/队列"]')).to_contain_text("active")
    left = await query(console.database_url, "SELECT queue FROM core.queue_pauses ORDER BY queue")
    assert sorted(r[0] for r in left) == sorted(n for n in NAMES if n != "über/队列")
    assert page.errors == []  # type: ignore[attr-defined]


async def test_a_partner_scoped_user_sees_only_its_partners_queues(console: Console) -> None:
    """Issue 28, point 7: the queues page and the overview list, for a partner-scoped token,
    the queues where its partner has jobs or letters — the API's answer
    (tests/jobctl/test_queue_names.py) — never other partners' queue names."""
    console.app.consumer("globex.secret")(_noop)  # the server knows the app's queues
    await console.app.enqueue("acme.orders", {"partner_id": "acme"}, job_id="a-1")
    await console.app.enqueue("globex.secret", {"partner_id": "globex"}, job_id="g-1")
    await console.app.enqueue("shared", {"partner_id": "globex"}, job_id="g-2")
    await console.app.enqueue("shared", {"partner_id": "acme"}, job_id="a-2")
    page = await console.signed_in(console.tokens.partner_a)
    await page.goto("/ui/queues")
    rows = page.locator("#queue-list tbody tr")
    await expect(rows).to_have_count(2)
    assert [await r.get_attribute("data-queue") for r in await rows.all()] == [
        "acme.orders",
        "shared",
    ]
    await expect(page.locator("main")).not_to_contain_text("globex.secret")
    await page.goto("/ui/")
    await expect(page.locator("main")).to_contain_text("acme.orders")
    await expect(page.locator("main")).not_to_contain_text("globex.secret")
    everyone = await console.signed_in(console.tokens.operator)
    await everyone.goto("/ui/queues")
    await expect(everyone.locator("#queue-list tbody tr")).to_have_count(3)


async def _noop(job: object, tx: object) -> None:
    return None
