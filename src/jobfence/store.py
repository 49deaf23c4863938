"""The store: schema migrations, the fence, dead letters and enqueue — the SQL jobfence owns.

One copy of each operation over :class:`jobfence.db.Database`; the driver executes, this
module decides what.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .db import Database, Tx, to_datetime
from .db.adopt import SyncConnection
from .errors import Category, SchemaError
from .jobs import AttemptRecord, Delivery, history_from, history_json
from .sql import Dialect, migrations

DEFAULT_PAYLOAD_LIMIT = 10 * 1024 * 1024
#: from this many jobs on, a bulk enqueue on PostgreSQL uses COPY instead of batched INSERTs
COPY_THRESHOLD = 64


@dataclass(frozen=True)
class OutgoingJob:
    """A job on its way into a queue."""

    queue: str
    job_id: str
    payload: bytes
    correlation_id: str | None = None
    delay: float = 0.0  # seconds

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "job_id": self.job_id,
            "payload": self.payload,
            "correlation_id": self.correlation_id,
            "delay": float(self.delay),
        }


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    consumer: str
    job_id: str
    correlation_id: str | None
    payload_size: int
    payload_truncated: bool
    attempts: int
    error_category: str
    error_code: str | None
    last_error: str
    status: str
    enqueued_at: datetime | None
    failed_at: datetime
    payload: bytes | None = None
    history: list[AttemptRecord] = field(default_factory=list)
    partner: str | None = None  # tenant scope for the ops API (see partner_of)
    previous_id: int | None = None  # the replayed letter this one failed again after
    reviewed_at: datetime | None = None
    reviewed_by: str | None = None
    review_reason: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready, without the payload."""
        data = asdict(self)
        data.pop("payload")
        for key in ("enqueued_at", "failed_at", "reviewed_at"):
            value = data[key]
            data[key] = value.isoformat() if value is not None else None
        return data


#: Top-level field of a JSON-object payload that names the partner (tenant) a job belongs to.
PARTNER_FIELD = "partner_id"
_PARTNER_SCAN_LIMIT = 1024 * 1024


def partner_of(payload: bytes) -> str | None:
    """The partner of a job: ``payload["partner_id"]`` when the payload is a JSON object whose
    ``partner_id`` is a non-blank string of at most 200 characters; otherwise None. Payloads
    over 1 MiB, invalid JSON or absurd nesting are simply "no partner"."""
    if len(payload) > _PARTNER_SCAN_LIMIT or payload.lstrip()[:1] != b"{":
        return None
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    value = data.get(PARTNER_FIELD) if isinstance(data, dict) else None
    if not isinstance(value, str) or not value.strip() or len(value) > 200 or "\x00" in value:
        return None
    try:
        value.encode("utf-8")  # a lone surrogate is no name
    except UnicodeEncodeError:
        return None
    return value


