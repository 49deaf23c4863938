"""One placeholder style for a handler's SQL on both stores: psycopg's.

``%s`` marks a positional parameter, ``%(name)s`` a named one (``%b``/``%t`` and
``%(name)b``/``%(name)t`` are accepted, as psycopg accepts them), ``%%`` is a literal
percent. Inside string literals, quoted identifiers and comments a ``%`` is text: ``'%s'``
and ``'100%'`` stay as written (``%%`` there is a percent too, as psycopg reads it). Without
parameters (``params=None``) a statement is sent exactly as written, as psycopg does.

On PostgreSQL psycopg reads the placeholders itself; :func:`for_psycopg` only doubles the
percents inside literals and comments so that psycopg leaves them alone. On SQLite
:func:`for_sqlite` rewrites the statement to ``?`` placeholders and the parameters to a
tuple. Both translations are cached per statement text.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..sql import Dialect

#: where a literal, a quoted identifier or a comment starts, per dialect
_OPENERS = {
    "postgresql": re.compile(r"""'|"|--|/\*|[Ee]'|\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$"""),
    "sqlite": re.compile(r"""'|"|`|\[|--|/\*"""),
}
_IDENT_CHAR = re.compile(r"[A-Za-z0-9_$]")
_PLACEHOLDER = re.compile(r"%(?:\((?P<name>[^)]*)\))?(?P<kind>.?)", re.DOTALL)
#: what SQLite itself would read as a parameter (``?``, ``?NNN``, ``:name``, ``@name``,
#: ``$name``), outside literals
_NATIVE = re.compile(r"\?|(?<![A-Za-z0-9_$:])[:@$][A-Za-z_]")


def _closing(sql: str, start: int, opener: str, dialect: Dialect) -> int:
    """The index just past the literal, identifier or comment that ``opener`` starts."""
    body = start + len(opener)
    if opener == "--":
        end = sql.find("\n", body)
        return len(sql) if end < 0 else end + 1
    if opener == "/*":
        if dialect == "sqlite":  # SQLite's comments do not nest
            end = sql.find("*/", body)
            return len(sql) if end < 0 else end + 2
        depth, i = 1, body
        while i < len(sql) and depth:
            if sql.startswith("/*", i):
                depth, i = depth + 1, i + 2
            elif sql.startswith("*/", i):
                depth, i = depth - 1, i + 2
            else:
                i += 1
        return i
    if opener.startswith("$"):
        end = sql.find(opener, body)
        return len(sql) if end < 0 else end + len(opener)
    if opener in ("E'", "e'"):  # PostgreSQL's escape strings: backslash escapes, '' too
        i = body
        while i < len(sql):
            if sql[i] == "\\":
                i += 2
            elif sql[i] == "'":
                if sql.startswith("''", i):
                    i += 2
                else:
                    return i + 1
            else:
                i += 1
        return len(sql)
    close = "]" if opener == "[" else opener
    i = body
    while True:
        end = sql.find(close, i)
        if end < 0:
            return len(sql)
        if close != "]" and sql.startswith(close * 2, end):  # '' "" `` escape themselves
            i = end + 2
            continue
        return end + 1


def segments(sql: str, dialect: Dialect) -> Iterator[tuple[bool, str]]:
    """``sql`` cut into (is_code, text) pieces: code, and the literals, quoted identifiers
    and comments in it (which hold no placeholders)."""
    openers = _OPENERS[dialect]
    pos = 0
    while pos < len(sql):
        match = openers.search(sql, pos)
        # `E'` or `$tag$` inside a name (`some$tag$`, `typE'`) opens nothing
        while (
            match is not None
            and match.group()[0] in "Ee$"
            and match.start() > 0
            and _IDENT_CHAR.match(sql[match.start() - 1])
        ):
            match = openers.search(sql, match.start() + 1)
        if match is None:
            yield True, sql[pos:]
            return
        if match.start() > pos:
            yield True, sql[pos : match.start()]
        end = _closing(sql, match.start(), match.group(), dialect)
        yield False, sql[match.start() : end]
        pos = end


def _unescape_percents(text: str) -> str:
    """Text in a literal or comment as the server should see it: ``%%`` is one percent."""
    return text.replace("%%", "%")


