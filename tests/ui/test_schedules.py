"""The console's Schedules page in the browser, and ``GET /v1/schedules``: the periodic jobs'
names, cron, time zones, next and last runs as the database has them."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import httpx
from playwright.async_api import expect

from jobfence import App
from jobfence.review.schedules import list_schedules
from jobfence.runtime.scheduler import Scheduler

from ..helpers import query
from .conftest import Console


def when(moment: datetime | None) -> str:
    """As the console shows every time."""
    assert moment is not None
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


async def test_the_schedules_page_shows_names_and_times(console: Console) -> None:
    """Two periodic jobs stored by another app's scheduler: a nightly one in Madrid never run
    (its next run is 03:00 Madrid, in UTC) and a per-second one whose ticks were enqueued;
    the page shows each name, cron, time zone, next run and last run, and the API the same."""
    url = console.database_url
    other = App(url)
    other.periodic("nightly-reconcile", cron="0 3 * * *", queue="reconcile", tz="Europe/Madrid")
    other.periodic("beat", cron="* * * * * *", queue="beat", missed="all")
    async with other:
        scheduler = Scheduler(other.runtime)
        await scheduler.define()
        await query(
            url,
            "UPDATE core.schedules SET created_at = now() - interval '5 seconds' "
            "WHERE name = 'beat'",
        )
        await scheduler.tick()
        assert scheduler.enqueued >= 4
        # no running scheduler declared the nightly one for four hours: no app defines it now
        await query(
            url,
            "UPDATE core.schedules SET defined_at = now() - interval '4 hours' "
            "WHERE name = 'nightly-reconcile'",
        )
        listed = {s.name: s for s in await list_schedules(other.db)}
    beat, nightly = listed["beat"], listed["nightly-reconcile"]
    assert nightly.next_run is not None
    assert nightly.next_run.astimezone(ZoneInfo("Europe/Madrid")).hour == 3

    page = await console.signed_in(console.tokens.viewer)
    await page.click("nav >> text=Schedules")
    await page.wait_for_url("**/ui/schedules")
    rows = page.locator("#schedules tbody tr")
    await expect(rows).to_have_count(2)
    night = page.locator("tr[data-schedule=nightly-reconcile]")
    await expect(night).to_contain_text("0 3 * * *")
    await expect(night).to_contain_text("Europe/Madrid")
    await expect(night.locator("td.next")).to_have_text(when(nightly.next_run))
    await expect(night.locator("td.last")).to_have_text("never")
    # the served app defines no periodic job: nothing is marked as missing from it
    await expect(page.locator("#schedules")).not_to_contain_text("not in the app")
    assert nightly.undeclared
    await expect(night).to_contain_text(f"not declared since {when(nightly.declared_at)}")
    ticking = page.locator("tr[data-schedule=beat]")
    await expect(ticking).to_contain_text("* * * * * *")
    await expect(ticking.locator("td.last")).to_have_text(when(beat.last_slot))
    await expect(ticking.locator("td.outcome")).to_have_text("waiting")
    await expect(ticking).not_to_contain_text("not declared")
    next_text = await ticking.locator("td.next").inner_text()
    assert next_text > when(beat.last_slot)
    await console.shot(page, "schedules")
    assert page.errors == []  # type: ignore[attr-defined]

    async with httpx.AsyncClient(base_url=console.url) as client:
        viewer = {"Authorization": f"Bearer {console.tokens.viewer}"}
        answer = await client.get("/v1/schedules", headers=viewer)
        assert answer.status_code == 200, answer.text
        body = {s["name"]: s for s in answer.json()}
        assert body["nightly-reconcile"]["tz"] == "Europe/Madrid"
        assert body["nightly-reconcile"]["last_outcome"] is None
        assert datetime.fromisoformat(body["nightly-reconcile"]["next_run"]) == nightly.next_run
        assert body["beat"]["last_job_id"] == beat.last_job_id
        assert body["beat"]["last_outcome"] == "waiting"
        assert body["beat"]["defined"] is None
        assert body["nightly-reconcile"]["undeclared"] is True
        assert body["beat"]["undeclared"] is False
        assert datetime.fromisoformat(body["beat"]["declared_at"]) == beat.declared_at
        scoped = {"Authorization": f"Bearer {console.tokens.partner_b_viewer}"}
        refused = await client.get("/v1/schedules", headers=scoped)
        assert refused.status_code == 403