class Store:
    """Fence, dead letters, enqueue and migrations on one database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect: Dialect = db.dialect

    # -- migrations -------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied. Safe to run concurrently."""
        applied: list[int] = []
        async with self.db.transaction() as tx:
            if self.dialect == "postgresql":
                await tx.q("lock_migrations")
            await tx.script(self.db.sql["create_migrations_table"])
            done = {row["version"] for row in await tx.q("applied_migrations")}
            for migration in migrations(self.dialect):
                if migration.version in done:
                    continue
                await tx.script(migration.sql)
                await tx.q(
                    "record_migration", {"version": migration.version, "name": migration.name}
                )
                applied.append(migration.version)
        return applied

    async def schema_version(self) -> int:
        present = await self.db.run("schema_present")
        if not present or not present[0]["present"]:
            return 0
        rows = await self.db.run("schema_version")
        return int(rows[0]["version"])

    async def check_schema(self) -> None:
        have = await self.schema_version()
        need = len(migrations(self.dialect))
        if have < need:
            raise SchemaError(
                f"the database {self.db.display} is at schema version {have}, this jobfence "
                f"needs {need}: run `jobfence migrate --database-url {self.db.display}`"
            )
        if have > need:
            raise SchemaError(
                f"the database {self.db.display} is at schema version {have}, newer than this "
                f"jobfence knows ({need}): upgrade jobfence"
            )

    # -- enqueue ----------------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[OutgoingJob], tx: Tx | None = None) -> None:
        params = [job.params() for job in jobs]
        if tx is not None:
            await self._enqueue_in(tx, params)
            return
        async with self.db.transaction() as own:
            await self._enqueue_in(own, params)

    async def _enqueue_in(self, tx: Tx, params: list[dict[str, Any]]) -> None:
        from .db.postgres import PgTx

        if len(params) == 1:
            await tx.q("enqueue", params[0])
        elif (
            len(params) >= COPY_THRESHOLD
            and isinstance(tx, PgTx)
            and tx.can_copy
            and not any(p["delay"] for p in params)
        ):
            rows = ((p["queue"], p["job_id"], p["correlation_id"], p["payload"]) for p in params)
            await tx.copy("copy_jobs", rows, ["text", "text", "text", "bytea"])
        else:
            await tx.qmany("enqueue", params)

    def enqueue_sync(self, conn: Any, jobs: Sequence[OutgoingJob]) -> None:
        """Enqueue on a caller's *sync* connection (psycopg ``Connection`` or ``sqlite3``),
        inside whatever transaction the caller has open; the caller commits."""
        adopted = SyncConnection(conn, doing="enqueue", dialect=self.dialect)
        adopted.run_many("enqueue", [job.params() for job in jobs])

    # -- dead letters -----------------------------------------------------------------------

    async def write_dead_letter(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        code: str | None,
        *,
        ack: bool,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        tx: Tx | None = None,
    ) -> tuple[int | None, bool]:
        """Record a dead letter (idempotent: one pending letter per consumer and job_id).

        With ``ack`` the queue row goes in the same transaction; with ``tx`` the letter is
        written in that (open) transaction. Returns the letter's id and whether this call
        created it (False: a pending letter for this job was already recorded — its id).
        """
        params = self.dead_letter_params(delivery, consumer, category, error, code, payload_limit)
        if tx is not None:
            return await self._write_dead_letter(tx, params, ack)
        async with self.db.transaction() as own:
            return await self._write_dead_letter(own, params, ack)

    @staticmethod
    async def _write_dead_letter(
        tx: Tx, params: dict[str, Any], ack: bool
    ) -> tuple[int | None, bool]:
        if ack:
            await tx.q("ack", params)
        rows = await tx.q("insert_dead_letter", params)
        if rows:
            return int(rows[0]["id"]), True
        # a separate statement: its snapshot sees a letter that a concurrent transaction
        # committed while the insert waited on it
        existing = await tx.q("dead_letter_pending_id", params)
        return (int(existing[0]["id"]) if existing else None), False

    def dead_letter_params(
        self,
        delivery: Delivery,
        consumer: str,
        category: Category,
        error: str,
        code: str | None,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
    ) -> dict[str, Any]:
        payload = delivery.payload
        return {
            "id": delivery.ref,
            "token": delivery.token,
            "queue": delivery.queue,
            "consumer": consumer,
            "job_id": delivery.job_id,
            "correlation_id": delivery.correlation_id,
            "payload": payload[:payload_limit],
            "payload_size": len(payload),
            "payload_truncated": len(payload) > payload_limit,
            "attempts": delivery.attempt,
            "category": category.value,
            "error_code": code,
            "error": error,
            "history": history_json(delivery.history),
            "enqueued_at": self.db.at(delivery.enqueued_at),
            "partner": partner_of(payload),
        }

    async def list_dead_letters(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        category: str | None = None,
        limit: int = 50,
    ) -> list[DeadLetter]:
        rows = await self.db.run(
            "list_dead_letters",
            {"status": status, "queue": queue, "category": category, "limit": limit},
        )
        return [self._dead_letter(row) for row in rows]

    async def get_dead_letter(self, letter_id: int) -> DeadLetter | None:
        rows = await self.db.run("get_dead_letter", {"id": letter_id})
        return self._dead_letter(rows[0]) if rows else None

    def _dead_letter(self, row: Mapping[str, Any]) -> DeadLetter:
        failed_at = to_datetime(row["failed_at"])
        assert failed_at is not None
        payload = row.get("payload")
        return DeadLetter(
            id=int(row["id"]),
            queue=row["queue"],
            consumer=row["consumer"],
            job_id=row["job_id"],
            correlation_id=row["correlation_id"],
            payload_size=int(row["payload_size"]),
            payload_truncated=bool(row["payload_truncated"]),
            attempts=int(row["attempts"]),
            error_category=row["error_category"],
            error_code=row["error_code"],
            last_error=row["last_error"],
            status=row["status"],
            enqueued_at=to_datetime(row["enqueued_at"]),
            failed_at=failed_at,
            payload=bytes(payload) if payload is not None else None,
            history=history_from(row["history"]) if "history" in row else [],
            partner=row.get("partner"),
            previous_id=row.get("previous_id"),
            reviewed_at=to_datetime(row.get("reviewed_at")),
            reviewed_by=row.get("reviewed_by"),
            review_reason=row.get("review_reason"),
        )

    async def queue_depth(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.db.run("queue_depth")]
