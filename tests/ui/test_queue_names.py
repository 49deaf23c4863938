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
