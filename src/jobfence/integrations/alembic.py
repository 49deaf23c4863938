"""jobfence's tables from an Alembic project: one revision of yours applies jobfence's pending
migrations on Alembic's connection, in Alembic's transaction.

.. code-block:: python

    # migrations/versions/2b1f_jobfence.py
    from alembic import op

    import jobfence.integrations.alembic

    revision = "2b1f"
    down_revision = None  # or the revision before it


    def upgrade() -> None:
        jobfence.integrations.alembic.migrate(op.get_bind())


    def downgrade() -> None:
        pass  # jobfence's migrations are forward-only

jobfence records what it applied in its own table (as ``jobfence migrate`` does), so the call
is idempotent: it applies only what is pending, runs beside ``jobfence migrate`` or a worker's
``auto_migrate`` without conflict, and after upgrading jobfence a new revision with the same
body brings the schema up to date. Needs only SQLAlchemy (``jobfence[sqlalchemy]``); it does
not import Alembic. See docs/integrations/sqlalchemy.md#alembic.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from ..config import check_schema_name, env_schema
from ..db.sqlite import split_script
from ..errors import ConfigurationError
from ..sql import DEFAULT_SCHEMA, Dialect, migrations, queries

_DIALECTS: dict[str, Dialect] = {"postgresql": "postgresql", "sqlite": "sqlite"}


def migrate(connection: Connection, *, schema: str | None = None) -> list[int]:
    """Apply jobfence's pending migrations on ``connection`` (Alembic's ``op.get_bind()``, or
    any SQLAlchemy ``Connection``) inside its transaction; the caller commits. ``schema`` is
    the PostgreSQL schema of jobfence's tables (default ``$JOBFENCE_SCHEMA``, else ``core``).
    Returns the versions applied."""
    if not isinstance(connection, Connection):
        raise ConfigurationError(
            f"jobfence.integrations.alembic.migrate takes a SQLAlchemy Connection "
            f"(op.get_bind()), not {type(connection).__name__}; in Alembic's offline mode "
            "(--sql), paste the output of `jobfence migrate --sql` into the revision instead"
        )
    name = connection.dialect.name
    if name not in _DIALECTS:
        raise ConfigurationError(
            f"jobfence's tables live in PostgreSQL or SQLite, not {name} (jobfence migrate)"
        )
    dialect = _DIALECTS[name]
    chosen = (
        check_schema_name(schema or env_schema()) if dialect == "postgresql" else DEFAULT_SCHEMA
    )
    sql = queries(dialect, chosen)

    def script(text: str) -> None:
        # no parameters: the driver runs the text as written (`%` is a percent sign)
        raw = {"no_parameters": True}
        if dialect == "postgresql":
            connection.exec_driver_sql(text, execution_options=raw)
            return
        for statement in split_script(text):  # sqlite3 runs one statement per call
            connection.exec_driver_sql(statement, execution_options=raw)

    def run(name: str, params: dict[str, Any] | None = None) -> list[Any]:
        result = connection.exec_driver_sql(sql[name], params or {})
        return list(result.fetchall()) if result.returns_rows else []

    if dialect == "postgresql":
        run("lock_migrations")  # concurrent migrators wait for each other
    script(sql["create_migrations_table"])
    done = {row[0] for row in run("applied_migrations")}
    applied = []
    for migration in migrations(dialect, chosen):
        if migration.version in done:
            continue
        script(migration.sql)
        run("record_migration", {"version": migration.version, "name": migration.name})
        applied.append(migration.version)
    return applied
