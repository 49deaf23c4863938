"""SQLite: a handler that writes the job's own file through a second connection.

While a handler runs, its job's transaction holds the SQLite file's only write lock (the
fence is written first, SPEC F2). A write through *another* connection to the same file —
a second SQLAlchemy engine, a second Django database alias — waits for that lock, which is
released only when the handler returns: it can never succeed. Rather than fail every attempt
with "database is locked" until the job is dead-lettered, the first attempt fails with
:func:`second_connection` (NON_RETRYABLE, code ``DB_SECOND_CONNECTION``), which says why.

:data:`lent_file` names the file whose write lock the current job holds while its handler
runs (set by every SQLite work transaction: jobfence's own, a SQLAlchemy engine's, Django's);
:func:`watch_sqlalchemy` makes every SQLAlchemy engine of the process report such a write
(an engine-class ``handle_error`` listener, consulted only when a statement fails); the
Django integration compares its other open aliases itself.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import NonRetryableError
from .translate import is_locked

#: the SQLite file (real path) whose write lock the current job's transaction holds while
#: its handler runs; None outside a handler (and on PostgreSQL)
lent_file: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobfence_sqlite_lent_file", default=None
)

CODE = "DB_SECOND_CONNECTION"


def real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


@contextmanager
def lending(path: str | os.PathLike[str]) -> Iterator[None]:
    """While a handler holds the job's transaction on the SQLite file ``path``."""
    if "sqlalchemy" in sys.modules:
        watch_sqlalchemy()
    token = lent_file.set(real(path))
    try:
        yield
    finally:
        lent_file.reset(token)


def second_connection(path: str, how: str = "a second connection") -> NonRetryableError:
    return NonRetryableError(
        f"the handler wrote to the SQLite file {path} through {how} while the job's own "
        "transaction holds that file's only write lock (until the handler returns): such a "
        "write can never succeed, so the job fails at once instead of retrying. Write "
        "through the transaction jobfence lends the handler (its `tx` or `session`), whose "
        "work commits with the job's fence",
        code=CODE,
    )


def check(exc: BaseException, path: str | os.PathLike[str] | None, how: str) -> None:
    """Raise :func:`second_connection` if ``exc`` is SQLite's "database is locked" for a write
    to ``path`` while the current job holds that file's write lock."""
    held = lent_file.get()
    if path is None or held is None or real(path) != held:
        return
    if is_locked(exc):
        raise second_connection(held, how) from exc


_watching = False


def watch_sqlalchemy() -> None:
    """Once per process: every SQLAlchemy engine reports a write to the lent file."""
    global _watching
    if _watching:
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "handle_error", _on_error)
    _watching = True


def _on_error(context: Any) -> None:
    engine = context.engine
    if engine is None or engine.dialect.name != "sqlite":
        return
    path = engine.url.database
    if not path or path == ":memory:":
        return
    conn = context.connection
    try:
        if conn is not None and conn.info.get("jobfence.guard") is not None:
            return  # the job's own (lent) connection
    except Exception:  # an invalidated connection has no info
        return
    check(context.original_exception, path, f"a second SQLAlchemy engine ({engine.url})")