@lru_cache(maxsize=2048)
def for_psycopg(sql: str) -> str:
    """``sql`` for psycopg with parameters: percents inside literals, quoted identifiers and
    comments doubled, so that psycopg reads placeholders in the code only."""
    if "%" not in sql:
        return sql
    return "".join(
        text if code else _unescape_percents(text).replace("%", "%%")
        for code, text in segments(sql, "postgresql")
    )


@dataclass(frozen=True)
class _Translated:
    sql: str
    #: positional placeholders: their count; named ones: their names, in order
    positional: int
    names: tuple[str, ...] | None
    native: bool  # no psycopg placeholder: SQLite's own (``?``, ``:name``) are used as is


def _bad(message: str, sql: str) -> sqlite3.ProgrammingError:
    head = " ".join(sql.split())
    head = head if len(head) <= 120 else head[:117] + "..."
    return sqlite3.ProgrammingError(
        f"{message} (in {head!r}); placeholders: docs/concepts.md#placeholders"
    )


@lru_cache(maxsize=2048)
def _translate(sql: str) -> _Translated:
    out: list[str] = []
    positional, names, native = 0, [], False
    for code, text in segments(sql, "sqlite"):
        if not code:
            out.append(_unescape_percents(text))
            continue
        native = native or _NATIVE.search(text) is not None
        pos = 0
        for match in re.finditer("%", text):
            if match.start() < pos:
                continue  # the second percent of %%
            out.append(text[pos : match.start()])
            ph = _PLACEHOLDER.match(text, match.start())
            assert ph is not None
            kind, name = ph["kind"], ph["name"]
            if kind == "%" and name is None:
                out.append("%")
            elif kind in ("s", "b", "t"):
                out.append("?")
                if name is None:
                    positional += 1
                else:
                    names.append(name)
            elif not kind.isalnum():
                raise _bad(
                    "incomplete placeholder: '%'; write '%%' for a percent (the modulo operator)",
                    sql,
                )
            else:
                raise _bad(
                    f"only '%s', '%(name)s' and '%%' are placeholders, got {ph.group()!r} "
                    "(write '%%' for a literal percent)",
                    sql,
                )
            pos = ph.end()
        out.append(text[pos:])
    if positional and names:
        raise _bad("positional (%s) and named (%(name)s) placeholders cannot be mixed", sql)
    if native and (positional or names):
        raise _bad("SQLite's own placeholders ('?', ':name') cannot be mixed with '%s'", sql)
    if native:
        return _Translated(sql, 0, None, True)
    return _Translated("".join(out), positional, tuple(names) if names else None, False)


def for_sqlite(sql: str, params: Sequence[Any] | Mapping[str, Any] | None) -> tuple[str, Any]:
    """``sql`` and ``params`` as SQLite's driver takes them (``?`` placeholders, a tuple).

    Statements in SQLite's own style (``?``, ``:name``, no ``%`` placeholder) are passed
    through unchanged, so that existing SQLite-only code keeps working; they are not
    portable to PostgreSQL. Raises :class:`sqlite3.ProgrammingError` with a clear message
    when the statement and the parameters do not match."""
    if params is None:
        return sql, ()
    found = _translate(sql)
    if found.native:
        return sql, params
    if found.names is not None:
        if not isinstance(params, Mapping):
            raise _bad("named placeholders (%(name)s) need a mapping of parameters", sql)
        missing = [n for n in dict.fromkeys(found.names) if n not in params]
        if missing:
            raise _bad(f"query parameter missing: {', '.join(missing)}", sql)
        return found.sql, tuple(params[n] for n in found.names)
    if isinstance(params, Mapping):
        if not params and not found.positional:
            return found.sql, ()
        raise _bad("positional placeholders (%s) need a sequence of parameters", sql)
    if isinstance(params, str | bytes):
        raise _bad("parameters must be a sequence or a mapping, not a single string", sql)
    values = tuple(params)
    if len(values) != found.positional:
        raise _bad(
            f"the query has {found.positional} placeholders but {len(values)} "
            "parameters were passed",
            sql,
        )
    return found.sql, values
