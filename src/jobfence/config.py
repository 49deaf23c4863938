"""Database URLs and environment settings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigurationError
from .sql import DEFAULT_SCHEMA, SCHEMA_NAME, Dialect

ENV_DATABASE_URL = "JOBFENCE_DATABASE_URL"
ENV_TRANSPORT_URL = "JOBFENCE_TRANSPORT"
ENV_SCHEMA = "JOBFENCE_SCHEMA"
DEFAULT_DATABASE_URL = "sqlite:///jobfence.db"

#: jobs per group-commit transaction at most: one savepoint each, and PostgreSQL keeps the
#: ids of 64 subtransactions per backend before snapshots overflow to pg_subtrans
MAX_BATCH_SIZE = 64

#: group commit by default: up to this many jobs share a transaction, each in its own
#: savepoint, where the queue is a table in the fence's database (docs/benchmarks.md: one
#: commit for many jobs is what reaches pgbench's one-job transaction and beyond). A consumer
#: declared ``isolated=True`` (or seen taking transaction-wide state) gets one transaction
#: per job; ``batch_size=1`` turns group commit off
DEFAULT_BATCH_SIZE = 50

#: group commit without a backlog: jobs that are ready together share a transaction while
#: their handlers, run one after the other, are expected to take no longer than this many
#: seconds (from the recent time a handler takes); slower handlers get a transaction each
DEFAULT_BATCH_WINDOW = 0.010

_ACCEPTED = "postgresql://user@host:5432/dbname or sqlite:///path/to/file.db"


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed database URL. ``target`` is what the driver gets (conninfo or file path)."""

    dialect: Dialect
    target: str
    display: str
    #: the PostgreSQL schema that holds jobfence's tables (SQLite: always the default)
    schema: str = DEFAULT_SCHEMA

    @property
    def path(self) -> Path:
        if self.dialect != "sqlite":
            raise AttributeError("only SQLite URLs have a path")
        return Path(self.target)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def check_schema_name(schema: str) -> str:
    """``schema`` if jobfence can use it as its PostgreSQL schema; else ConfigurationError."""
    if not isinstance(schema, str) or not SCHEMA_NAME.match(schema):
        raise ConfigurationError(
            f"schema name {schema!r} is not usable: lower-case letters, digits and _, at most "
            "63, not starting with a digit (e.g. jobfence or acme_jobs)"
        )
    return schema


def env_schema() -> str:
    """The PostgreSQL schema from ``$JOBFENCE_SCHEMA``, else ``core``."""
    return check_schema_name(os.environ.get(ENV_SCHEMA) or DEFAULT_SCHEMA)


def parse_database_url(url: str | None, schema: str | None = None) -> DatabaseURL:
    """Parse ``postgresql://…`` or ``sqlite:///…``; raise ConfigurationError saying what to fix.

    ``schema`` places jobfence's tables on PostgreSQL (default ``$JOBFENCE_SCHEMA``, else
    ``core``). SQLite has no schemas: a schema given here is refused, the environment's is
    ignored (a SQLite file is its own namespace).
    """
    if schema is not None:
        check_schema_name(schema)
    if url is None:
        url = os.environ.get(ENV_DATABASE_URL) or DEFAULT_DATABASE_URL
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"empty database URL; expected {_ACCEPTED}")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigurationError(f"{redact(url)!r} is not a database URL; expected {_ACCEPTED}")
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        try:
            parts = urlsplit(url)
            _ = parts.port  # raises on a non-numeric port
        except ValueError as exc:
            raise ConfigurationError(f"bad PostgreSQL URL {redact(url)!r}: {exc}") from None
        if not parts.path.strip("/"):
            raise ConfigurationError(
                f"PostgreSQL URL {redact(url)!r} names no database; add /dbname at the end"
            )
        target = urlunsplit(parts._replace(scheme="postgresql"))
        placed = schema or env_schema()
        return DatabaseURL("postgresql", target, redact(url), placed)
    if scheme == "sqlite":
        if not rest.startswith("/"):
            raise ConfigurationError(
                f"SQLite URL {url!r} needs three slashes: sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        path = rest[1:]
        if "?" in path:
            path = path.split("?", 1)[0]
        if not path or path in (":memory:",) or path.startswith("file::memory:"):
            raise ConfigurationError(
                "SQLite URL must name a file (sqlite:///jobs.db): an in-memory database cannot "
                "be shared by the worker's connections"
            )
        if schema not in (None, DEFAULT_SCHEMA):
            raise ConfigurationError(
                f"SQLite has no schemas (a file is its own namespace): drop the schema "
                f"{schema!r}, or use another file for another set of jobfence tables"
            )
        return DatabaseURL("sqlite", path, url)
    raise ConfigurationError(f"unsupported database URL scheme {scheme!r}; expected {_ACCEPTED}")


def same_database(a: DatabaseURL, b: DatabaseURL) -> bool:
    """Whether two URLs name the same database (same file; same host, port and name)."""
    if a.dialect != b.dialect:
        return False
    if a.dialect == "sqlite":
        return a.path.resolve() == b.path.resolve()
    one, two = urlsplit(a.target), urlsplit(b.target)
    return (one.hostname, one.port or 5432, one.path) == (two.hostname, two.port or 5432, two.path)
