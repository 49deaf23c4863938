"""Rendering for the console: the Jinja2 environment (autoescaped), the page helper that adds
the security headers, and the pieces that turn data into safe markup (payloads, the chart)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from .session import User

HERE = Path(__file__).parent
#: payload bytes shown on the page; the rest is behind the download link
SHOWN_BYTES = 64 * 1024
HEX_ROW = 16

#: strict: only the console's own files; no inline script or style anywhere
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
#: Swagger UI sets inline styles (its own bundle, served from here)
CSP_SWAGGER = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")

env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html", "svg"], default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(value: datetime | str | None) -> str:
    """Every time the console shows: one format, in UTC, saying so (``2026-12-04 14:25:48
    UTC``); ISO 8601 text (attempt histories) is read and shown the same way."""
    if value is None:
        return "—"
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    assert isinstance(moment, datetime)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 job``, ``2 jobs`` (``many``: an irregular plural)."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def _breakable(text: str) -> Markup:
    """``text`` (escaped) with line-break opportunities after its underscores and dots, for
    long column headings (category names)."""
    return Markup(re.sub(r"([_.])", r"\1<wbr>", str(escape(text))))


def _size(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


env.filters["when"] = _when
env.filters["size"] = _size
env.filters["plural"] = plural
env.filters["breakable"] = _breakable


def secure(response: Response, csp: str = CSP) -> Response:
    response.headers["Content-Security-Policy"] = csp
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-store"
    return response


def page(
    request: Request,
    template: str,
    user: User | None,
    *,
    status: int = 200,
    csp: str = CSP,
    **context: Any,
) -> Response:
    """Render ``template`` for ``user`` (its flashes are shown once)."""
    flashes: list[tuple[str, str]] = []
    if user is not None:
        flashes, user.session.flash[:] = list(user.session.flash), []
    html = env.get_template(template).render(
        request=request,
        user=user,
        flashes=flashes,
        path=request.url.path,
        status=status,
        **context,
    )
    return secure(HTMLResponse(html, status_code=status), csp)


def redirect(url: str) -> Response:
    return secure(RedirectResponse(url, status_code=303))


def link(path: str, **params: Any) -> str:
    """``path`` with the non-empty ``params`` as its query string."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


# -- payloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PayloadView:
    """A payload as the page shows it: ``text`` (escaped by the template) or ``hex`` rows."""

    kind: str  # "text" | "json" | "hex" | "none"
    size: int  # bytes kept
    text: str | None
    hex_rows: list[tuple[str, str, str]]  # offset, hex, printable
    cut: bool  # only the first SHOWN_BYTES are shown


def _text(data: bytes, cut: bool) -> str | None:
    """``data`` as UTF-8, or None; a cut may split the last character (up to 3 bytes)."""
    for drop in (0, 1, 2, 3) if cut else (0,):
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def payload_view(payload: bytes | None, shown: int = SHOWN_BYTES) -> PayloadView:
    if payload is None:
        return PayloadView("none", 0, None, [], False)
    cut = len(payload) > shown
    head = payload[:shown]
    text = _text(head, cut)
    if text is not None and "\x00" not in text:
        if not cut:
            try:
                parsed = json.loads(text)
                return PayloadView(
                    "json",
                    len(payload),
                    json.dumps(parsed, indent=2, ensure_ascii=False),
                    [],
                    False,
                )
            except ValueError:
                pass
        return PayloadView("text", len(payload), text, [], cut)
    rows = []
    for offset in range(0, len(head), HEX_ROW):
        chunk = head[offset : offset + HEX_ROW]
        rows.append(
            (
                f"{offset:08x}",
                " ".join(f"{b:02x}" for b in chunk),
                "".join(chr(b) if 32 <= b < 127 else "." for b in chunk),
            )
        )
    return PayloadView("hex", len(payload), None, rows, cut)


# -- the overview chart -----------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    x: int
    done_y: int
    done_h: int
    fail_y: int
    fail_h: int
    label: str


@dataclass(frozen=True)
class Chart:
    """Jobs done and dead-lettered per minute over the last hour, as SVG geometry."""

    width: int
    height: int
    bars: list[Bar]
    peak: int
    done_total: int
    failed_total: int
    show_done: bool


def chart(done: dict[int, int], failed: dict[int, int], *, show_done: bool = True) -> Chart:
    """``done``/``failed``: minutes ago (0–59) → count."""
    width, height, bar = 600, 120, 10
    peak = max([*done.values(), *failed.values(), 1]) if show_done else max([*failed.values(), 1])
    bars = []
    for minute in range(60):
        ago = 59 - minute
        d = done.get(ago, 0) if show_done else 0
        f = failed.get(ago, 0)
        dh = round(d / peak * (height - 10))
        fh = round(f / peak * (height - 10))
        bars.append(
            Bar(
                x=minute * bar,
                done_y=height - dh,
                done_h=dh,
                fail_y=height - fh,
                fail_h=fh,
                label=f"{ago} min ago: {d} done, {f} dead-lettered"
                if show_done
                else f"{ago} min ago: {f} dead-lettered",
            )
        )
    return Chart(width, height, bars, peak, sum(done.values()), sum(failed.values()), show_done)
