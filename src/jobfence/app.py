"""The application object: where consumers are registered and jobs are enqueued."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from datetime import timedelta
from typing import Any, TypeVar

from . import tracing
from .calls.ledger import Ledger
from .config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BATCH_WINDOW,
    DatabaseURL,
    check_schema_name,
    parse_database_url,
    same_database,
)
from .core import fence
from .core.codec import Decoder, Schema
from .core.fence import DEFAULT_FENCE_TTL
from .core.jobs import DEFAULT_PRIORITY, OutgoingJob, check_queue, outgoing_job
from .core.leases import default_holder
from .core.limits import Limit, check_limit
from .core.periodic import DEFAULT_GRACE, Missed, Periodic
from .core.retry import DEFAULT_POLICY, RetryPolicy
from .db import Database, SyncTx, Tx, WorkSource, connect, current_tx
from .db.adopt import adopt_async, connect_sync
from .errors import ConfigurationError, EnqueueError, extra_needed
from .logs import LogObserver
from .metrics import MetricsObserver
from .observers import Observer, Observers
from .review.letters import DEFAULT_PAYLOAD_LIMIT
from .runtime.context import Runtime
from .runtime.harness import Consumer, Handler
from .runtime.hosted import wants_session
from .runtime.maintenance import Maintenance
from .runtime.worker import Worker
from .store import Store
from .transports import Transport, broker_from_url, check_payload_sizes, is_broker_url
from .transports import database as database_queue
from .transports.database import database_max_payload, database_max_payload_reason

H = TypeVar("H", bound=Handler)

DEFAULT_LEASE = timedelta(seconds=30)


def _one_of(connection: Any, session: Any) -> Any:
    if connection is not None and session is not None:
        raise EnqueueError("pass connection= or session=, not both")
    return session if session is not None else connection


def _check_database_payloads(jobs: Sequence[OutgoingJob], dialect: str) -> None:
    """The database queue's size limit, for enqueues that write the table directly."""
    check_payload_sizes(
        jobs, database_max_payload(dialect), dialect, database_max_payload_reason(dialect)
    )


