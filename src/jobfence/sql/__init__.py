"""Named SQL, loaded once per dialect from ``<dialect>/queries/<aggregate>.sql`` (jobs, fence,
dead_letters, replays, audit, alerts, leases, ops_tokens, outbox, idempotency, migrations,
clock); the declared schema in ``<dialect>/schema/``; numbered ``<dialect>/migrations/``.

No SQL is built from strings at run time: every runtime statement is a named block here.
The one substitution is made when the files are loaded: on PostgreSQL the schema name
``core`` is a default, and :func:`place` renames it (``--schema`` / ``$JOBFENCE_SCHEMA``), a
name checked against :data:`SCHEMA_NAME` so that it never needs quoting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, LiteralString

Dialect = Literal["postgresql", "sqlite"]

#: where jobfence's tables live on PostgreSQL unless told otherwise
DEFAULT_SCHEMA = "core"
#: a schema name jobfence accepts: an unquoted lower-case PostgreSQL identifier
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_CORE = re.compile(r"\bcore\.")
_CREATE_CORE = re.compile(r"\bSCHEMA IF NOT EXISTS core\b")


def place(text: LiteralString, dialect: Dialect, schema: str) -> LiteralString:
    """``text`` with jobfence's PostgreSQL schema renamed from ``core`` to ``schema`` (SQLite
    has no schemas: a file is its own namespace)."""
    if dialect != "postgresql" or schema == DEFAULT_SCHEMA:
        return text
    if not SCHEMA_NAME.match(schema):
        raise ValueError(f"bad schema name {schema!r}")
    text = _CORE.sub(f"{schema}.", text)
    # the result is jobfence's own SQL with a checked identifier in it (mypy has no
    # LiteralString of its own, so this needs no cast)
    return _CREATE_CORE.sub(f"SCHEMA IF NOT EXISTS {schema}", text)


_SQLITE_MACROS = {
    "{NOW}": "((julianday('now') - 2440587.5) * 86400.0)",
    "{NOW_ISO}": "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
}

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def _read(dialect: Dialect, *parts: str) -> str:
    path = resources.files(__package__).joinpath(dialect)
    for part in "/".join(parts).split("/"):
        path = path.joinpath(part)
    return path.read_text(encoding="utf-8")


def _parts(dialect: Dialect, folder: str) -> list[str]:
    """The ``.sql`` files of ``<dialect>/<folder>/``, in name order."""
    entries = resources.files(__package__).joinpath(dialect, folder).iterdir()
    return sorted(f"{folder}/{e.name}" for e in entries if e.name.endswith(".sql"))


@cache
def queries(dialect: Dialect, schema: str = DEFAULT_SCHEMA) -> dict[str, LiteralString]:
    """All named queries of a dialect: ``<dialect>/queries/<aggregate>.sql`` (tables in
    ``schema`` on PostgreSQL)."""
    found: dict[str, LiteralString] = {}
    for part in _parts(dialect, "queries"):
        text = _read(dialect, part)
        if dialect == "sqlite":
            for macro, expansion in _SQLITE_MACROS.items():
                text = text.replace(macro, expansion)
        matches = list(_NAME.finditer(text))
        for index, match in enumerate(matches):
            end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
            if match.group(1) in found:
                raise RuntimeError(f"duplicate query name {match.group(1)!r} in {dialect}/{part}")
            found[match.group(1)] = place(text[match.end() : end].strip(), dialect, schema)
    return found


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: LiteralString


@cache
def migrations(dialect: Dialect, schema: str = DEFAULT_SCHEMA) -> tuple[Migration, ...]:
    """The numbered migrations of a dialect, in order (tables in ``schema`` on PostgreSQL)."""
    folder = resources.files(__package__).joinpath(dialect, "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append(
                Migration(
                    int(match.group(1)),
                    match.group(2),
                    place(entry.read_text(encoding="utf-8"), dialect, schema),
                )
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n: {versions}")
    return tuple(found)


def declared_schema(dialect: Dialect, schema: str = DEFAULT_SCHEMA) -> LiteralString:
    """The declared schema: ``<dialect>/schema/*.sql``, in name order."""
    text = "\n".join(_read(dialect, part) for part in _parts(dialect, "schema"))
    return place(text, dialect, schema)


def migration_script(dialect: Dialect, schema: str = DEFAULT_SCHEMA, after: int = 0) -> str:
    """The migrations after version ``after`` as one SQL script, for teams that apply schema
    changes with their own tool (Alembic, Flyway, sqitch): one transaction, each migration
    followed by the row that records it, so ``jobfence`` sees the version it expects."""
    named = queries(dialect, schema)
    pending = [m for m in migrations(dialect, schema) if m.version > after]
    where = f'schema "{schema}"' if dialect == "postgresql" else "one SQLite file"
    lines = [
        f"-- jobfence migrations {after + 1}..{after + len(pending)} for {dialect} ({where})",
        "-- generated by `jobfence migrate --sql`; apply as one transaction",
        "BEGIN;",
        named["create_migrations_table"].strip().rstrip(";") + ";",
    ]
    for m in pending:
        record = named["record_migration"]
        for key, literal in (("version", str(m.version)), ("name", f"'{m.name}'")):
            record = record.replace(f"%({key})s", literal).replace(f":{key}", literal)
        lines += ["", f"-- {m.version:04d}_{m.name}", m.sql.strip(), record.strip() + ";"]
    lines += ["", "COMMIT;", ""]
    return "\n".join(lines)
