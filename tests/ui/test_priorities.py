"""The console shows a job's priority on its page (issue 26 §3)."""

from __future__ import annotations

from playwright.async_api import expect

from ..jobctl.test_service import row_ids
from .conftest import Console


async def test_the_job_page_shows_the_priority(console: Console) -> None:
    await console.app.enqueue("mail", {}, job_id="urgent", priority=8)
    await console.app.enqueue("mail", {}, job_id="plain")
    ids = await row_ids(console.database_url)
    page = await console.signed_in(console.tokens.viewer)
    await page.goto(f"/ui/jobs/{ids['urgent']}")
    await expect(page.locator("#priority")).to_have_text("8")
    await page.goto(f"/ui/jobs/{ids['plain']}")
    await expect(page.locator("#priority")).to_have_text("0")
