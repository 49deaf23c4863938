"""Queue reads that a cancelled :meth:`~jobfence.transports.Transport.fetch` cannot lose —
shared by the database queue and the brokers that read in the background."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.jobs import Delivery


class ShieldedFetch:
    """Reads that a cancelled :meth:`Transport.fetch` cannot lose.

    A worker cancels a fetch when it stops. A read cancelled mid-flight may already have
    taken jobs (the database queue's claim committed at the server, Redis has put them in
    the pending list, JetStream has delivered them to the pull request): they would come
    back only after the lease, counted as a lost attempt. So the read runs shielded; what it
    returns after a cancellation is kept for the next fetch, or handed back, refunded, on
    close.
    """

    def __init__(self) -> None:
        self.kept: deque[Delivery] = deque()
        self._tasks: set[asyncio.Task[list[Delivery]]] = set()

    def take(self, limit: int) -> list[Delivery]:
        found: list[Delivery] = []
        while self.kept and len(found) < limit:
            found.append(self.kept.popleft())
        return found

    async def fetch(
        self,
        ready: deque[Delivery],
        limit: int,
        read: Callable[[], Coroutine[Any, Any, list[Delivery]]],
    ) -> list[Delivery]:
        """A broker's :meth:`Transport.fetch`: the deliveries already in hand first (``ready``,
        e.g. claimed ones, or exhausted ones on their way to a dead letter), then what a
        cancelled read left; only when there are none, one new shielded ``read()``."""
        if limit <= 0:
            return []
        found: list[Delivery] = []
        while ready and len(found) < limit:
            found.append(ready.popleft())
        found += self.take(limit - len(found))
        if found:
            return found
        return await self.run(read())

    async def run(self, read: Coroutine[Any, Any, list[Delivery]]) -> list[Delivery]:
        task = asyncio.ensure_future(read)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._keep)
            raise

    def _keep(self, task: asyncio.Task[list[Delivery]]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.kept.extend(task.result())

    async def settle(self) -> list[Delivery]:
        """Wait for reads still running; return (and forget) every kept delivery."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        found = list(self.kept)
        self.kept.clear()
        return found