class App:
    """A jobfence application.

    ``database_url`` holds the fence and dead letters (and, by default, the queue):
    ``postgresql://…`` or ``sqlite:///file.db``; default ``$JOBFENCE_DATABASE_URL`` or
    ``sqlite:///jobfence.db``. ``schema`` is the PostgreSQL schema of jobfence's tables
    (default ``$JOBFENCE_SCHEMA``, else ``core``). ``transport`` is another queue (a URL or a
    :class:`~jobfence.transports.Transport`); by default the queue is a table next to the
    fence, and acks commit with the work. ``maintenance`` sets what workers do in the
    background: fence cleanup, alert delivery (:class:`~jobfence.runtime.maintenance.Maintenance`).

    ``engine``: a SQLAlchemy ``AsyncEngine`` or ``Engine`` (``pip install
    'jobfence[sqlalchemy]'``): each job's transaction runs on it, and a handler gets an ORM
    session joined to it (``async def handle(job, session: AsyncSession)`` or ``tx.session``;
    on a synchronous engine ``def handle(job, session: Session)``, in a worker thread); the
    database URL defaults to the engine's. ``session_options`` go to each such session. See
    docs/integrations/sqlalchemy.md.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        engine: Any = None,
        session_options: dict[str, Any] | None = None,
        schema: str | None = None,
        transport: str | Transport | None = None,
        fence_ttl: timedelta = DEFAULT_FENCE_TTL,
        lease: timedelta = DEFAULT_LEASE,
        payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
        auto_migrate: bool | None = None,
        observers: Sequence[Observer] = (),
        maintenance: Maintenance | None = None,
        trace: bool = True,
    ) -> None:
        self._engine_work: Any = None
        #: a synchronous engine's host (``def`` handlers with a ``Session``, in a thread)
        self._session_host: Any = None
        if engine is not None:
            with extra_needed("sqlalchemy", "App(engine=…)"):
                from .db.sqlalchemy import EngineWork, SessionHost, is_sync_engine
                from .db.sqlalchemy import database_url as engine_url
            own = parse_database_url(engine_url(engine), schema)
            if database_url is not None and not same_database(
                parse_database_url(database_url), own
            ):
                raise ConfigurationError(
                    f"the database URL {parse_database_url(database_url).display} is not the "
                    f"engine's database ({own.display}): the fence must be written in the "
                    "transaction of the handler's work; drop the URL, or pass the same database"
                )
            database_url = database_url or engine_url(engine)
            if is_sync_engine(engine):
                self._session_host = SessionHost(
                    engine, schema=own.schema, session_options=session_options
                )
            else:
                self._engine_work = EngineWork(
                    engine, schema=own.schema, session_options=session_options
                )
        self.url: DatabaseURL = parse_database_url(database_url, schema)
        if lease <= timedelta(0):
            raise ConfigurationError("lease must be a positive duration")
        if payload_limit < 1024:
            raise ConfigurationError("payload_limit must be at least 1024 bytes")
        self.fence_ttl = fence_ttl
        self.lease = lease
        self.payload_limit = payload_limit
        self.auto_migrate = self.url.dialect == "sqlite" if auto_migrate is None else auto_migrate
        #: SQLite: how long a write waits for the file's one write lock before it fails with
        #: DatabaseLocked (None: 30 s). Short commands of the CLI bound it (docs/operations.md)
        self.lock_timeout: float | None = None
        self.consumers: dict[str, Consumer] = {}
        #: the periodic jobs by name (``app.periodic``)
        self.periodic_jobs: dict[str, Periodic] = {}
        self._extra_observers = list(observers)
        #: OpenTelemetry spans and trace context (docs/tracing.md): None without the ``otel``
        #: extra or with ``trace=False``, and then nothing traces
        self.tracing: tracing.Tracing | None = tracing.get() if trace else None
        self.maintenance = maintenance or Maintenance()
        self.observers = Observers([])
        #: the call ledger of ``job.call`` (jobfence.calls), opened by the first call
        self.ledger = Ledger(self.url, self.observers, self.tracing)
        self.worker_id = default_holder()
        self._db: Database | None = None
        self._transport: Transport | None = None
        self._owned: list[Database] = []
        self._open_lock: asyncio.Lock | None = None
        # Benchmarks only (bench/throughput.py measures what the fence costs). Turning the
        # fence off removes the effectively-once guarantee; nothing else ever sets this.
        self._fence_enabled = True
        self._runtime: Runtime | None = None
        self._transport_spec: str | Transport | None = None
        if transport is not None:
            self.use_transport(transport)
        self._check_ttl()

    def use_database(self, database_url: str | None, *, schema: str | None = None) -> None:
        """Point a not-yet-open app at another database and/or schema (what ``--database-url``
        and ``--schema`` do to an app given with ``--app``)."""
        if self.is_open:
            raise ConfigurationError("cannot change the database of an open app")
        from_engine = self._engine_work is not None or self._session_host is not None
        if from_engine and (database_url is not None or schema is not None):
            raise ConfigurationError(
                "this app is built from a SQLAlchemy engine: its database is the engine's "
                "(drop --database-url / --schema)"
            )
        if database_url is not None:
            self.url = parse_database_url(database_url, schema)
            self.auto_migrate = self.url.dialect == "sqlite"
        elif schema is not None and schema != self.url.schema:
            if self.url.dialect != "postgresql":
                parse_database_url(self.url.display, schema)  # raises: SQLite has no schemas
            self.url = dataclasses.replace(self.url, schema=check_schema_name(schema))

    def use_transport(self, transport: str | Transport) -> None:
        """Set the queue: a broker URL (amqp://, nats://, redis://), another database URL, or
        a :class:`~jobfence.transports.Transport`. The fence and dead letters stay in the
        database."""
        if self.is_open:
            raise ConfigurationError("cannot change the transport of an open app")
        if isinstance(transport, str):
            if not is_broker_url(transport):
                parse_database_url(transport)  # fail early, in one line, on a bad URL
        elif not isinstance(transport, Transport):
            raise ConfigurationError(
                f"transport must be a URL or a Transport, got {type(transport).__name__}"
            )
        self._transport_spec = transport

    # -- registration -----------------------------------------------------------------------

    def consumer(
        self,
        queue: str,
        *,
        schema: Schema = None,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        isolated: bool = False,
        limit: Limit | None = None,
    ) -> Callable[[H], H]:
        """Register ``handler(job, tx)`` for ``queue``.

        ``schema``: a pydantic model class, a JSON Schema dict, ``bytes`` (raw) or None (any
        JSON). ``name`` is the consumer name the fence is keyed on (default: the queue).
        ``retry`` overrides the default policy; it must carry a justification.
        ``isolated=True``: each job gets a transaction of its own, never a share of a group
        commit (for handlers that hold transaction-wide state: ``SET LOCAL``, advisory or
        table locks, hot rows other jobs wait on, ``COPY``; see docs/concepts.md).
        ``limit``: a :class:`~jobfence.Limit` — at most ``concurrency`` jobs running at once
        and ``rate`` starts per period, per key, across every worker (docs/flow-control.md).
        """
        check_queue(queue)
        flow_limit = check_limit(limit)
        if queue in self.consumers:
            raise ConfigurationError(f"queue {queue!r} already has a consumer")
        policy = retry or DEFAULT_POLICY
        if not isinstance(policy, RetryPolicy):
            raise ConfigurationError(f"retry must be a RetryPolicy, got {type(policy).__name__}")
        decoder = Decoder(schema)

        def register(handler: H) -> H:
            if not callable(handler):
                raise ConfigurationError("@app.consumer must decorate a function")
            session = wants_session(handler)
            if session:
                self._check_session_handler(queue, handler)
            elif self._session_host is not None:
                raise ConfigurationError(
                    f"the handler of {queue!r}: on an app built from a synchronous Engine, "
                    "handlers are `def handle(job, session: Session)` (annotate the session; "
                    "raw SQL: session.execute(text(...)))"
                )
            self._runtime = None
            self.consumers[queue] = Consumer(
                queue=queue,
                name=name or queue,
                handler=handler,
                decoder=decoder,
                policy=policy,
                wants_session=session,
                host=self._session_host,
                isolated=isolated,
                limit=flow_limit,
            )
            self._check_ttl()
            return handler

        return register

    def periodic(
        self,
        name: str,
        *,
        cron: str,
        queue: str,
        payload: Any = None,
        tz: str = "UTC",
        missed: Missed = "last",
        grace: timedelta = DEFAULT_GRACE,
    ) -> Periodic:
        """Enqueue a job on ``queue`` at every tick of ``cron`` (five fields, or six with
        seconds first) read in the time zone ``tz`` (an IANA name).

        Each tick's job_id is ``<name>:<slot>``, the slot being the tick's instant in UTC
        (``nightly:2026-12-04T02:00:00Z``), so any number of schedulers — every worker runs
        one, ``jobfence scheduler`` runs one alone — make one run per tick. ``payload`` is the
        jobs' payload, or a function of the slot (an aware UTC datetime) that returns it.
        ``missed`` says what happens to ticks older than ``grace`` when a scheduler gets to
        them (no scheduler ran): ``"last"`` runs the latest once, ``"skip"`` none, ``"all"``
        each (at most the latest 1000). See docs/periodic-jobs.md."""
        if name in self.periodic_jobs:
            raise ConfigurationError(f"periodic job {name!r} is already defined")
        job = Periodic(
            name=name, cron=cron, queue=queue, payload=payload, tz=tz, missed=missed, grace=grace
        )
        if not callable(payload):
            try:
                outgoing_job(queue, payload)
            except EnqueueError as exc:
                raise ConfigurationError(f"periodic job {name!r}: {exc}") from None
        self.periodic_jobs[name] = job
        self._runtime = None
        return job

    @property
    def consumed_queues(self) -> list[str]:
        """The queues this app's consumers serve, sorted."""
        return sorted(self.consumers)

    def serves(self, queue: str) -> bool:
        """Whether one of this app's consumers takes jobs from ``queue`` (a job enqueued
        anywhere else waits until some other app serves its queue)."""
        return queue in self.consumers

    def _check_session_handler(self, queue: str, handler: Any) -> None:
        if self._session_host is not None:
            return  # SessionHost.check_handler refuses `async def`
        if self._engine_work is None:
            raise ConfigurationError(
                f"the handler of {queue!r} takes an ORM session: build the app from your "
                "SQLAlchemy engine, jobfence.App(engine=engine) (docs/integrations/sqlalchemy.md)"
            )
        if not inspect.iscoroutinefunction(handler):
            raise ConfigurationError(
                f"the handler of {queue!r} takes a session: make it `async def handle(job, "
                "session: AsyncSession)` (the app's engine is an AsyncEngine)"
            )

    @property
    def work_source(self) -> WorkSource:
        """What opens each job's transaction: the app's database, or its SQLAlchemy engine."""
        return self._engine_work if self._engine_work is not None else self.db

    def redelivery_exposure(self) -> timedelta:
        """The longest time a delivery of one of this app's jobs can still arrive (the
        longest retry window plus a lease per attempt, see :func:`jobfence.core.fence.exposure`):
        the youngest a fence may be when cleanup deletes it."""
        policies = [c.policy for c in self.consumers.values()] or [DEFAULT_POLICY]
        return fence.longest_exposure(policies, self.lease)

    def _check_ttl(self) -> None:
        policies = [(c.queue, c.policy) for c in self.consumers.values()] or [
            ("(default)", DEFAULT_POLICY)
        ]
        problem = fence.ttl_problem(self.fence_ttl, self.lease, policies)
        if problem:
            raise ConfigurationError(problem)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def runtime(self) -> Runtime:
        """What a worker or a relay runs on: the open database and transport, the observers
        and the settings, as one value (they take that, never the app)."""
        cached = self._runtime
        if (
            cached is not None
            and cached.db is self.db
            and cached.fence_enabled == self._fence_enabled
            and cached.ledger is self.ledger
        ):
            return cached
        self._runtime = Runtime(
            db=self.db,
            transport=self.transport,
            observers=self.observers,
            consumers=self.consumers,
            work=self.work_source,
            tracing=self.tracing,
            fence_ttl=self.fence_ttl,
            lease=self.lease,
            payload_limit=self.payload_limit,
            maintenance=self.maintenance,
            redelivery_exposure=self.redelivery_exposure(),
            ledger=self.ledger,
            fence_enabled=self._fence_enabled,
            periodic=dict(self.periodic_jobs),
        )
        return self._runtime

    @property
    def db(self) -> Database:
        if self._db is None:
            raise RuntimeError("the app is not open: use `async with app:` or `await app.open()`")
        return self._db

    @property
    def store(self) -> Store:
        return Store(self.db)

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise RuntimeError("the app is not open: use `async with app:` or `await app.open()`")
        return self._transport

    async def open(self, pool_size: int = 10) -> None:
        """Connect (and migrate SQLite, or check the PostgreSQL schema)."""
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._db is not None:
                return
            db, transport = await self._connect(pool_size, self._owned)
            if self._engine_work is not None:
                self._engine_work.db = db
            consumers = {q: c.name for q, c in self.consumers.items()}
            self.observers = Observers(
                [MetricsObserver(consumers), LogObserver(), *self._extra_observers]
                + ([self.tracing] if self.tracing is not None else [])
            )
            self.ledger = Ledger(self.url, self.observers, self.tracing)
            self._db, self._transport = db, transport

    async def _connect(self, pool_size: int, owned: list[Database]) -> tuple[Database, Transport]:
        """The app's database, prepared, and its transport (a second queue database goes to
        ``owned``, which the caller closes)."""
        db = connect(self.url, lock_timeout=self.lock_timeout)
        await db.open(max_size=pool_size)
        try:
            await self._prepare(db)
            return db, await self._make_transport(db, pool_size, owned)
        except BaseException:
            for other in owned:
                await other.close()
            owned.clear()
            await db.close()
            raise

    @asynccontextmanager
    async def _one_call(self) -> AsyncIterator[Transport]:
        """The transport for one call of an app that is not open: connected for the call and
        closed before it returns, so nothing it opened (a pool, SQLite's connection thread, a
        broker connection) outlives the call or keeps the process from exiting."""
        owned: list[Database] = []
        db, transport = await self._connect(1, owned)
        try:
            yield transport
        finally:
            try:
                await transport.close()
            finally:
                for other in owned:
                    await other.close()
                await db.close()

    async def _prepare(self, db: Database) -> None:
        store = Store(db)
        if self.auto_migrate:
            await store.migrate()
        else:
            await store.check_schema()

    async def _make_transport(
        self, db: Database, pool_size: int, owned: list[Database]
    ) -> Transport:
        spec = self._transport_spec
        if isinstance(spec, Transport):
            await spec.open()
            return spec
        if spec is not None and is_broker_url(spec):
            broker = broker_from_url(spec, lease=self.lease, worker_id=self.worker_id)
            await broker.open()
            return broker
        if spec is None or parse_database_url(spec).target == self.url.target:
            return database_queue.queue_in(
                db, fence_db=db, lease=self.lease, worker_id=self.worker_id
            )
        other = connect(parse_database_url(spec), lock_timeout=self.lock_timeout)
        await other.open(max_size=pool_size)
        owned.append(other)
        await self._prepare(other)
        return database_queue.queue_in(
            other, fence_db=db, lease=self.lease, worker_id=self.worker_id
        )

    async def close(self) -> None:
        await self.ledger.close()
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        for other in self._owned:
            await other.close()
        self._owned.clear()
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self) -> list[int]:
        """Apply pending migrations to the database (idempotent); return what was applied."""
        db = connect(self.url, lock_timeout=self.lock_timeout)
        await db.open(max_size=1)
        try:
            return await Store(db).migrate()
        finally:
            await db.close()

    # -- enqueue ----------------------------------------------------------------------------

    @staticmethod
    def job(
        queue: str,
        payload: Any,
        *,
        job_id: str | None = None,
        correlation_id: str | None = None,
        delay: timedelta | float | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> OutgoingJob:
        """Validate and encode one job (what ``enqueue`` does before it writes)."""
        return outgoing_job(
            queue,
            payload,
            job_id=job_id,
            correlation_id=correlation_id,
            delay=delay,
            priority=priority,
        )

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        job_id: str | None = None,
        correlation_id: str | None = None,
        delay: timedelta | float | None = None,
        priority: int = DEFAULT_PRIORITY,
        connection: Any = None,
        session: Any = None,
    ) -> str:
        """Enqueue one job; return its job_id.

        ``priority``: 0 (the default) to 9, higher runs first (docs/flow-control.md
        "Priorities"; a broker without priorities refuses any but 0).

        With ``connection`` (a handler's ``tx``, a psycopg ``AsyncConnection`` or an aiosqlite
        ``Connection`` in an open transaction) or ``session`` (a SQLAlchemy ``AsyncSession``)
        the job is written in that transaction and exists only if it commits.
        """
        job = self.job(
            queue,
            payload,
            job_id=job_id,
            correlation_id=correlation_id,
            delay=delay,
            priority=priority,
        )
        await self.enqueue_many([job], connection=connection, session=session)
        return job.job_id

    async def enqueue_many(
        self, jobs: Sequence[OutgoingJob], *, connection: Any = None, session: Any = None
    ) -> None:
        """Enqueue jobs made with :meth:`job` in one transaction (or in ``connection``'s or
        ``session``'s)."""
        if not jobs:
            return
        jobs = self._keyed(jobs)
        connection = _one_of(connection, session)
        if connection is None:
            if current_tx.get() is not None and self.url.dialect == "sqlite":
                raise EnqueueError(
                    "inside a handler on SQLite, enqueue with connection=tx: a second write "
                    "transaction would wait for the handler's own"
                )
            if not self.is_open:
                # on its own: connect for this call only (open the app once to enqueue many)
                async with self._one_call() as transport:
                    await self._publish(transport, jobs)
                return
            await self._publish(self.transport, jobs)
            return
        if self.is_open and self.transport.jobs_db is None:
            raise EnqueueError(
                "enqueue in the caller's transaction needs the database queue; with a broker "
                "transport write to the outbox instead"
            )
        tx = await self._as_tx(connection)
        _check_database_payloads(jobs, tx.dialect)
        with self._sending(jobs, tx.dialect) as traced:
            await database_queue.enqueue(tx, traced)

    def _keyed(self, jobs: Sequence[OutgoingJob]) -> Sequence[OutgoingJob]:
        """``jobs`` with their flow key when their queue's consumer here has a Limit (the
        claim needs it; a worker keys what an app without the limit enqueued)."""
        if not any(c.limit is not None for c in self.consumers.values()):
            return jobs
        keyed = list(jobs)
        for index, job in enumerate(keyed):
            consumer = self.consumers.get(job.queue)
            if consumer is not None and consumer.limit is not None and job.flow_key is None:
                key = consumer.limit.key_of(job.payload, consumer.decoder.decode)
                keyed[index] = dataclasses.replace(job, flow_key=key)
        return keyed

    async def _publish(self, transport: Transport, jobs: Sequence[OutgoingJob]) -> None:
        transport.check_payloads(jobs)
        with self._sending(jobs, transport.name) as traced:
            await transport.publish(traced)

    def _sending(
        self, jobs: Sequence[OutgoingJob], transport: str
    ) -> AbstractContextManager[Sequence[OutgoingJob]]:
        """The ``send`` span of an enqueue, whose context the jobs carry (docs/tracing.md)."""
        if self.tracing is None:
            return nullcontext(jobs)
        return self.tracing.send(jobs, transport)

    async def _as_tx(self, connection: Any) -> Tx:
        return await adopt_async(
            connection,
            doing="enqueue",
            sync_way="app.enqueue_sync(..., connection=tx)",
            schema=self.url.schema,
        )

    def enqueue_sync(
        self,
        queue: str,
        payload: Any,
        *,
        job_id: str | None = None,
        correlation_id: str | None = None,
        delay: timedelta | float | None = None,
        priority: int = DEFAULT_PRIORITY,
        connection: Any = None,
        session: Any = None,
    ) -> str:
        """Enqueue from synchronous code (``priority`` as for :meth:`enqueue`).

        With ``connection`` (a psycopg ``Connection``, an ``sqlite3.Connection`` or a plain
        ``def`` handler's ``tx``) or ``session`` (a SQLAlchemy ``Session``) the job joins that
        transaction; the caller commits. Without it, a short connection of its own is opened
        and committed.
        """
        connection = _one_of(connection, session)
        job = self.job(
            queue,
            payload,
            job_id=job_id,
            correlation_id=correlation_id,
            delay=delay,
            priority=priority,
        )
        job = self._keyed([job])[0]
        if isinstance(connection, SyncTx):
            connection.run_sync(self.enqueue_many([job], connection=connection.async_tx))
            return job.job_id
        dialect = self.url.dialect
        _check_database_payloads([job], dialect)
        if connection is None and current_tx.get() is not None and self.url.dialect == "sqlite":
            raise EnqueueError(
                "inside a handler on SQLite, enqueue with connection=tx: a second write "
                "transaction would wait for the handler's own"
            )
        with self._sending([job], dialect) as traced:
            if connection is not None:
                database_queue.enqueue_sync(connection, traced, dialect, self.url.schema)
            else:
                with connect_sync(self.url) as conn:
                    database_queue.enqueue_sync(conn, traced, dialect, self.url.schema)
        return job.job_id

    # -- workers ----------------------------------------------------------------------------

    def worker(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        poll_interval: float = 2.0,
        shutdown_grace: float = 30.0,
        prefetch: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        summary_interval: float = 60.0,
        scheduler: bool = True,
    ) -> Worker:
        """A :class:`~jobfence.runtime.worker.Worker` for this app (``await worker.run()``);
        ``scheduler=False``: without the scheduler of the app's periodic jobs."""
        return Worker(
            self,
            queues=queues,
            concurrency=concurrency,
            poll_interval=poll_interval,
            shutdown_grace=shutdown_grace,
            prefetch=prefetch,
            batch_size=batch_size,
            batch_window=batch_window,
            summary_interval=summary_interval,
            scheduler=scheduler,
        )
