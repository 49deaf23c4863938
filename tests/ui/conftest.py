"""Fixtures for the console's browser tests: the ops server (API + console) on a free loopback
port over a fresh PostgreSQL database, tokens of every kind, and Debian's Chromium driven by
Playwright (async API: the server runs in the test's own event loop).

Chromium is launched by its path (browsers cannot be downloaded here): ``scripts/chromium``
installs it; ``JOBFENCE_CHROMIUM`` names another binary. Every test saves screenshots into its
tmp dir, and also into ``$JOBFENCE_UI_SHOTS`` when set (how docs/ops-console/ is made)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from jobfence import App
from jobfence.ops.app import create_app

from ..deadletters.conftest import Tokens, make_tokens, serve

CHROMIUM = os.environ.get("JOBFENCE_CHROMIUM", "/usr/bin/chromium")


@dataclass
class Console:
    url: str
    database_url: str
    tokens: Tokens
    app: App
    browser: Browser
    shots: Path

    async def context(self) -> BrowserContext:
        return await self.browser.new_context(
            base_url=self.url, viewport={"width": 1280, "height": 860}
        )

    async def signed_in(self, token: str) -> Page:
        """A new browser page signed in with ``token`` (showing the overview). Its console
        errors (a CSP violation, a failed script) are collected in ``page.errors``."""
        page = await (await self.context()).new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.errors = errors  # type: ignore[attr-defined]
        await page.goto("/ui/")
        await page.fill("input[name=token]", token)
        await page.click("button[type=submit]")
        await page.wait_for_url("**/ui/")
        return page

    async def shot(self, page: Page, name: str) -> Path:
        """Save a full-page screenshot as ``name``.png (and into $JOBFENCE_UI_SHOTS)."""
        path = self.shots / f"{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        extra = os.environ.get("JOBFENCE_UI_SHOTS")
        if extra:
            await asyncio.to_thread(_copy, path, Path(extra))
        return path


def _copy(path: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, folder / path.name)


async def csrf_of(page: Page) -> str:
    """The session's CSRF token, as the page carries it (what a forged request would need)."""
    value = await page.locator("input[name=csrf]").first.get_attribute("value")
    assert value
    return value


def origin(url: str) -> str:
    match = re.match(r"^(https?://[^/]+)", url)
    assert match
    return match.group(1)


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    if not await asyncio.to_thread(os.path.exists, CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/chromium (apt-get install -y chromium)")
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def console(pg_database: str, chromium: Browser, tmp_path: Path) -> AsyncIterator[Console]:
    """The ops server with its console over a fresh PostgreSQL database."""
    tokens = await make_tokens(pg_database)
    app = App(pg_database)
    async with serve(create_app(jobfence_app=app)) as url:
        yield Console(url, pg_database, tokens, app, chromium, tmp_path)
    await app.close()
