"""What a worker and a relay run on: the app's open database and transport, its observers
and its settings, as one plain value (:class:`Runtime`).

:class:`~jobfence.app.App` is where users register consumers and configure; once open it
builds a :class:`Runtime` (``app.runtime``). :class:`~jobfence.runtime.worker.Worker` and
:class:`~jobfence.outbox.relay.Relay` are given something that opens into one
(:class:`RuntimeSource`, which an ``App`` is) and never import the app: nothing below
``app.py`` depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from .. import tracing
from ..calls.ledger import Ledger
from ..config import DatabaseURL
from ..core.periodic import Periodic
from ..db import Database, WorkSource
from ..observers import Observers
from ..transports import Transport
from .harness import Consumer
from .maintenance import Maintenance


@dataclass(frozen=True)
class Runtime:
    """An open app, as what runs its jobs sees it."""

    db: Database
    transport: Transport
    observers: Observers
    consumers: Mapping[str, Consumer]
    #: what opens each job's transaction: the database, or an ORM's engine
    work: WorkSource
    tracing: tracing.Tracing | None
    fence_ttl: timedelta
    #: how long a claimed job stays claimed without a renewal
    lease: timedelta
    payload_limit: int
    maintenance: Maintenance
    #: the youngest a fence may be when cleanup deletes it (see App.redelivery_exposure)
    redelivery_exposure: timedelta
    #: the call ledger of ``job.call`` (jobfence.calls), opened by the first call
    ledger: Ledger | None = None
    #: False only to measure what the fence costs (the benchmarks' baseline)
    fence_enabled: bool = True
    #: the app's periodic jobs by name (``app.periodic``), which its schedulers enqueue
    periodic: Mapping[str, Periodic] = field(default_factory=dict)


class RuntimeSource(Protocol):
    """What a worker or a relay is given: an :class:`~jobfence.app.App`, or anything that
    opens into a :class:`Runtime` the same way."""

    @property
    def url(self) -> DatabaseURL: ...

    @property
    def consumed_queues(self) -> list[str]: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def runtime(self) -> Runtime:
        """The open app's runtime (RuntimeError when it is not open)."""
        ...

    async def open(self, pool_size: int = 10) -> None: ...

    async def close(self) -> None: ...
