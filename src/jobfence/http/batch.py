"""Claims and completions of idempotency keys from concurrent requests, sent together.

While statements are at the server (up to ``in_flight`` of a kind), the requests that
arrive meanwhile queue; the next statement carries all of them (up to ``max_batch``). With
one request at a time nothing waits; under load one round trip and one commit serve several
requests. Each batch commits
on its own (autocommit), as each request's own statement did, so what a crash can leave
behind is unchanged: a claimed key (in progress, freed when its lease runs out) or a stored
response. A batch locks its keys in (partner_id, key) order, so the batches of two
processes cannot deadlock. A batch that fails is retried one request at a time: one bad
request fails alone.

PostgreSQL only; on SQLite every request runs its own statement, as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from ..db import Database, Row, Tx, to_datetime
from .keys import IdempotencyStore, StoredResponse

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")

MAX_BATCH = 64
#: statements of one kind at the server at once. Each waits mostly for its commit's WAL
#: flush; letting 4 overlap made smaller batches and fewer requests/s than 1 (1 325–1 522 vs
#: 1 532–1 688 on the HTTP workload, alternating runs)
IN_FLIGHT = 1

Claim = tuple[str, str, str]  # partner_id, key, fingerprint
Lookup = tuple[str, str]  # partner_id, key
Commit = tuple[str, str, Tx]  # partner_id, key, a deferred transaction (Database.deferred)
Claimed = tuple[str, datetime | None] | None  # lease token and expiry, or not claimed
Completion = tuple[str, str, str, StoredResponse]  # partner_id, key, token, response


class Batches(Generic[I, R]):
    """Runs ``many`` on every item that queued while the previous batch was at the server
    (``one`` for a batch of one, and for each item of a batch that failed)."""

    def __init__(
        self,
        many: Callable[[list[I]], Awaitable[list[R]]],
        one: Callable[[I], Awaitable[R]],
        max_batch: int = MAX_BATCH,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self._many = many
        self._one = one
        self.max_batch = max_batch
        self.in_flight = in_flight
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._running: set[asyncio.Task[None]] = set()
        #: statements sent and items they carried (for tests and benchmarks)
        self.batches = 0
        self.items = 0

    async def submit(self, item: I) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if len(self._running) >= self.in_flight:  # (a task of a loop that has ended never ends)
            self._running = {t for t in self._running if t.get_loop() is loop and not t.done()}
        if len(self._running) < self.in_flight:
            # a task of its own: a waiter that is cancelled does not cancel the others' batch
            task = loop.create_task(self._drain())
            self._running.add(task)
            task.add_done_callback(lambda done: self._running.discard(done))
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: len(batch)]
            self.batches += 1
            self.items += len(batch)
            items = [item for item, _ in batch]
            try:
                if len(items) == 1:
                    results = [await self._one(items[0])]
                else:
                    results = await self._many(items)
            except Exception as exc:
                if len(batch) == 1:
                    _fail(batch[0][1], exc)
                else:
                    await self._one_by_one(batch)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def _one_by_one(self, batch: Sequence[tuple[I, asyncio.Future[R]]]) -> None:
        for item, future in batch:
            try:
                result = await self._one(item)
            except Exception as exc:
                _fail(future, exc)
            else:
                if not future.done():
                    future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class KeyBatches:
    """The middleware's claims and completions of keys on one database, batched."""

    def __init__(self, db: Database, *, lease: timedelta, window: timedelta) -> None:
        self.db = db
        self.store = IdempotencyStore(db)
        self.lease = lease
        self.window = window
        self.claims: Batches[Claim, Claimed] = Batches(self._claim_many, self._claim_one)
        self.completions: Batches[Completion, bool] = Batches(
            self._complete_many, self._complete_one
        )
        self.lookups: Batches[Lookup, dict[str, Any] | None] = Batches(
            self._lookup_many, self._lookup_one
        )
        self.commits: Batches[Commit, None] = Batches(self._commit_many, self._commit_one)

    async def lookup(self, partner_id: str, key: str) -> dict[str, Any] | None:
        """The key's row (:meth:`IdempotencyStore.get`), read with concurrent requests'."""
        if self.db.dialect != "postgresql":
            return await self._lookup_one((partner_id, key))
        return await self.lookups.submit((partner_id, key))

    async def commit(self, partner_id: str, key: str, tx: Tx) -> None:
        """Commit a deferred transaction that sent nothing yet (``Database.deferred``) with
        those of concurrent requests: one transaction, one round trip for all of them; if it
        fails, each is committed alone (so a conflict fails only its own request)."""
        await self.commits.submit((partner_id, key, tx))

    async def _lookup_one(self, item: Lookup) -> dict[str, Any] | None:
        return await self.store.get(*item)

    async def _lookup_many(self, items: list[Lookup]) -> list[dict[str, Any] | None]:
        rows: list[Row] = await self.db.run(
            "idempotency_get_many",
            {"partner_ids": [p for p, _ in items], "keys": [k for _, k in items]},
        )
        found = {(row["partner_id"], row["key"]): dict(row) for row in rows}
        return [found.get(item) for item in items]

    async def _commit_one(self, item: Commit) -> None:
        await self.db.commit_deferred([item[2]])

    async def _commit_many(self, items: list[Commit]) -> list[None]:
        # in key order, as the claims: two processes' batches cannot deadlock on their keys
        await self.db.commit_deferred([tx for _, _, tx in sorted(items, key=lambda i: i[:2])])
        return [None] * len(items)

    async def claim(self, partner_id: str, key: str, fingerprint: str) -> Claimed:
        if self.db.dialect != "postgresql":
            return await self._claim_one((partner_id, key, fingerprint))
        return await self.claims.submit((partner_id, key, fingerprint))

    async def complete(
        self, partner_id: str, key: str, token: str, response: StoredResponse
    ) -> bool:
        if self.db.dialect != "postgresql":
            return await self._complete_one((partner_id, key, token, response))
        return await self.completions.submit((partner_id, key, token, response))

    async def _claim_one(self, item: Claim) -> Claimed:
        partner_id, key, fingerprint = item
        return await self.store.claim(
            partner_id, key, fingerprint, lease=self.lease, window=self.window
        )

    async def _claim_many(self, items: list[Claim]) -> list[Claimed]:
        # one row per key: a second request with the same key in the batch is a concurrent
        # duplicate, not claimed (it then finds the key in progress, as it would have)
        first: dict[tuple[str, str], str] = {}
        for partner_id, key, fingerprint in items:
            first.setdefault((partner_id, key), fingerprint)
        rows = await self.db.run(
            "idempotency_claim_many",
            {
                "partner_ids": [partner_id for partner_id, _ in first],
                "keys": [key for _, key in first],
                "fingerprints": list(first.values()),
                "lease": self.lease.total_seconds(),
                "window": self.window.total_seconds(),
            },
        )
        claimed = {
            (row["partner_id"], row["key"]): (
                str(row["lease_token"]),
                to_datetime(row["expires_at"]),
            )
            for row in rows
        }
        results: list[Claimed] = []
        for partner_id, key, _ in items:
            results.append(claimed.pop((partner_id, key), None))
        return results

    async def _complete_one(self, item: Completion) -> bool:
        partner_id, key, token, response = item
        return await self.store.complete(partner_id, key, token, response)

    async def _complete_many(self, items: list[Completion]) -> list[bool]:
        rows = await self.db.run(
            "idempotency_complete_many",
            {
                "partner_ids": [item[0] for item in items],
                "keys": [item[1] for item in items],
                "tokens": [item[2] for item in items],
                "status_codes": [item[3].status for item in items],
                "headers": [json.dumps([list(h) for h in item[3].headers]) for item in items],
                "bodies": [item[3].body for item in items],
            },
        )
        done = {(row["partner_id"], row["key"]) for row in rows}
        return [(item[0], item[1]) in done for item in items]
