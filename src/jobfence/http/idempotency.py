"""HTTP idempotency keys (SPEC I1–I4) as ASGI middleware for any app (FastAPI, Starlette…).

For each matched request (by default every ``POST``) the middleware reads the
``Idempotency-Key`` (IETF draft) or ``X-Idempotency-Key`` header and keeps one row per
(partner, key) with a fingerprint of the request, its state and, once answered, the response.

- first request with this key → the app's response (stored, unless it is a 5xx)
- same key, same request, answered before → the stored response (status, headers, body)
  plus ``Idempotent-Replayed: true``
- same key, different request → 409 problem+json ``IDEMPOTENCY_KEY_MISMATCH``
- same key, first request still running → 409 problem+json ``IDEMPOTENCY_KEY_IN_FLIGHT``
  with ``Retry-After``
- no key → 400 ``IDEMPOTENCY_KEY_MISSING``; key empty, longer than 255 characters or not
  printable ASCII → 400 ``IDEMPOTENCY_KEY_MALFORMED``
- body larger than ``max_body`` → 413 ``REQUEST_TOO_LARGE``

A 5xx answer is not stored: the key is released and the client may retry with it. While the
app works, the middleware renews a lease on the key; a server that dies stops renewing and
the key frees once the lease runs out (a retry of the *same* request then runs again — store
the key on your domain row too, as the purchase-order service does, if even that must not
create a second row). Keys expire ``window`` after their first use (default 24 h); expired
keys are cleaned up in bounded batches while the middleware serves requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from .. import tracing
from ..config import parse_database_url
from ..db import CommitConflict, Database, connect, to_datetime
from ..errors import ConfigurationError, extra_needed
from .batch import KeyBatches
from .keys import (
    DEFAULT_LEASE,
    DEFAULT_MAX_BODY,
    DEFAULT_WINDOW,
    HEADER,
    IN_FLIGHT,
    MISMATCH,
    MISSING,
    REPLAYED_HEADER,
    TOO_LARGE,
    X_HEADER,
    IdempotencyContext,
    IdempotencyStore,
    KeyProblem,
    StoredResponse,
    cleanup_keys,
    fingerprint_request,
    parse_key,
    problem_body,
    stored_response,
)

with extra_needed("ops", "jobfence.http (the idempotency middleware)"):
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("jobfence.http")


# Not replayed: they describe the original exchange, not the resource (and a cookie must not
# be handed out twice).
_NOT_STORED = frozenset(
    {
        "content-length",
        "date",
        "server",
        "set-cookie",
        "connection",
        "keep-alive",
        "transfer-encoding",
        REPLAYED_HEADER,
    }
)

PartnerResolver = Callable[[Request], Awaitable[str | None] | str | None]
Matcher = Callable[[str, str], bool]


class _Disconnected(Exception):
    pass


class _NotClaimed(Exception):
    def __init__(self, row: dict[str, Any] | None) -> None:
        self.row = row  # the key's row as the claim's next statement saw it


class _RollBack(Exception):
    def __init__(self, response: StoredResponse) -> None:
        self.response = response


class IdempotencyMiddleware:
    """ASGI middleware enforcing idempotency keys on matched requests.

    ``database``: an opened :class:`~jobfence.db.Database`, a callable returning one (e.g.
    ``lambda: app.db`` for a jobfence App opened in the lifespan), or a database URL (the
    middleware then opens its own small pool on first use). The database must be migrated
    (``jobfence migrate``).

    ``partner(request)`` names the tenant a key belongs to (sync or async; it sees the headers,
    not the body). ``None`` from it means "not authenticated": the request passes through
    untouched and the app answers it (e.g. 401); no key is stored. Without ``partner`` every
    key lives in one shared scope.

    ``match(method, path)`` picks the requests that need a key (default: every POST).

    ``one_transaction=True``: the key is claimed in a transaction that the app gets at
    ``idempotency_of(request).transaction`` for its own writes, and the response is stored
    in it; one commit for the whole request (``BEGIN`` and the claim go in one round trip).
    A 5xx answer or an exception rolls everything back, the app's writes included. A second
    request with the same key waits for the first one's commit (the key's row is locked)
    and then gets its stored response, instead of ``409 IDEMPOTENCY_KEY_IN_FLIGHT``; no
    lease is renewed (a server that dies aborts the transaction, which frees the key).
    Keep such handlers short: the transaction holds a pooled connection while they run.

    ``claim_at_commit=True`` (implies ``one_transaction``; PostgreSQL, elsewhere it is
    ``one_transaction``): the fewest round trips. The key is first looked up (one indexed
    read, no transaction): a stored response is replayed from it at once. A key nobody holds
    is claimed *with* the app's statements: the app runs first, its transaction
    (:attr:`Tx.deferred <jobfence.db.Tx.deferred>`) sends nothing until its first statement
    whose result it needs, and what it only queues (``tx.execute_at_commit``,
    ``tx.q_at_commit``, :func:`jobfence.outbox.write_at_commit`) leaves with the claim, the
    stored response and ``COMMIT`` in one round trip. If the key was taken meanwhile, or a
    queued statement breaks a constraint, nothing is committed, the answer is dropped and the
    request runs again as with ``one_transaction`` (the claim first). So the app may run
    before its key is claimed, and must then have **no effect outside that transaction**
    (no call to another service, no message sent) — only with such an app turn it on.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        database: Database | Callable[[], Database] | str,
        partner: PartnerResolver | None = None,
        match: Matcher | None = None,
        window: timedelta = DEFAULT_WINDOW,
        lease: timedelta = DEFAULT_LEASE,
        max_body: int = DEFAULT_MAX_BODY,
        cleanup_interval: timedelta = timedelta(minutes=5),
        one_transaction: bool = False,
        claim_at_commit: bool = False,
    ) -> None:
        if window <= timedelta(0) or lease <= timedelta(0):
            raise ConfigurationError("the idempotency window and lease must be positive")
        if lease >= window:
            raise ConfigurationError(
                f"the in-flight lease ({lease}) must be shorter than the key window ({window})"
            )
        self.app = app
        self._database = database
        self._own_db: Database | None = None
        self._open_lock = asyncio.Lock()
        self.partner = partner
        self.match: Matcher = match or (lambda method, path: method == "POST")
        self.window = window
        self.lease = lease
        self.max_body = max_body
        self.cleanup_interval = cleanup_interval
        self.one_transaction = one_transaction or claim_at_commit
        self.claim_at_commit = claim_at_commit
        self._next_cleanup = 0.0
        self._batches: KeyBatches | None = None
        self._background: set[asyncio.Task[Any]] = set()
        #: the span of each keyed request (docs/tracing.md); None without the otel extra
        self._tracing = tracing.get()
        if isinstance(database, str):
            parse_database_url(database)  # a bad URL fails at start-up, in one line

    async def _db(self) -> Database:
        source = self._database
        if isinstance(source, Database):
            return source
        if isinstance(source, str):
            async with self._open_lock:
                if self._own_db is None:
                    db = connect(parse_database_url(source))
                    await db.open(max_size=10)
                    self._own_db = db
            return self._own_db
        return source()

    async def close(self) -> None:
        """Close the pool the middleware opened itself (a URL was given)."""
        for task in list(self._background):
            task.cancel()
        if self._own_db is not None:
            db, self._own_db = self._own_db, None
            await db.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http" or not self.match(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        partner_id = await self._partner(scope)
        if partner_id is None:
            await self.app(scope, receive, send)
            return
        if self._tracing is None or (
            not self._tracing.live and not any(n == b"traceparent" for n, _ in scope["headers"])
        ):
            # no SDK records spans and no trace context comes in: nothing for a span to carry
            await self._keyed(scope, receive, send, partner_id)
            return
        carrier = {n.decode("latin-1"): v.decode("latin-1") for n, v in scope["headers"]}
        with self._tracing.idempotency(scope["method"], scope["path"], carrier):
            await self._keyed(scope, receive, send, partner_id)

    def _note(self, outcome: str) -> None:
        """What the middleware did with a keyed request, on its span: ``executed``,
        ``replayed``, ``in_flight``, ``mismatch``, ``bad_key``, ``too_large``."""
        if self._tracing is not None and self._tracing.live:
            self._tracing.idempotency_outcome(outcome)

    async def _keyed(self, scope: Scope, receive: Receive, send: Send, partner_id: str) -> None:
        headers = [(name.decode("latin-1"), value) for name, value in scope["headers"]]
        values = [v.decode("latin-1") for n, v in headers if n in (HEADER, X_HEADER)]
        try:
            key = parse_key(values)
        except KeyProblem as exc:
            self._note("bad_key")
            title = (
                "Idempotency key missing" if exc.code == MISSING else "Malformed idempotency key"
            )
            await _send_problem(send, 400, exc.code, title, exc.detail)
            return
        try:
            body = await _read_body(receive, self.max_body)
        except _Disconnected:
            return
        except ValueError:
            self._note("too_large")
            await _send_problem(
                send,
                413,
                TOO_LARGE,
                "Request body too large",
                f"requests with an idempotency key are limited to {self.max_body} bytes",
            )
            return
        content_type = next((v.decode("latin-1") for n, v in headers if n == "content-type"), "")
        fingerprint = fingerprint_request(
            scope["method"], scope["path"], scope.get("query_string", b""), body, content_type
        )
        db = await self._db()
        self._maybe_cleanup(db)
        batches = self._batches
        if batches is None or batches.db is not db:
            batches = self._batches = KeyBatches(db, lease=self.lease, window=self.window)
        store = batches.store
        if self.claim_at_commit and db.supports_deferred:
            row = await batches.lookup(partner_id, key)  # one indexed read: a replay ends here
            if row is None:
                if await self._run_deferred(
                    scope, body, send, batches, partner_id, key, fingerprint
                ):
                    return
            elif not row["expired"] and row["state"] == "completed":
                await self._answer_taken(send, row, fingerprint)
                return
        for _ in range(5):
            if self.one_transaction:
                handled, row = await self._run_in_transaction(
                    scope, body, send, store, partner_id, key, fingerprint
                )
                if handled:
                    return
            else:
                # claims (and completions) of concurrent requests share a statement
                claimed = await batches.claim(partner_id, key, fingerprint)
                if claimed is not None:
                    self._note("executed")
                    token, expires_at = claimed
                    context = IdempotencyContext(partner_id, key, fingerprint, expires_at)
                    await self._run(scope, body, send, batches, context, token)
                    return
                row = await store.get(partner_id, key)
            if row is None or row["expired"]:
                continue  # deleted or expired in between: claim again
            await self._answer_taken(send, row, fingerprint)
            return
        raise RuntimeError("idempotency key kept changing state; giving up on this request")

    async def _answer_taken(self, send: Send, row: dict[str, Any], fingerprint: str) -> None:
        """The answer to a request whose key someone else holds (``row``, not expired): 409
        for another request or one still running, else the stored response."""
        if row["fingerprint"] != fingerprint:
            self._note("mismatch")
            await _send_problem(
                send,
                409,
                MISMATCH,
                "Idempotency key reused for a different request",
                "this key was already used with another request (method, path or body "
                "differ); use a new key for a new operation",
            )
            return
        if row["state"] == "in_progress":
            self._note("in_flight")
            await _send_problem(
                send,
                409,
                IN_FLIGHT,
                "Request with this idempotency key still in progress",
                "the first request with this key has not finished; retry shortly to get "
                "its response",
                extra_headers=[(b"retry-after", b"1")],
            )
            return
        self._note("replayed")
        await _send_replay(send, stored_response(row))

    async def _partner(self, scope: Scope) -> str | None:
        if self.partner is None:
            return ""
        result = self.partner(Request(scope))
        if inspect.isawaitable(result):
            result = await result
        return result

    def _maybe_cleanup(self, db: Database) -> None:
        now = time.monotonic()
        if now < self._next_cleanup:
            return
        self._next_cleanup = now + self.cleanup_interval.total_seconds()

        async def clean() -> None:
            try:
                deleted = await cleanup_keys(db)
                if deleted:
                    log.info("expired idempotency keys deleted", extra={"keys": deleted})
            except Exception:
                log.exception("idempotency key cleanup failed; will try again later")

        task = asyncio.create_task(clean(), name="jobfence-idempotency-cleanup")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _call(
        self, scope: Scope, body: bytes, context: IdempotencyContext
    ) -> tuple[StoredResponse, list[tuple[bytes, bytes]]]:
        """Run the app with the buffered body; its response (what is stored) and raw headers."""
        scope = dict(scope)
        state = dict(scope.get("state") or {})
        state["idempotency"] = context
        scope["state"] = state
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # like a client that keeps the connection open
            return {"type": "http.disconnect"}  # pragma: no cover - never reached

        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        if start is None:
            raise RuntimeError("the app returned without sending a response")
        raw_headers: list[tuple[bytes, bytes]] = list(start.get("headers", []))
        response = StoredResponse(
            status=int(start["status"]),
            headers=[
                (n.decode("latin-1"), v.decode("latin-1"))
                for n, v in raw_headers
                if n.decode("latin-1").lower() not in _NOT_STORED
            ],
            body=b"".join(chunks),
        )
        return response, raw_headers

    async def _run_in_transaction(
        self,
        scope: Scope,
        body: bytes,
        send: Send,
        store: IdempotencyStore,
        partner_id: str,
        key: str,
        fingerprint: str,
    ) -> tuple[bool, dict[str, Any] | None]:
        """``one_transaction``: claim, the app's writes and the stored response in one
        transaction. (False, the key's row) when the key was not claimed: the claim and the
        read of the key go in one round trip (the read, a statement of its own, sees a key
        another request committed while the claim waited for it), so a replay needs no
        second connection."""
        params = {
            "partner_id": partner_id,
            "key": key,
            "fingerprint": fingerprint,
            "lease": self.lease.total_seconds(),
            "window": self.window.total_seconds(),
        }
        try:
            steps = ["idempotency_claim", "idempotency_get"]
            async with store.db.work(steps, params) as (tx, results):
                if not results[0]:
                    raise _NotClaimed(dict(results[1][0]) if results[1] else None)
                self._note("executed")
                claim = results[0][0]
                token = str(claim["lease_token"])
                context = IdempotencyContext(
                    partner_id, key, fingerprint, to_datetime(claim["expires_at"]), tx
                )
                response, raw_headers = await self._call(scope, body, context)
                if response.status >= 500:
                    raise _RollBack(response)
                await store.complete(partner_id, key, token, response, tx)
        except _NotClaimed as seen:
            return False, seen.row
        except _RollBack as rollback:
            response = rollback.response
        await _send_response(send, response.status, raw_headers, response.body)
        return True, None

    async def _run_deferred(
        self,
        scope: Scope,
        body: bytes,
        send: Send,
        batches: KeyBatches,
        partner_id: str,
        key: str,
        fingerprint: str,
    ) -> bool:
        """``claim_at_commit``: the app first, then its claim of the key (a plain insert),
        its queued statements, the stored response and COMMIT in one round trip, shared with
        concurrent requests'. False when that broke a constraint (the key was taken
        meanwhile, or the app's own statement conflicted): nothing was committed or
        answered, the caller goes the ``one_transaction`` way."""
        token = str(uuid.uuid4())
        params = {
            "partner_id": partner_id,
            "key": key,
            "fingerprint": fingerprint,
            "token": token,
            "lease": self.lease.total_seconds(),
            "window": self.window.total_seconds(),
        }
        db = batches.db
        tx = db.deferred(["idempotency_insert"], params)
        try:
            # the key's expiry is now() + window of the transaction that claims it
            context = IdempotencyContext(partner_id, key, fingerprint, None, tx)
            response, raw_headers = await self._call(scope, body, context)
            if response.status < 500:
                await batches.store.complete(partner_id, key, token, response, tx)
                if tx.deferred:
                    await batches.commit(partner_id, key, tx)
                else:
                    await db.commit_deferred([tx])
            elif getattr(tx, "conflict", None) is not None:
                return False  # the app's 5xx answered the conflict of its first statement
        except CommitConflict:
            return False
        finally:
            await db.abandon_deferred(tx)
        self._note("executed")
        await _send_response(send, response.status, raw_headers, response.body)
        return True

    async def _run(
        self,
        scope: Scope,
        body: bytes,
        send: Send,
        batches: KeyBatches,
        context: IdempotencyContext,
        token: str,
    ) -> None:
        store = batches.store
        # the lease is renewed only by a request still running after a third of it: a timer,
        # not a task per request
        heartbeat: list[asyncio.Task[None]] = []

        def renew() -> None:
            heartbeat.append(asyncio.create_task(self._heartbeat(store, context, token)))

        timer = asyncio.get_running_loop().call_later(self._renew_every(), renew)

        async def stop_renewing() -> None:
            timer.cancel()
            for task in heartbeat:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        try:
            response, raw_headers = await self._call(scope, body, context)
        except BaseException:
            timer.cancel()
            for task in heartbeat:
                task.cancel()
            await asyncio.shield(self._release(store, context, token))
            raise
        await stop_renewing()
        if response.status >= 500:
            await self._release(store, context, token)
        else:
            try:
                if not await batches.complete(context.partner_id, context.key, token, response):
                    log.warning(
                        "idempotency key was taken over before the response was stored",
                        extra={"partner_id": context.partner_id, "key": context.key},
                    )
            except Exception:
                log.exception(
                    "could not store the response of an idempotent request; the key frees "
                    "when its lease runs out",
                    extra={"partner_id": context.partner_id, "key": context.key},
                )
        await _send_response(send, response.status, raw_headers, response.body)

    async def _heartbeat(
        self, store: IdempotencyStore, context: IdempotencyContext, token: str
    ) -> None:
        while True:
            try:
                if not await store.extend(context.partner_id, context.key, token, self.lease):
                    log.warning(
                        "lost the lease of an in-flight idempotency key",
                        extra={"partner_id": context.partner_id, "key": context.key},
                    )
                    return
            except Exception:
                log.exception("could not renew an idempotency key's lease")
            await asyncio.sleep(self._renew_every())

    def _renew_every(self) -> float:
        return max(self.lease.total_seconds() / 3, 0.05)

    async def _release(
        self, store: IdempotencyStore, context: IdempotencyContext, token: str
    ) -> None:
        try:
            await store.release(context.partner_id, context.key, token)
        except Exception:
            log.exception(
                "could not release an idempotency key; it frees when its lease runs out",
                extra={"partner_id": context.partner_id, "key": context.key},
            )

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def on_send(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.close()
            await send(message)

        await self.app(scope, receive, on_send)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ValueError("body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_response(
    send: Send, status: int, raw_headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [(n, v) for n, v in raw_headers if n.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_problem(
    send: Send,
    status: int,
    code: str,
    title: str,
    detail: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = problem_body(status, code, title, detail)
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_replay(send: Send, response: StoredResponse) -> None:
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
    headers.append((b"content-length", str(len(response.body)).encode()))
    headers.append((REPLAYED_HEADER.encode(), b"true"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def idempotency_of(request: Request) -> IdempotencyContext | None:
    """The key of the current request, for a handler (e.g. to store it on its domain row)."""
    context = getattr(request.state, "idempotency", None)
    return context if isinstance(context, IdempotencyContext) else None
