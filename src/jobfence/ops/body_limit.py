"""The ops API's request-body limit: bodies over ``max_bytes`` get 413 before anything else
happens, whether announced by Content-Length or streamed in chunks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .problems import problem

DEFAULT_MAX_BODY = 128 * 1024
DRAIN_LIMIT = 8 * 1024 * 1024  # an oversized streamed body is read this far, then cut off

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, whether announced by Content-Length
    or streamed in chunks (then buffered, at most ``max_bytes``, and handed on)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                announced = int(length)
            except ValueError:
                await self._refuse(scope, receive, send, 400, "bad Content-Length")
                return
            if announced > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if headers.get(b"transfer-encoding") is None:
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                # read (and drop) the rest, up to a bound, so the client gets to read the 413
                more = message.get("more_body", False)
                while more and size <= DRAIN_LIMIT:
                    message = await receive()
                    size += len(message.get("body", b""))
                    more = message["type"] == "http.request" and message.get("more_body", False)
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._refuse(
            scope, receive, send, 413, f"request bodies are limited to {self.max_bytes} bytes"
        )

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, why: str) -> None:
        title = "Payload too large" if status == 413 else "Bad request"
        response = problem(status, title, why)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)
