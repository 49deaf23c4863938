"""The jobfence App of a Django project: its database is Django's, its handlers run in Django's
transactions, and it enqueues on Django's connection."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionDoesNotExist

from ... import outbox
from ...app import App
from ...config import parse_database_url
from ...core.limits import Limit
from ...core.retry import RetryPolicy
from ...errors import ConfigurationError, EnqueueError
from ...runtime.harness import Handler
from ...transports import is_broker_url
from .work import DjangoHost, DjangoTx, dialect_of, raw_connection

H = TypeVar("H", bound=Handler)
T = TypeVar("T")


def _django_url(using: str) -> str:
    return database_url(using)


def database_url(using: str = "default") -> str:
    """The jobfence database URL of Django's database ``using`` (from ``DATABASES``)."""
    try:
        connection = connections[using]
    except (ImproperlyConfigured, ConnectionDoesNotExist) as exc:
        raise ConfigurationError(f"jobfence needs Django's database {using!r}: {exc}") from None
    dialect = dialect_of(connection)
    settings = connection.settings_dict
    name = str(settings.get("NAME") or "")
    if dialect == "sqlite":
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ConfigurationError(
                f"database {using!r} is an in-memory SQLite database; a jobfence worker runs "
                "beside the web process and needs a file (for tests, set "
                f"DATABASES[{using!r}]['TEST']['NAME'] to a file path)"
            )
        return f"sqlite:///{name}"
    user = quote(str(settings.get("USER") or ""), safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(settings.get("HOST") or "")
    host = f"[{host}]" if ":" in host else quote(host, safe="")
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    options = settings.get("OPTIONS") or {}
    query = "&".join(
        f"{key}={quote(str(options[key]), safe='')}"
        for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name")
        if key in options
    )
    return f"postgresql://{auth}{host}{port}/{quote(name, safe='')}" + (
        f"?{query}" if query else ""
    )


class DjangoApp(App):
    """A :class:`jobfence.App` on Django's database ``using`` (default ``"default"``).

    Handlers are plain ``def handle(job, tx)``: each runs in a worker thread inside
    ``transaction.atomic(using=…)``, after the job's fence row, so the ORM's writes and the
    fence commit or roll back together; ``tx`` is a
    :class:`~jobfence.integrations.django.DjangoTx`. ``enqueue_sync`` and :meth:`write_event`
    write on Django's connection: inside an ``atomic()`` block the job exists only if the
    block commits. Other arguments are :class:`jobfence.App`'s; the database is read from
    ``DATABASES`` when the app opens (so a test database is honoured).
    """

    def __init__(self, using: str = "default", **kwargs: Any) -> None:
        if "database_url" in kwargs:
            raise ConfigurationError(
                "a DjangoApp takes its database from DATABASES; pass using='<alias>'"
            )
        self.using = using
        super().__init__(database_url(using), **kwargs)
        self._auto_migrate = self.auto_migrate

    def use_database(self, database_url: str | None, *, schema: str | None = None) -> None:
        """Only Django's own database (the CLI's ``--database-url`` may repeat it): the fence
        must live where the handlers' ORM writes do."""
        if database_url is not None:
            given = parse_database_url(database_url).target
            if given != parse_database_url(_django_url(self.using)).target:
                raise ConfigurationError(
                    f"a DjangoApp keeps its fence in Django's database {self.using!r} (where "
                    "the handlers' ORM writes are); it cannot use "
                    f"{parse_database_url(database_url).display} (unset JOBFENCE_DATABASE_URL "
                    "or --database-url; a queue elsewhere is --transport)"
                )
        super().use_database(database_url, schema=schema)
        self.auto_migrate = self._auto_migrate

    def _follow_django(self) -> None:
        """Read ``DATABASES`` again before opening: Django's test runner renames the
        database after the app was made."""
        if self.is_open:
            return
        url = database_url(self.using)
        if parse_database_url(url).target != self.url.target:
            App.use_database(self, url, schema=self.url.schema if self.url.schema else None)
            self.auto_migrate = self._auto_migrate

    async def open(self, pool_size: int = 10) -> None:
        self._follow_django()
        await super().open(pool_size)

    async def migrate(self) -> list[int]:
        self._follow_django()
        return await super().migrate()

    # -- handlers -----------------------------------------------------------------------------

    def consumer(
        self,
        queue: str,
        *,
        schema: Any = None,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        isolated: bool = False,
        limit: Limit | None = None,
    ) -> Callable[[H], H]:
        """:meth:`jobfence.App.consumer` for ``def handle(job, tx)`` handlers that run inside
        ``transaction.atomic()`` on Django's connection (``async def`` is refused). Each job
        has a transaction of its own here (``isolated`` is accepted and always holds)."""
        register = super().consumer(
            queue, schema=schema, name=name, retry=retry, isolated=isolated, limit=limit
        )

        def hosted(handler: H) -> H:
            register(handler)
            host = DjangoHost(self.using, self.url.schema)
            self.consumers[queue] = dataclasses.replace(self.consumers[queue], host=host)
            return handler

        return hosted

    # -- enqueue and outbox on Django's connection -------------------------------------------

    def _raw(self, connection: Any) -> Any:
        if connection is None:
            connection = connections[self.using]
        elif isinstance(connection, DjangoTx):
            connection = connection.connection
        if isinstance(connection, BaseDatabaseWrapper):
            dialect_of(connection)
            return raw_connection(connection)
        return connection

    def enqueue_sync(
        self,
        queue: str,
        payload: Any,
        *,
        job_id: str | None = None,
        correlation_id: str | None = None,
        delay: timedelta | float | None = None,
        connection: Any = None,
        session: Any = None,
    ) -> str:
        """Enqueue on Django's connection (``connection``: a Django connection or a handler's
        ``tx``; default ``connections[using]``): inside ``transaction.atomic()`` the job
        exists only if the block commits; outside, it commits at once (autocommit)."""
        spec = self._transport_spec
        if (isinstance(spec, str) and is_broker_url(spec)) or not isinstance(spec, str | None):
            raise EnqueueError(
                "with a broker transport a job cannot join Django's transaction: write it to "
                "the outbox with app.write_event(...) and run `jobfence relay`"
            )
        self._follow_django()
        return super().enqueue_sync(
            queue,
            payload,
            job_id=job_id,
            correlation_id=correlation_id,
            delay=delay,
            connection=self._raw(connection) if session is None else connection,
            session=session,
        )

    def write_event(
        self,
        queue: str,
        payload: Any,
        *,
        event_id: str | None = None,
        key: str | None = None,
        correlation_id: str | None = None,
        connection: Any = None,
    ) -> str:
        """Write an outbox event on Django's connection (see :func:`jobfence.outbox.write_sync`):
        inside ``transaction.atomic()`` it exists only if the block commits; ``jobfence relay``
        publishes it."""
        return outbox.write_sync(
            self._raw(connection),
            queue,
            payload,
            event_id=event_id,
            key=key,
            correlation_id=correlation_id,
            schema=self.url.schema,
        )


def project_app() -> DjangoApp:
    """The project's app: ``settings.JOBFENCE_APP`` (``"module:attribute"``) if set, else a
    :class:`DjangoApp` on ``settings.JOBFENCE_DATABASE`` (default ``"default"``)."""
    from django.conf import settings

    spec = getattr(settings, "JOBFENCE_APP", None)
    if not spec:
        return DjangoApp(getattr(settings, "JOBFENCE_DATABASE", "default"))
    module_name, _, attr = str(spec).partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"settings.JOBFENCE_APP = {spec!r}: {exc}") from None
    if not isinstance(app, DjangoApp):
        raise ConfigurationError(
            f"settings.JOBFENCE_APP = {spec!r} is a {type(app).__name__}, not a DjangoApp"
        )
    return app


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from Django's synchronous code (in a thread of its own when this one
    already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
