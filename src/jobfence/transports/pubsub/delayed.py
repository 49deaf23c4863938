"""Delayed jobs: Pub/Sub has no scheduled delivery, so a job due later waits on its queue's
delay subscription, held (ModifyAckDeadline) until due, then moved to the queue's topic."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence

from google.api_core import exceptions as gexc
from google.pubsub_v1 import types

from .._broker import DELAY
from .messaging import PubSubMessaging
from .topology import MAX_ACK_DEADLINE, Names, log

DELAY_POLL = 10.0  # seconds one pull of a delay subscription may wait


def delayed_step(wait: float) -> tuple[str, float]:
    """What a worker does with a delayed job due in ``wait`` seconds (its clock):

    * ``("move", 0)`` — due: publish it to the queue's topic now;
    * ``("hold", s)`` — give it back to Pub/Sub for ``s`` whole seconds (its ack deadline:
      1 ≤ s ≤ min(wait, 600)), after which Pub/Sub hands it out again, never early;
    * ``("timer", wait)`` — less than a second left: wait for it in this process.
    """
    if wait <= 0:
        return ("move", 0.0)
    if wait < 1.0:
        return ("timer", wait)
    return ("hold", float(min(int(wait), MAX_ACK_DEADLINE)))


class DelayedHolds(PubSubMessaging):
    """The mover of each consumed queue's delayed jobs (a base of
    :class:`~.transport.PubSubTransport`)."""

    _movers: dict[str, asyncio.Task[None]]
    _timers: dict[asyncio.Task[None], tuple[str, str]]

    # -- delayed jobs -----------------------------------------------------------------------

    async def _move_forever(self, queue: str) -> None:
        """Hold delayed jobs of ``queue`` until due, then move them to its topic."""
        while True:
            try:
                names = await self.declare(queue)
                received = await self._pull(names.delay_subscription, 100, DELAY_POLL)
                if received:
                    await self._sort_delayed(queue, names, received)
            except asyncio.CancelledError:
                raise
            except gexc.NotFound as exc:
                with contextlib.suppress(Exception):
                    await self._lost_topology(queue, exc)
                await asyncio.sleep(1.0)
            except gexc.ServiceUnavailable as exc:
                log.warning("Pub/Sub is unavailable: delayed jobs wait", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("moving delayed jobs failed; trying again", extra={"queue": queue})
                await asyncio.sleep(1.0)

    async def _sort_delayed(
        self, queue: str, names: Names, received: Iterable[types.ReceivedMessage]
    ) -> None:
        """Due jobs are moved now; the others are held (server-side while a second or more
        is left, in this process for the last fraction of a second)."""
        subscription = self.subscription_path(names.delay_subscription)
        now = time.time()
        due: list[types.ReceivedMessage] = []
        holds: dict[int, list[str]] = {}
        for item in received:
            try:
                delay = float(item.message.attributes.get(DELAY) or 0)
            except ValueError:
                delay = 0.0
            step, seconds = delayed_step(item.message.publish_time.timestamp() + delay - now)
            if step == "hold":
                holds.setdefault(int(seconds), []).append(item.ack_id)
            elif step == "timer":
                timer = asyncio.get_running_loop().create_task(
                    self._move_later(queue, names, item, seconds)
                )
                self._timers[timer] = (subscription, item.ack_id)
                timer.add_done_callback(lambda t: self._timers.pop(t, None))
            else:
                due.append(item)
        for seconds, ack_ids in holds.items():
            await self._modify(subscription, ack_ids, seconds)
        if due:
            await self._move(queue, names, due)

    async def _move_later(
        self, queue: str, names: Names, item: types.ReceivedMessage, wait: float
    ) -> None:
        await asyncio.sleep(wait)
        try:
            await self._move(queue, names, [item])
        except Exception:
            log.exception("moving a delayed job failed; it comes back to be moved again")

    async def _move(self, queue: str, names: Names, items: Sequence[types.ReceivedMessage]) -> None:
        """Publish due jobs to the queue's topic (confirmed), then ack their delayed copies."""
        messages = []
        for item in items:
            attrs = dict(item.message.attributes)
            attrs.pop(DELAY, None)
            messages.append(types.PubsubMessage(data=item.message.data, attributes=attrs))
        await self._publish_to_queue(queue, messages)
        await self._ack_ids(
            self.subscription_path(names.delay_subscription), [i.ack_id for i in items]
        )
