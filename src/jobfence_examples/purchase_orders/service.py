"""The purchase-order service (SPEC A2): requests, their states, the consumer and operator retry.

One jobfence :class:`~jobfence.App` carries it all: the API writes a request row and its
outbox event in one transaction; the relay publishes the event (``job_id = event_id``); the
consumer fences the event, calls the ERP through :class:`~.adapter.ErpClient` and completes
the request in the fence's transaction. Failures become dead letters, and the request shows
the matching final state.

State changes that must be visible *while* the work transaction is still open (SENT_TO_ERP,
RETRY_PENDING) or after it rolled back (the failure states) are written on a small second
pool (the pool of a second :class:`~jobfence.App` on the same database); the completion
commits with the fence.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, LiteralString

from psycopg.rows import dict_row

from jobfence import (
    Actor,
    App,
    Category,
    ConfigurationError,
    Database,
    Delivery,
    Job,
    NonRetryableError,
    NotFound,
    Observer,
    OutboxEvent,
    Relay,
    RetryPolicy,
    ReviewConflict,
    TemporaryError,
    Transport,
    Tx,
    discard_dead_letter,
    outbox,
)
from jobfence.http import DEFAULT_WINDOW

from .adapter import STEP, ErpClient, ErpOrder, ErpSettings
from .models import (
    QUEUE,
    RETRYABLE,
    RUNNING,
    OrderEvent,
    PurchaseOrderRequest,
    State,
    final_state,
)

# under "jobfence", so `jobfence demo purchase-orders --log-level` governs it as before
log = logging.getLogger("jobfence.purchase_orders")

PARTNER_TOKEN_PREFIX = "pop_"

#: Broker-level redelivery of the ERP consumer, after the seed's Pub/Sub subscription policy
#: (seed 004 §10.3): minimum backoff 10 s, maximum 10 min, 6 deliveries.
PO_POLICY = RetryPolicy(
    max_retries=5,
    base=timedelta(seconds=10),
    cap=timedelta(minutes=10),
    justification=(
        "seed 004 §10.3: the purchase-order subscription backs off from 10 s to at most "
        "10 min; the ERP adapter already retried in-process (R5) before each redelivery"
    ),
)

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _queries() -> dict[str, LiteralString]:
    text = resources.files(__package__).joinpath("sql", "queries.sql").read_text("utf-8")
    found: dict[str, LiteralString] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        found[match.group(1)] = text[match.end() : end].strip()
    return found


def _schema() -> LiteralString:
    text: LiteralString = (
        resources.files(__package__).joinpath("sql", "schema.sql").read_text("utf-8")
    )
    return text


async def q(tx: Tx, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run one of the service's named statements in ``tx`` (PostgreSQL); rows as dicts."""
    async with tx.connection.cursor(row_factory=dict_row) as cur:
        await cur.execute(_queries()[name], params)
        if cur.description is None:
            return []
        rows: list[dict[str, Any]] = await cur.fetchall()
        return rows


def _postgresql_only(app: App) -> App:
    if app.url.dialect != "postgresql":
        raise ConfigurationError("the purchase-order service runs on PostgreSQL only")
    return app


async def migrate(database_url: str) -> list[int]:
    """Migrate jobfence's ``core`` schema, then create the service's ``purchase_orders``
    schema (idempotent; safe to run from several processes at once)."""
    app = _postgresql_only(App(database_url))
    applied = await app.migrate()
    await app.open(pool_size=1)
    try:
        async with app.db.transaction() as tx:
            await q(tx, "lock_migrations")
            await tx.script(_schema())
        return applied
    finally:
        await app.close()


@asynccontextmanager
async def _within(db: Database, tx: Tx | None) -> AsyncIterator[Tx]:
    """``tx`` when given, else a new transaction of ``db``."""
    if tx is not None:
        yield tx
        return
    async with db.transaction() as own:
        yield own


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


@dataclass(frozen=True)
class Created:
    """``POST /requests`` accepted (``new`` False: the same key's request already existed)."""

    request_id: str
    event_id: str
    state: str
    new: bool


@dataclass(frozen=True)
class KeyMismatch:
    """SPEC I2: the idempotency key, still inside its window, names a request with another
    document. Nothing is created; the client needs a new key for a new document."""

    existing_request_id: str
    existing_state: str


@dataclass(frozen=True)
class DuplicateDocument:
    """SPEC I3: the partner already sent this document."""

    existing_request_id: str
    existing_state: str


