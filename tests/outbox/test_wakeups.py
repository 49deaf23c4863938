"""Relay wake-ups (issue 16 §2): outbox writers notify only while a relay waits.

A NOTIFY makes its transaction take a database-wide lock at commit, so one per outbox insert
serialises concurrent writers. An idle relay registers in ``core.outbox_waiters``; writers
notify only while a registration is current. A writer already in flight when a relay
registers is waited for (the trigger's advisory lock), so its event is not left to the
polling fallback. Each test gives the relay a 60 s poll: only a wake-up can pass it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from jobfence import App, outbox
from jobfence.outbox.relay import CHANNEL, Relay

from ..helpers import eventually, scalar

SENTINEL = "sentinel"


class Listener:
    """A LISTEN on the relays' channel; ``outbox_notified()`` says whether an outbox
    notification came before a sentinel sent after the writes (notifications arrive in
    commit order, so the sentinel marks 'everything before it has arrived')."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")

    def outbox_notified(self) -> bool:
        self.conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, SENTINEL))
        payloads: list[str] = []
        for note in self.conn.notifies(timeout=10):
            payloads.append(note.payload)
            if note.payload == SENTINEL:
                break
        assert payloads[-1:] == [SENTINEL], payloads
        return len(payloads) > 1

    def close(self) -> None:
        self.conn.close()


async def _write(app: App, event_id: str) -> None:
    async with app.db.transaction() as tx:
        await outbox.write(tx, "q", {"id": event_id}, event_id=event_id)


async def _registered(url: str) -> bool:
    return bool(await scalar(url, "SELECT count(*) FROM core.outbox_waiters WHERE until > now()"))


async def test_without_a_waiting_relay_a_writer_does_not_notify(pg_database: str) -> None:
    listener = Listener(pg_database)
    try:
        async with App(pg_database) as app:
            await _write(app, "evt-alone")
        assert not await asyncio.to_thread(listener.outbox_notified)
    finally:
        listener.close()
    assert await scalar(pg_database, "SELECT count(*) FROM core.outbox") == 1


async def test_a_waiting_relay_is_notified_and_woken(pg_database: str) -> None:
    listener = Listener(pg_database)
    try:
        async with App(pg_database) as app:
            relay = Relay(app, poll_interval=60)
            relay.start()
            await eventually(lambda: _registered(pg_database), what="the idle relay registered")
            await _write(app, "evt-woken")
            assert await asyncio.to_thread(listener.outbox_notified)
            await eventually(lambda: relay.stats.published == 1, timeout=10, what="wake-up")
            await relay.stop()
        # a stopped relay no longer asks writers to notify
        assert not await _registered(pg_database)
    finally:
        listener.close()


async def test_a_busy_relay_unregisters_so_writers_stop_notifying(pg_database: str) -> None:
    async with App(pg_database) as app:
        relay = Relay(app, poll_interval=60, batch_size=1)
        relay.start()
        await eventually(lambda: _registered(pg_database), what="the idle relay registered")
        seen: list[Any] = []

        async def at_publish(tx: Any, events: Any) -> None:
            # the round that found work still sees the registration; the next ones do not
            seen.append(await tx.fetchone("SELECT count(*) FROM core.outbox_waiters"))

        relay.on_published = at_publish
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {}, event_id="evt-busy-1")
            await outbox.write(tx, "q", {}, event_id="evt-busy-2")
        await eventually(lambda: relay.stats.published == 2, timeout=10, what="wake-up")
        await relay.stop()
    assert seen == [(1,), (0,)]


async def test_a_writer_in_flight_when_the_relay_registers_is_not_missed(
    pg_database: str,
) -> None:
    """The writer inserts while no relay waits (no NOTIFY planned) and commits only after
    the relay has registered and looked: the relay waits for it, then finds its event."""
    async with App(pg_database) as app:
        writer = await psycopg.AsyncConnection.connect(pg_database)
        try:
            await writer.execute(
                "INSERT INTO core.outbox (event_id, queue, payload) VALUES ('evt-late', 'q', "
                "'\\x7b7d')"
            )
            relay = Relay(app, poll_interval=60)
            relay.start()
            await eventually(lambda: _registered(pg_database), what="the relay registered")
            await asyncio.sleep(0.2)  # let it reach its look-again (it waits for the writer)
            assert relay.stats.published == 0
            await writer.commit()
        finally:
            await writer.close()
        await eventually(lambda: relay.stats.published == 1, timeout=10, what="the late event")
        await relay.stop()
