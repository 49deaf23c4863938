"""The store: schema migrations (apply, check the version) and enqueue into the database
queue (one job, a batch — COPY on PostgreSQL — or in the caller's transaction).

The fence is :mod:`jobfence.core.fence`, dead letters :mod:`jobfence.review.letters`; every
module runs its own aggregate's named queries (``sql/<dialect>/queries*.sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .core.jobs import partner_of
from .db import Database, Tx
from .db.adopt import SyncConnection
from .errors import SchemaError
from .sql import DEFAULT_SCHEMA, Dialect, migrations

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
    #: the W3C trace context it travels with (:func:`jobfence.core.jobs.trace_context_of`)
    trace_context: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "job_id": self.job_id,
            "payload": self.payload,
            "correlation_id": self.correlation_id,
            "delay": float(self.delay),
            "partner": partner_of(self.payload),
            "trace_context": self.trace_context,
        }


class Store:
    """Migrations and enqueue on one database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect: Dialect = db.dialect

    # -- migrations -------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied. Safe to run concurrently.

        A schema already at this code's version is checked read-only first: on SQLite the
        write lock (held by a running job's transaction for as long as its handler works) is
        taken only when there is something to apply, so a command that only reads never
        waits for it."""
        if await self.schema_version() == len(migrations(self.dialect, self.db.url.schema)):
            return []
        applied: list[int] = []
        async with self.db.transaction() as tx:
            if self.dialect == "postgresql":
                await tx.q("lock_migrations")
            await tx.script(self.db.sql["create_migrations_table"])
            done = {row["version"] for row in await tx.q("applied_migrations")}
            for migration in migrations(self.dialect, self.db.url.schema):
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
        need = len(migrations(self.dialect, self.db.url.schema))
        if have < need:
            raise SchemaError(
                f"the database {self.db.display} is at schema version {have}, this jobfence "
                f"needs {need}: run `jobfence migrate --database-url {self.db.display}"
                + (
                    f" --schema {self.db.url.schema}`"
                    if self.db.url.schema != DEFAULT_SCHEMA
                    else "`"
                )
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
        if len(params) == 1:
            await tx.q("enqueue", params[0])
        elif len(params) >= COPY_THRESHOLD and tx.can_copy and not any(p["delay"] for p in params):
            rows = (
                (
                    p["queue"],
                    p["job_id"],
                    p["correlation_id"],
                    p["payload"],
                    p["partner"],
                    p["trace_context"],
                )
                for p in params
            )
            await tx.copy("copy_jobs", rows, ["text", "text", "text", "bytea", "text", "text"])
        else:
            await tx.qmany("enqueue", params)

    def enqueue_sync(self, conn: Any, jobs: Sequence[OutgoingJob]) -> None:
        """Enqueue on a caller's *sync* connection (psycopg ``Connection`` or ``sqlite3``),
        inside whatever transaction the caller has open; the caller commits."""
        adopted = SyncConnection(
            conn, doing="enqueue", dialect=self.dialect, schema=self.db.url.schema
        )
        adopted.run_many("enqueue", [job.params() for job in jobs])