@dataclass(frozen=True)
class Refused:
    """An operator retry that cannot happen: HTTP status, problem code, explanation."""

    status: int
    code: str
    detail: str


@dataclass(frozen=True)
class Retried:
    request_id: str
    event_id: str
    previous_event_id: str
    previous_state: str
    audit_id: int


def dead_letter_attributes(
    letter: Mapping[str, Any], partner_id: str, request_id: str
) -> dict[str, Any]:
    """The dead-letter attributes the seed asks for (004 §10.5), from a core.dead_letters row."""
    return {
        "deadLetterId": letter.get("id"),
        "requestId": request_id,
        "eventId": letter.get("job_id"),
        "partnerId": partner_id,
        "originalQueue": letter.get("queue"),
        "attempts": letter.get("attempts"),
        "errorCode": letter.get("error_code"),
        "errorCategory": letter.get("error_category"),
    }


class _RequestStates(Observer):
    """Moves requests to RETRY_PENDING and to their failure states as the harness decides."""

    def __init__(self, service: PurchaseOrderService) -> None:
        self.service = service

    def job_retry(
        self, delivery: Delivery, consumer: str, category: Category, delay: timedelta, error: str
    ) -> None:
        if delivery.queue == QUEUE:
            self.service.spawn(
                self.service.mark_retry_pending(delivery.job_id, delivery.attempt, category, error)
            )

    def job_dead(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        dead_letter_id: int | None,
    ) -> None:
        if delivery.queue == QUEUE:
            self.service.spawn(self.service.settle_failures(event_id=delivery.job_id))


class CallTally(Observer):
    """How the ERP steps ended and how their doubts were resolved (what the demo reports):
    ``finished`` by the step's outcome for a delivery (``succeeded``, ``recorded``,
    ``reconciled``, ``in_doubt``, …), ``reconciled`` by the lookup's result (``found``: the
    ERP had the order; ``not_found``: sent again with the same key; ``error``: the lookup
    failed, tried again later)."""

    def __init__(self) -> None:
        self.finished: Counter[str] = Counter()
        self.reconciled: Counter[str] = Counter()

    def call_finished(self, job: Job[Any], consumer: str, step: str, outcome: str) -> None:
        if step == STEP:
            self.finished[outcome] += 1

    def call_reconciled(self, job: Job[Any], consumer: str, step: str, result: str) -> None:
        if step == STEP:
            self.reconciled[result] += 1


