"""The NATS connection: each event of an outage one log line (:class:`ClientEvents`), what a
server that is away raises (:data:`UNAVAILABLE`), and a URL or an error as shown to people."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats.errors
import nats.js.errors

log = logging.getLogger("jobfence.transport.nats")

API_TIMEOUT = 15.0  # seconds for a JetStream API answer (a busy server can be slow)
INITIAL_CONNECT_ATTEMPTS = 3  # 0.5 s apart; reconnections after that never give up


class ClientEvents:
    """nats-py's connection callbacks, each event one log line through jobfence's logger.

    nats-py's default error callback logs every error with its traceback (a reconnecting
    client: one per attempt, twice a second). Here a lost connection, each distinct error
    and the reconnection are one WARNING line each, without a traceback; the same error
    again within ``repeat_window`` seconds (the reconnection attempts of one outage) is a
    DEBUG line, counted in the next WARNING about it and in the reconnection's line.
    """

    def __init__(self, server: str, repeat_window: float = 60.0) -> None:
        self.server = server
        self.repeat_window = repeat_window
        self.closing = False
        # the first connection: its errors become the one-line error of open(), not logs
        self.connecting = True
        self.last_error: BaseException | None = None
        self._last: dict[str, float] = {}
        self._repeats: dict[str, int] = {}
        self._down_since: float | None = None
        self._failed = 0

    async def error(self, exc: Exception) -> None:
        self.last_error = exc
        if self.connecting:
            log.debug("NATS connection attempt failed", extra={"error": describe_error(exc)})
            return
        if self._down_since is not None:
            self._failed += 1
        self.note("NATS client error", exc)

    def note(self, event: str, exc: BaseException) -> None:
        """One WARNING line for ``event`` caused by ``exc``; DEBUG when it repeats."""
        text = describe_error(exc)
        key = f"{event}|{text}"
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.repeat_window:
            self._repeats[key] = self._repeats.get(key, 0) + 1
            log.debug(f"{event} (again)", extra={"server": self.server, "error": text})
            return
        self._last[key] = now
        extra: dict[str, Any] = {"server": self.server, "error": text}
        repeats = self._repeats.pop(key, 0)
        if repeats:
            extra["repeated"] = repeats
        log.warning(event, extra=extra)

    async def disconnected(self) -> None:
        if self.closing:
            return
        self._down_since = time.monotonic()
        self._failed = 0
        log.warning("NATS connection lost; reconnecting", extra={"server": self.server})

    async def reconnected(self) -> None:
        extra: dict[str, Any] = {"server": self.server}
        if self._down_since is not None:
            extra["down_s"] = round(time.monotonic() - self._down_since, 3)
            extra["failed_attempts"] = self._failed
        self._down_since = None
        self._last.clear()  # the next outage's errors are news again
        self._repeats.clear()
        log.warning("NATS connection restored", extra=extra)

    async def closed(self) -> None:
        if not self.closing:
            log.warning("NATS connection closed for good", extra={"server": self.server})


#: What a connection that is down or a JetStream that is not ready (yet) raise: expected
#: during an outage, logged in one line. (nats-py's TimeoutError is also the builtin one,
#: which a pull fetch raises when there is simply nothing to fetch.)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.js.errors.ServiceUnavailableError,
)


def describe_error(exc: BaseException) -> str:
    detail = str(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def display_url(url: str) -> str:
    """``url`` without its secret (``nats://user:***@host``; a token alone: ``***@host``)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    masked = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))


def is_missing(exc: nats.js.errors.APIError) -> bool:
    """The server says the message is not there (404, or "no message found")."""
    if isinstance(exc, nats.js.errors.NotFoundError):
        return True
    return "no message found" in str(getattr(exc, "description", "") or "").lower()
