"""Named SQL, loaded once per dialect from ``<dialect>/queries/<aggregate>.sql`` (jobs, fence,
dead_letters, replays, audit, alerts, leases, ops_tokens, outbox, idempotency, migrations,
clock); the declared schema in ``<dialect>/schema/``; numbered ``<dialect>/migrations/``.

No SQL is built from strings at run time: every runtime statement is a named block here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, LiteralString

Dialect = Literal["postgresql", "sqlite"]

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
def queries(dialect: Dialect) -> dict[str, LiteralString]:
    """All named queries of a dialect: ``<dialect>/queries/<aggregate>.sql``."""
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
            found[match.group(1)] = text[match.end() : end].strip()
    return found


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: LiteralString


@cache
def migrations(dialect: Dialect) -> tuple[Migration, ...]:
    """The numbered migrations of a dialect, in order."""
    folder = resources.files(__package__).joinpath(dialect, "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append(
                Migration(
                    int(match.group(1)),
                    match.group(2),
                    entry.read_text(encoding="utf-8"),
                )
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n: {versions}")
    return tuple(found)


def declared_schema(dialect: Dialect) -> LiteralString:
    """The declared schema: ``<dialect>/schema/*.sql``, in name order."""
    return "\n".join(_read(dialect, part) for part in _parts(dialect, "schema"))