class PurchaseOrderService:
    """Requests in, purchase orders out. PostgreSQL only (``migrate()`` first)."""

    def __init__(
        self,
        database_url: str,
        *,
        erp: ErpSettings,
        transport: str | Transport | None = None,
        retry: RetryPolicy = PO_POLICY,
        lease: timedelta = timedelta(seconds=30),
    ) -> None:
        self.database_url = database_url
        #: how the ERP steps ended and their doubts were resolved, in this process
        self.calls = CallTally()
        self.app = _postgresql_only(
            App(
                database_url,
                transport=transport,
                lease=lease,
                observers=[_RequestStates(self), self.calls],
            )
        )
        self.app.consumer(QUEUE, schema=OrderEvent, retry=retry)(self.handle)
        self.erp = ErpClient(erp)
        self._side: App | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._partners: dict[str, tuple[str | None, float]] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self, pool_size: int = 20) -> None:
        await self.app.open(pool_size=pool_size)
        if self._side is None:
            side = App(self.database_url)  # only its connection pool is used
            await side.open(pool_size=4)
            self._side = side
        await self.erp.open()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.erp.close()
        if self._side is not None:
            side, self._side = self._side, None
            await side.close()
        await self.app.close()

    async def __aenter__(self) -> PurchaseOrderService:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def db(self) -> Database:
        return self.app.db

    @property
    def side(self) -> Database:
        if self._side is None:
            raise RuntimeError("the service is not open")
        return self._side.db

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def relay(self, **options: Any) -> Relay:
        """A relay that also moves requests to PUBLISHED when their event is published."""
        return Relay(self.app, on_published=self.on_published, **options)

    def worker(self, **options: Any) -> Any:
        return self.app.worker(queues=[QUEUE], **options)

    async def reconcile_forever(self, interval: float = 5.0) -> None:
        """Safety net for state updates lost with a process: settle unsettled failures."""
        while True:
            try:
                await self.settle_failures()
            except Exception:
                log.exception("reconciling request states failed")
            await asyncio.sleep(interval)

    # -- partners ---------------------------------------------------------------------------------

    async def create_partner(self, partner_id: str, name: str) -> str:
        """Create (or re-key) a partner; return its bearer token (shown only now)."""
        token = PARTNER_TOKEN_PREFIX + secrets.token_urlsafe(24)
        async with self.db.transaction() as tx:
            await q(
                tx,
                "partner_insert",
                {"partner_id": partner_id, "name": name, "token_hash": hash_token(token)},
            )
        self._partners.clear()
        return token

    async def partner_for_token(self, token: str | None) -> str | None:
        """The partner a bearer token belongs to (cached for 10 s), or None."""
        if not token or not token.startswith(PARTNER_TOKEN_PREFIX) or len(token) > 200:
            return None
        digest = hash_token(token)
        cached = self._partners.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        async with self.db.transaction() as tx:
            rows = await q(tx, "partner_by_token", {"token_hash": digest})
        partner = str(rows[0]["partner_id"]) if rows else None
        if len(self._partners) > 10_000:
            self._partners.clear()
        self._partners[digest] = (partner, time.monotonic() + 10)
        return partner

    # -- requests -------------------------------------------------------------------------------

    async def create_request(
        self,
        partner_id: str,
        body: PurchaseOrderRequest,
        *,
        idempotency_key: str | None,
        key_expires_at: datetime | None = None,
        key_window: timedelta = DEFAULT_WINDOW,
        tx: Tx | None = None,
    ) -> Created | KeyMismatch | DuplicateDocument:
        """Request row + history + outbox event in one transaction (SPEC O1, I2, I3): ``tx``
        when given (the idempotency middleware's, which also holds the key and will store the
        response: one commit per POST), else a transaction of its own.

        The idempotency key is kept on the request until ``key_expires_at`` (the middleware's
        expiry of the key; without one, ``key_window`` from now). Inside that window the same
        key answers the request that holds it when the document is the same, and
        :class:`KeyMismatch` when it is not. After it the key is new: the old request releases
        it (keeping it as history) and a new request is created — a document is never dropped.
        """
        request_id = str(uuid.uuid4())
        event_id = str(uuid.uuid4())
        document = body.model_dump(mode="json")
        detail: dict[str, Any] = {"by": partner_id}
        params = {
            "request_id": request_id,
            "partner_id": partner_id,
            "idempotency_key": idempotency_key,
            "key_expires_at": key_expires_at,
            "key_window": key_window.total_seconds(),
            "company_id": body.company_id,
            "document_type": body.document_type,
            "external_reference": body.external_reference,
            "document": _json(document),
            "event_id": event_id,
            "detail": _json(detail),
        }
        async with _within(self.db, tx) as tx:
            if tx.deferred:
                # the middleware's claim_at_commit: the rows, the event, the key's claim and
                # its stored response go to the server with the COMMIT, in one round trip. A
                # key or a document already there fails that commit, and the middleware runs
                # the request again in a transaction that has begun: the loop below looks.
                await tx.execute_at_commit(_queries()["request_insert_new"], params)
                await self._write_event(tx, request_id, event_id, partner_id, body)
                return Created(request_id, event_id, State.RECEIVED, new=True)
            # A conflict is on the key or on the document (I3). An expired key is released
            # and the insert tried again; a concurrent request may have taken the key
            # meanwhile, so a few rounds.
            looked_again = False
            for _ in range(5):
                if await q(tx, "request_insert", params):
                    await self._write_event(tx, request_id, event_id, partner_id, body)
                    return Created(request_id, event_id, State.RECEIVED, new=True)
                if idempotency_key is not None:
                    holder = await q(tx, "request_by_key", params)
                    if holder and holder[0]["key_expired"]:
                        old = str(holder[0]["request_id"])
                        await q(tx, "request_release_key", {"request_id": old})
                        detail["idempotencyKeyReleasedBy"] = old
                        params["detail"] = _json(detail)
                        log.info(
                            "an expired idempotency key names a new request",
                            extra={"partner_id": partner_id, "released_by": old},
                        )
                        continue
                    if holder:
                        row = holder[0]
                        if not row["same_document"]:
                            return KeyMismatch(str(row["request_id"]), row["state"])
                        return Created(
                            str(row["request_id"]),
                            row["current_event_id"],
                            row["state"],
                            new=False,
                        )
                    if not looked_again:
                        # The key's holder was released by a concurrent request while we
                        # waited for its lock; that request's new row is visible to the next
                        # statement, not to this one: conflict and look again.
                        looked_again = True
                        continue
                if body.external_reference is not None:
                    existing = await q(tx, "request_by_document", params)
                    if existing:
                        return DuplicateDocument(
                            str(existing[0]["request_id"]), existing[0]["state"]
                        )
                # the row we conflicted with is gone or released meanwhile: insert again
        raise RuntimeError("request insert kept conflicting with rows that changed; try again")

    async def _write_event(
        self, tx: Tx, request_id: str, event_id: str, partner_id: str, body: PurchaseOrderRequest
    ) -> None:
        # with the middleware's transaction the event goes with its COMMIT: one round trip
        # fewer (event_id is new, so it cannot collide)
        await outbox.write_at_commit(
            tx,
            QUEUE,
            self._event(
                request_id, partner_id, body.company_id, body.document_type, body.external_reference
            ),
            event_id=event_id,
            key=request_id,
            correlation_id=request_id,
        )

    @staticmethod
    def _event(
        request_id: str,
        partner_id: str,
        company_id: str,
        document_type: str,
        external_reference: str | None,
    ) -> dict[str, Any]:
        return OrderEvent(
            request_id=request_id,
            partner_id=partner_id,
            company_id=company_id,
            document_type=document_type,
            external_reference=external_reference,
        ).model_dump(mode="json")

    async def _history(
        self, tx: Tx, request_id: str, state: State, event_id: str | None, detail: dict[str, Any]
    ) -> None:
        await q(
            tx,
            "history_insert",
            {
                "request_id": request_id,
                "state": state.value,
                "event_id": event_id,
                "detail": _json(detail),
            },
        )

    async def get_request(self, request_id: str) -> dict[str, Any] | None:
        """The request with its history and, when it failed, its dead letter."""
        try:
            uuid.UUID(request_id)
        except ValueError:
            return None
        async with self.db.transaction() as tx:
            rows = await q(tx, "request_get", {"request_id": request_id})
            if not rows:
                return None
            row = rows[0]
            history = await q(tx, "request_history", {"request_id": request_id})
            letter = None
            if row["state"] in {s.value for s in RETRYABLE}:
                letters = await q(
                    tx, "dead_letter_for_event", {"event_id": row["current_event_id"]}
                )
                if letters:
                    letter = dead_letter_attributes(letters[0], row["partner_id"], request_id)
        return {
            "requestId": str(row["request_id"]),
            "partnerId": row["partner_id"],
            "state": row["state"],
            "companyId": row["company_id"],
            "documentType": row["document_type"],
            "externalReference": row["external_reference"],
            "eventId": row["current_event_id"],
            "attempts": row["attempts"],
            "operatorRetries": row["operator_retries"],
            "erpOrderId": row["erp_order_id"],
            "error": None
            if row["error_category"] is None
            else {
                "category": row["error_category"],
                "code": row["error_code"],
                "message": row["last_error"],
            },
            "deadLetter": letter,
            "createdAt": row["created_at"].isoformat(),
            "updatedAt": row["updated_at"].isoformat(),
            "history": [
                {
                    "at": h["at"].isoformat(),
                    "state": h["state"],
                    "eventId": h["event_id"],
                    "detail": h["detail"],
                }
                for h in history
            ],
        }

    async def retry_request(
        self, request_id: str, *, actor: str, role: str, scope: str | None, reason: str
    ) -> Retried | Refused:
        """Operator retry (seed 004 §10.5): scope, state check, no duplicate, new event id,
        audit row — all in one transaction."""
        try:
            uuid.UUID(request_id)
        except ValueError:
            return Refused(404, "REQUEST_NOT_FOUND", "no such request")
        async with self.db.transaction() as tx:
            current = await q(tx, "request_get", {"request_id": request_id})
        if current:
            # a dead letter whose state update is still on its way counts as failed already
            await self.settle_failures(event_id=current[0]["current_event_id"])
        async with self.db.transaction() as tx:
            rows = await q(tx, "request_lock", {"request_id": request_id})
            if not rows or (scope is not None and rows[0]["partner_id"] != scope):
                return Refused(404, "REQUEST_NOT_FOUND", "no such request")
            row = rows[0]
            state = State(row["state"])
            if state in RUNNING:
                return Refused(
                    409,
                    "RETRY_ALREADY_RUNNING",
                    f"the request is {state.value}: it is being processed, so a retry would "
                    "duplicate it",
                )
            if state not in RETRYABLE:
                return Refused(
                    409,
                    "REQUEST_NOT_RETRYABLE",
                    f"the request is {state.value}; only {', '.join(sorted(RETRYABLE))} can be "
                    "retried",
                )
            event_id = str(uuid.uuid4())
            previous = row["current_event_id"]
            await q(tx, "restart", {"request_id": request_id, "event_id": event_id})
            detail = {
                "by": actor,
                "reason": reason,
                "previous_state": state.value,
                "previous_event_id": previous,
            }
            await self._history(tx, request_id, State.RECEIVED, event_id, {"retry": detail})
            audit = await q(
                tx,
                "audit_insert",
                {
                    "actor": actor,
                    "role": role,
                    "scope": scope,
                    "action": "retry",
                    "request_id": request_id,
                    "detail": _json({**detail, "new_event_id": event_id}),
                },
            )
            await outbox.write(
                tx,
                QUEUE,
                self._event(
                    request_id,
                    row["partner_id"],
                    row["company_id"],
                    row["document_type"],
                    row["external_reference"],
                ),
                event_id=event_id,
                key=request_id,
                correlation_id=request_id,
            )
        log.warning(
            "operator retried a purchase-order request",
            extra={"request_id": request_id, "by": actor, "event_id": event_id, "reason": reason},
        )
        if row["dead_letter_id"] is not None:
            await self._supersede(int(row["dead_letter_id"]), actor, scope, request_id, event_id)
        return Retried(request_id, event_id, previous, state.value, int(audit[0]["id"]))

    async def _supersede(
        self, letter_id: int, actor: str, scope: str | None, request_id: str, event_id: str
    ) -> None:
        """The retry replaces the dead letter's event: close the letter (with the jobfence
        audit row) so it no longer waits for review. A letter someone already decided stays
        as it is."""
        try:
            await discard_dead_letter(
                self.db,
                letter_id,
                actor=Actor(actor, "api", scope),
                reason=f"superseded by the operator retry of request {request_id} "
                f"(new event {event_id})",
            )
        except (NotFound, ReviewConflict) as exc:
            log.info(
                "dead letter of a retried request left as it is",
                extra={"dead_letter_id": letter_id, "why": str(exc)},
            )

    async def state_counts(self) -> dict[str, int]:
        async with self.db.transaction() as tx:
            rows = await q(tx, "state_counts")
        found = {row["state"]: int(row["requests"]) for row in rows}
        return {state.value: found.get(state.value, 0) for state in State}

    # -- the pipeline ---------------------------------------------------------------------------

    async def on_published(self, tx: Tx, events: Sequence[OutboxEvent]) -> None:
        """Relay hook, in the transaction that marks the events published."""
        ids = [e.event_id for e in events if e.queue == QUEUE]
        if not ids:
            return
        await q(tx, "mark_published", {"event_ids": ids})

    async def handle(self, job: Job[OrderEvent], tx: Tx) -> None:
        """The consumer: the fence row is already in ``tx``; send the order, complete it."""
        request_id = job.payload.request_id
        rows = await q(tx, "request_get", {"request_id": request_id})
        if not rows:
            raise NonRetryableError(f"request {request_id} does not exist", code="UNKNOWN_REQUEST")
        row = rows[0]
        if row["current_event_id"] != job.job_id or row["state"] == State.COMPLETED:
            log.info(
                "stale purchase-order event skipped",
                extra={"request_id": request_id, "event_id": job.job_id, "state": row["state"]},
            )
            return
        async with self.side.transaction() as side:
            await q(
                side,
                "mark_sent",
                {"request_id": request_id, "event_id": job.job_id, "attempt": job.attempt},
            )
        order = await self.send_to_erp(job, request_id, dict(row["document"]), row)
        detail = {
            "erp_order_id": order.order_id,
            "created_by_this_call": order.created,
            "known_by": order.how,
        }
        await q(
            tx,
            "mark_completed",
            {
                "request_id": request_id,
                "event_id": job.job_id,
                "erp_order_id": order.order_id,
                "attempt": job.attempt,
                "detail": _json(detail),
            },
        )

    async def send_to_erp(
        self,
        job: Job[OrderEvent],
        request_id: str,
        document: dict[str, Any],
        row: Mapping[str, Any],
    ) -> ErpOrder:
        """The ERP's order for the request, as a recorded step of the job (``erp.create``,
        keyed by the request id: seed 004 E7). An operator's reprocessing (a new event, so a
        new step) looks the request up first: its first event may have created the order."""
        erp = self.erp
        if row["operator_retries"]:
            try:
                found = await erp.find_order(request_id)
            except Exception as exc:
                raise TemporaryError(
                    f"could not look the order up in the ERP before sending it again: {exc}",
                    code="ERP_LOOKUP_FAILED",
                ) from None
            if found is not None:
                return ErpOrder.of(found)

        async def send(key: str) -> dict[str, Any]:
            return await erp.send_order(key, document)

        recorded = await job.call(
            STEP,
            send,
            reconcile=erp.find_order,
            key=request_id,
            retry=erp.settings.retry,
            refresh=erp.refresh_token,
        )
        return ErpOrder.of(recorded)

    async def mark_retry_pending(
        self, event_id: str, attempt: int, category: Category, error: str
    ) -> None:
        async with self.side.transaction() as side:
            rows = await q(
                side,
                "mark_retry_pending",
                {
                    "event_id": event_id,
                    "attempt": attempt,
                    "error_code": None,
                    "error_category": category.value,
                    "error": error,
                },
            )
            for row in rows:
                await self._history(
                    side,
                    str(row["request_id"]),
                    State.RETRY_PENDING,
                    event_id,
                    {"attempt": attempt, "category": category.value, "error": error},
                )

    async def settle_failures(self, *, event_id: str | None = None, limit: int = 500) -> int:
        """Give requests whose current event was dead-lettered their final state
        (VALIDATION_FAILED, REJECTED or FAILED per the taxonomy) and the dead letter's
        attributes. Idempotent."""
        settled = 0
        async with self.side.transaction() as side:
            rows = await q(side, "unsettled_failures", {"event_id": event_id, "limit": limit})
        for row in rows:
            try:
                category = Category(row["error_category"])
            except ValueError:
                category = Category.NON_RETRYABLE_ERROR
            state = final_state(category)
            request_id = str(row["request_id"])
            async with self.side.transaction() as side:
                updated = await q(
                    side,
                    "mark_failed",
                    {
                        "request_id": request_id,
                        "event_id": row["event_id"],
                        "state": state.value,
                        "attempts": row["attempts"],
                        "error_code": row["error_code"],
                        "error_category": category.value,
                        "error": row["last_error"],
                        "dead_letter_id": row["dead_letter_id"],
                    },
                )
                if not updated:
                    continue
                letter = {
                    "id": row["dead_letter_id"],
                    "job_id": row["event_id"],
                    "queue": row["queue"],
                    "attempts": row["attempts"],
                    "error_code": row["error_code"],
                    "error_category": category.value,
                }
                partner = await q(side, "request_get", {"request_id": request_id})
                await self._history(
                    side,
                    request_id,
                    state,
                    row["event_id"],
                    {
                        "deadLetter": dead_letter_attributes(
                            letter, partner[0]["partner_id"], request_id
                        )
                    },
                )
                settled += 1
        return settled

    async def requests_by_ids(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Current state of many requests (for reports and checks)."""
        async with self.db.transaction() as tx:
            rows = await q(tx, "requests_by_ids", {"ids": list(ids)})
        return {row["request_id"]: row for row in rows}

    async def dead_letters_for(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Dead letters by event id (= job_id)."""
        async with self.db.transaction() as tx:
            rows = await q(tx, "dead_letters_for_events", {"event_ids": list(event_ids)})
        return {row["job_id"]: row for row in rows}

    async def dead_letter_statuses(self, request_ids: Sequence[str]) -> dict[str, int]:
        """How many dead letters these requests' events left, by review status (the letters of
        events an operator retry replaced included)."""
        async with self.db.transaction() as tx:
            rows = await q(
                tx,
                "dead_letters_of_requests",
                {"queue": QUEUE, "request_ids": list(request_ids)},
            )
        return {row["status"]: int(row["letters"]) for row in rows}

    async def audit_of(self, request_id: str) -> list[dict[str, Any]]:
        async with self.db.transaction() as tx:
            return await q(tx, "audit_for_request", {"request_id": request_id})
