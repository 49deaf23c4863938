"""The calls page in the browser: the in-doubt calls of parked jobs (job, step, key, age, last
error), a partner's token seeing only its own, and a settle through the form (reason
required, CSRF) that replays the parked job. Outcomes checked in SQL."""

from __future__ import annotations

import re

from playwright.async_api import expect

from jobfence.calls import default_key

from ..calls.support import STEP, Orders
from ..helpers import query
from .conftest import Console


async def test_calls_page_lists_in_doubt_calls_and_settles_one(console: Console) -> None:
    url = console.database_url
    orders = Orders(url)
    async with orders.app:
        await orders.park({"po-1": "acme", "po-2": None})
    ids = dict(await query(url, "SELECT job_id, id FROM core.calls"))
    page = await console.signed_in(console.tokens.operator)
    await page.click("header nav a[href='/ui/calls']")
    await page.wait_for_url("**/ui/calls")
    await expect(page.locator("header nav a.here")).to_have_text("Calls")
    rows = page.locator("#calls tbody tr")
    await expect(rows).to_have_count(2)
    first = page.locator(f"#calls tr[data-call='{ids['po-1']}']")
    await expect(first).to_contain_text("po-1")
    await expect(first).to_contain_text(STEP)
    await expect(first).to_contain_text(default_key("po-1", STEP))
    await expect(first).to_contain_text("in_doubt")
    await expect(first).to_contain_text("read timeout after the request was sent")
    await expect(first.locator("td.n")).to_have_text(re.compile(r"^\d+s$"))  # its age
    await console.shot(page, "calls")

    await page.click(f"a[href='/ui/calls/{ids['po-1']}']")
    await expect(page.locator("#key")).to_have_text(default_key("po-1", STEP))
    await expect(page.locator("a[href^='/ui/dead-letters/']")).to_be_visible()
    await page.fill("#settle input[name=reference]", "PO-1")
    await page.click("#settle button")  # no reason: refused, nothing changes
    await expect(page.locator(".flash.error")).to_contain_text("needs a reason")
    assert await query(url, "SELECT state FROM core.calls WHERE job_id = 'po-1'") == [("in_doubt",)]
    await page.goto(f"/ui/calls/{ids['po-1']}")
    await page.select_option("#settle select[name=outcome]", "applied")
    await page.fill("#settle input[name=reference]", "PO-1")
    await page.fill("#settle input[name=reason]", "PO-1 found in the ERP by its key, OPS-9")
    await console.shot(page, "call")
    await page.click("#settle button")
    await expect(page.locator(".flash.ok")).to_contain_text("settled as applied")
    await expect(page.locator(".flash.ok")).to_contain_text("replayed")
    await expect(page.locator("h1 .badge")).to_have_text("applied")
    await expect(page.locator("#reference")).to_have_text("PO-1")
    await expect(page.locator("#settle")).to_have_count(0)
    assert await query(
        url, "SELECT state, reference, settled_by, settled_reason FROM core.calls "
        "WHERE job_id = 'po-1'",
    ) == [("applied", "PO-1", "otto", "PO-1 found in the ERP by its key, OPS-9")]  # fmt: skip
    assert await query(url, "SELECT job_id FROM core.jobs") == [("po-1",)]
    assert await query(url, "SELECT action FROM core.audit_log ORDER BY id") == [
        ("dead_letter.replay",),
        ("call.settle",),
    ]
    await page.goto("/ui/calls")
    await expect(rows).to_have_count(1)
    # no script or CSP error; the one failed load is the refused settle's 422 page
    errors = page.errors  # type: ignore[attr-defined]
    assert [e for e in errors if "status of 422" not in e] == []


async def test_a_viewer_sees_no_form_and_a_partner_only_its_calls(console: Console) -> None:
    url = console.database_url
    orders = Orders(url)
    async with orders.app:
        await orders.park({"po-1": "acme", "po-2": "globex"})
    ids = dict(await query(url, "SELECT job_id, id FROM core.calls"))
    viewer = await console.signed_in(console.tokens.viewer)
    await viewer.goto(f"/ui/calls/{ids['po-1']}")
    await expect(viewer.locator("h1 .badge")).to_have_text("in_doubt")
    await expect(viewer.locator("#settle")).to_have_count(0)
    acme = await console.signed_in(console.tokens.partner_a)
    await acme.goto("/ui/calls")
    await expect(acme.locator("#calls tbody tr")).to_have_count(1)
    await expect(acme.locator("#calls")).to_contain_text("po-1")
    response = await acme.goto(f"/ui/calls/{ids['po-2']}")
    assert response is not None
    assert response.status == 404
