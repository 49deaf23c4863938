"""PostgreSQL LISTEN for wake-ups (:meth:`PostgresDatabase.wakeups <jobfence.db.postgres.
PostgresDatabase.wakeups>`), on a dedicated connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import psycopg
from psycopg import sql as pgsql

log = logging.getLogger("jobfence.db")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def listen(target: str, channel: str) -> AsyncIterator[str]:
    """LISTEN on ``channel`` on a dedicated connection, reconnecting with backoff.

    Yields ``""`` after each (re)connection so the caller polls once for anything it
    missed while it was not listening.
    """
    backoff = 0.1
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                target, autocommit=True, connect_timeout=10
            )
        except psycopg.Error as exc:
            log.warning(
                "listen connection failed; retrying",
                extra={"error": first_line(exc), "retry_in": backoff},
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
            continue
        try:
            await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
            backoff = 0.1
            yield ""
            async for notify in conn.notifies():
                yield notify.payload
        except psycopg.Error as exc:
            log.warning("listen connection lost; reconnecting", extra={"error": first_line(exc)})
        finally:
            await conn.close()
