"""The store: the schema and its migrations (apply them, check the version).

The database queue's enqueue is :mod:`jobfence.transports.database`'s; the job on its way
in (:class:`~jobfence.core.jobs.OutgoingJob`) is the core's.

The fence is :mod:`jobfence.core.fence`, dead letters :mod:`jobfence.review.letters`; every
module runs its own aggregate's named queries (``sql/<dialect>/queries*.sql``).
"""

from __future__ import annotations

from .db import Database
from .errors import SchemaError
from .sql import DEFAULT_SCHEMA, Dialect, migrations


class Store:
    """The schema and its migrations on one database."""

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
