"""Work transactions an integration provides: the fence in an ORM's own transaction.

By default a job runs in a transaction jobfence opens on its own connection
(:func:`jobfence.core.fence.work`). An ORM integration (Django) instead *hosts* the work: it opens
the transaction on the ORM's connection, runs jobfence's fence steps there first, lends it to
the handler, checks the boundary and commits — so the ORM's writes and the fence commit or
roll back together (SPEC F2, H5). A synchronous SQLAlchemy engine's ``def`` handlers run
the same way (:class:`jobfence.db.sqlalchemy.SessionHost`). The whole job runs in one worker
thread, because ORM connections belong to the thread that opened them.

The harness keeps every decision: it plans the steps (:func:`jobfence.core.fence.plan`), reads
their outcome (:func:`jobfence.core.fence.outcome`) and handles failures as on its own path; a
host only provides the transaction.
"""

from __future__ import annotations

import inspect
import os
import threading
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..core.fence import FenceOutcome, outcome
from ..db import Row


class HostedWork(Protocol):
    """One open transaction on the integration's connection. (Protocols, so that a host in
    ``db/`` — the synchronous SQLAlchemy engine's — needs no import of this module.)"""

    @abstractmethod
    def run(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        """One of jobfence's named statements inside the transaction; rows as dicts."""

    @abstractmethod
    def lend(self) -> AbstractContextManager[Any]:
        """While the handler runs: yields what the handler receives as its second argument,
        guards the transaction (a handler may not end it), and on a normal exit raises
        :class:`~jobfence.errors.TransactionBoundaryError` if the transaction cannot commit
        with the fence (ended, aborted, or marked for rollback)."""


class WorkHost(Protocol):
    """Where an integration's handlers run their work (see the module's docstring)."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[HostedWork]:
        """Open the transaction (in the calling worker thread); commit when the block ends
        normally, roll back if it raises."""

    def check_handler(self, handler: Callable[..., Any], *, is_async: bool) -> None:
        """Refuse, at registration, a handler this host cannot run (e.g. ``async def``)."""


_writers: dict[str, threading.Lock] = {}
_writers_lock = threading.Lock()


def sqlite_writer(path: str) -> threading.Lock:
    """The process's lock for writing the SQLite file ``path``: a host's threads take it
    around each job's transaction and queue on it in turn, instead of polling SQLite's busy
    handler (which sleeps in growing steps, and let one writer starve the others)."""
    key = os.path.realpath(path)
    with _writers_lock:
        return _writers.setdefault(key, threading.Lock())


class _Lost(Exception):
    """Rolls back the hosted transaction of a delivery whose lease was taken over."""


def run(
    host: WorkHost,
    steps: Sequence[str],
    params: Mapping[str, Any],
    call: Callable[[Any], None],
) -> FenceOutcome:
    """The job's work in ``host``'s transaction: the fence ``steps`` first, then, when the job
    is fenced for the first time, ``call(handler_argument)``; then COMMIT. Runs in a worker
    thread; raises what the handler (or the boundary check) raised, after the rollback."""
    try:
        with host.transaction() as work:
            found = outcome(steps, [work.run(step, params) for step in steps])
            if found is FenceOutcome.LOST:
                raise _Lost
            if found is FenceOutcome.FENCED:
                with work.lend() as lent:
                    call(lent)
            return found
    except _Lost:
        return FenceOutcome.LOST


def wants_session(handler: Any) -> bool:
    """Whether ``handler``'s second parameter is annotated as a SQLAlchemy session
    (``AsyncSession``, ``Session`` or a subclass), without importing SQLAlchemy."""
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) < 2:
        return False
    annotation = params[1].annotation
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1] in ("AsyncSession", "Session")
    return isinstance(annotation, type) and any(
        k.__module__.startswith("sqlalchemy.") and k.__name__ in ("AsyncSession", "Session")
        for k in annotation.__mro__
    )
