"""The listeners that watch a SQLAlchemy connection jobfence lent a handler (SPEC H5).

Installed once per engine (:func:`watch`): while a handler holds the job's connection,
ending its transaction is refused (``connection.commit()``/``rollback()``, COMMIT text), a
failed statement is noted, and the session's savepoints are followed — the one rule of
docs/concepts.md: a caught failed statement is ``TX_ABORTED``, work rolled back that the
handler had not scoped itself (``session.rollback()``) is ``TX_ROLLBACK_ONLY``, a savepoint
the handler opened (``session.begin_nested()``) undoes its block alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import Connection, Engine, event

from ..errors import TransactionBoundaryError
from . import TxGuard, refusal

#: where a lent connection carries its guard (``Connection.info``, the pooled connection's)
_GUARD = "jobfence.guard"


def watch(engine: Engine) -> None:
    """Install, once per engine, the listeners that watch a lent connection while a handler
    runs: transaction control on it is refused (the job fails, whatever the handler does with
    the error). Engine-wide listeners cost a dictionary lookup on the engine's other
    connections; listening on each job's ``Connection`` instead cost ~130 µs a job."""
    if getattr(engine, "_jobfence_watched", False):
        return
    event.listen(engine, "commit", _on_commit)
    event.listen(engine, "rollback", _on_rollback)
    event.listen(engine, "before_cursor_execute", _on_statement)
    event.listen(engine, "after_cursor_execute", _on_executed)
    event.listen(engine, "handle_error", _on_error)
    engine._jobfence_watched = True  # type: ignore[attr-defined]


#: the savepoints open on a lent connection while its handler runs: (name, guard depth)
_SAVEPOINTS = "jobfence.savepoints"


def lend(conn: Connection, guard: TxGuard) -> None:
    conn.info[_GUARD] = guard
    conn.info[_SAVEPOINTS] = []


def unlend(conn: Connection) -> None:
    with contextlib.suppress(Exception):  # an invalidated connection has no info
        conn.info.pop(_GUARD, None)
        conn.info.pop(_SAVEPOINTS, None)


def _on_error(context: Any) -> None:
    """A statement failed on a lent connection: note it (SPEC H5). On SQLite the failed
    statement alone is undone and the transaction would commit around it; with the session's
    own bookkeeping (a failed flush rolls its savepoint back) a caught error would otherwise
    end as a commit without the work, or as SQLAlchemy's ``PendingRollbackError``."""
    conn = context.connection
    if conn is None:
        return
    with contextlib.suppress(Exception):
        guard: TxGuard | None = conn.info.get(_GUARD)
        exc = context.original_exception
        if guard is not None and guard.active and not isinstance(exc, TransactionBoundaryError):
            savepoints = conn.info.get(_SAVEPOINTS) or []
            guard.orm_failures.append((len(savepoints), f"{type(exc).__name__}: {exc}".strip()))


def _on_executed(conn: Connection, _cur: Any, statement: str, *_: Any) -> None:
    """Follow the savepoints the session sets on a lent connection. The first one open is the
    session's own (``join_transaction_mode="create_savepoint"``: jobfence's, not the
    handler's): rolling it back (``session.rollback()``, or SQLAlchemy after a failed flush)
    undoes work the handler did not scope itself. Rolling back a savepoint the handler opened
    (``session.begin_nested()``) undoes its block alone, failed statements included."""
    if statement[:1] not in "SsRr":
        return
    guard: TxGuard | None = conn.info.get(_GUARD)
    if guard is None or not guard.active:
        return
    words = statement.replace('"', " ").split()
    if len(words) < 2:
        return
    verb = words[0].upper()
    stack: list[str] = conn.info.setdefault(_SAVEPOINTS, [])
    if verb == "SAVEPOINT":
        stack.append(words[1])
        return
    if verb not in ("ROLLBACK", "RELEASE") or words[-1] not in stack:
        return
    depth = stack.index(words[-1]) + 1
    del stack[depth - 1 :]
    if verb == "RELEASE":
        guard.orm_failures = [(min(d, depth - 1), e) for d, e in guard.orm_failures]
    elif depth == 1:
        guard.rolled_back = guard.rolled_back or "session.rollback()"
    else:
        guard.orm_failures = [f for f in guard.orm_failures if f[0] < depth]


def _refuse(conn: Connection, verb: str) -> None:
    guard: TxGuard | None = conn.info.get(_GUARD)
    if guard is not None and guard.active:
        guard.refused = guard.refused or verb
        raise refusal(verb)


def _on_commit(conn: Connection) -> None:
    _refuse(conn, "COMMIT (connection.commit())")


def _on_rollback(conn: Connection) -> None:
    _refuse(conn, "ROLLBACK (connection.rollback())")


def _on_statement(conn: Connection, _cur: Any, statement: str, *_: Any) -> None:
    guard: TxGuard | None = conn.info.get(_GUARD)
    if guard is not None:
        guard.screen(statement)
