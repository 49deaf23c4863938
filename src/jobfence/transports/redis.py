"""Redis Streams as the queue (``redis://host:6379/0``), with redis-py's asyncio client.

Per jobfence queue ``Q`` (keys share the hash tag ``{Q}``, so a Redis Cluster keeps them
on one slot):

* ``<prefix>:{Q}:stream`` — a stream read by the consumer group ``<prefix>``; each worker
  is a consumer of its own name; entries stay in the group's pending list until acked;
* crashed consumers' pending entries are taken over with ``XAUTOCLAIM`` once idle longer
  than the lease (a worker renews its own with ``XCLAIM … JUSTID`` while it works), and
  the stream's delivery counter makes that lost delivery count as an attempt (SPEC R1);
* ``<prefix>:{Q}:delayed`` — a sorted set of delayed jobs scored by due time in ms *of
  the Redis clock*; a script moves due jobs into the stream atomically;
* trimming (``XTRIM MINID``) only below the oldest entry still pending or undelivered:
  acked work goes, unacked work never.

Durability is the server's: with ``appendonly no`` (or RDB snapshots only) a restart loses
the queue. On open the adapter reads the setting and warns; use ``appendonly yes`` with
``appendfsync always`` (or accept ``everysec``: up to a second of acknowledged enqueues).

URL options (removed before connecting): ``prefix`` (default ``jobfence``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from ..core.jobs import Delivery, OutgoingJob
from ..errors import Category, ConfigurationError
from . import Transport
from ._broker import Meta, Options, deferred_history, retry_record
from .shielded import ShieldedFetch

log = logging.getLogger("jobfence.transport.redis")

PAYLOAD = "payload"
PUBLISH_BATCH = 1000
PROMOTE_EVERY = 0.05  # seconds between checks for due delayed jobs
MAX_BLOCK = 1.0  # seconds one XREADGROUP may block
#: Bytes of a command kept for everything but the payload (ids, headers, the script's
#: other arguments) within the server's client-query-buffer-limit.
COMMAND_ROOM = 64 * 1024

# Ack the old entry (if still ours) and add the new copy, now or delayed, atomically.
# KEYS: stream, delayed zset, message hash. ARGV: group, consumer, old id, delay ms, fields…
SCHEDULE = """
if ARGV[3] ~= '' then
  local owner = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
  if #owner == 0 or owner[1][2] ~= ARGV[2] then return 0 end
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
end
local delay = tonumber(ARGV[4])
if delay <= 0 then
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[3], unpack(ARGV, 5))
  redis.call('ZADD', KEYS[2], now + delay, KEYS[3])
end
return 1
"""

# Move due delayed jobs into the stream. KEYS: delayed zset, stream. ARGV: limit.
# Returns {moved, ms until the next one is due or -1}.
PROMOTE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, key in ipairs(due) do
  local fields = redis.call('HGETALL', key)
  if #fields > 0 then redis.call('XADD', KEYS[2], '*', unpack(fields)) end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], key)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return {#due, -1} end
local wait = tonumber(nxt[2]) - now
if wait < 0 then wait = 0 end  -- more were due than one call moves
return {#due, wait}
"""

# Reset the idle time of entries still pending to this consumer (never steal one).
# KEYS: stream. ARGV: group, consumer, ids…
EXTEND = """
local n = 0
for i = 3, #ARGV do
  local owner = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #owner > 0 and owner[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _successor(entry_id: str) -> str:
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class RedisTransport(Transport):
    """Jobs as entries of Redis streams, read by one consumer group."""

    name = "redis"
    no_priorities_reason = (
        "a Redis stream is read in the order it was written; jobfence does not sort it"
    )
    shares_database = False

    def __init__(
        self,
        url: str,
        *,
        lease: timedelta = timedelta(seconds=30),
        worker_id: str = "jobfence",
        prefix: str = "jobfence",
    ) -> None:
        self.url = url
        self.lease = lease
        self.worker_id = worker_id
        self.prefix = prefix
        self.group = prefix
        self._redis: aioredis.Redis | None = None
        self._limits: dict[str, int] = {}
        self._groups: set[str] = set()
        self._claimed: deque[Delivery] = deque()
        self._reads = ShieldedFetch()
        self._consumed: set[str] = set()
        self._last_promote: dict[str, float] = {}
        self._next_due: dict[str, float] = {}
        # delayed copies this worker scheduled: queue -> [(scheduled at, due at)] (monotonic)
        self._expected: dict[str, list[tuple[float, float]]] = {}
        self._timer: asyncio.Task[None] | None = None
        self._timer_wake = asyncio.Event()
        self._closed = False
        self._seq = 0
        self._schedule: Any = None
        self._promote: Any = None
        self._extend: Any = None

    @classmethod
    def from_url(cls, url: str, *, lease: timedelta, worker_id: str) -> RedisTransport:
        options = Options(url, "redis")
        prefix = options.text("prefix", "jobfence")
        return cls(options.remaining_url(), lease=lease, worker_id=worker_id, prefix=prefix)

    # -- keys -------------------------------------------------------------------------------

    def stream_key(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:stream"

    def delayed_key(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:delayed"

    def _message_key(self, queue: str) -> str:
        self._seq += 1
        return f"{self.prefix}:{{{queue}}}:job:{self.worker_id}:{time.time_ns()}:{self._seq}"

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> None:
        client: aioredis.Redis = aioredis.Redis.from_url(
            self.url,
            decode_responses=False,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
            health_check_interval=10,
            client_name=f"jobfence-{self.worker_id}"[:60].replace(" ", "_"),
        )
        try:
            settings = await self._settings(client)
            limits = await self._read_limits(client)
        except (OSError, redis.exceptions.RedisError) as exc:
            await client.aclose()
            raise ConfigurationError(f"cannot connect to Redis: {exc}") from None
        if settings.get("appendonly") != "yes":
            log.warning(
                "this Redis does not log writes (appendonly no): a restart loses every "
                "queued job; run it with --appendonly yes --appendfsync always",
                extra={"settings": settings},
            )
        self._limits = limits
        self._closed = False
        self._redis = client
        self._schedule = client.register_script(SCHEDULE)
        self._promote = client.register_script(PROMOTE)
        self._extend = client.register_script(EXTEND)

    async def close(self) -> None:
        self._closed = True
        if self._redis is None:
            return
        # what was read or taken over but never handed to a harness goes back, refunded
        for delivery in [*await self._reads.settle(), *self._claimed]:
            try:
                await self.release(delivery, attempted=False)
            except Exception:
                log.exception("could not hand back a fetched entry; a takeover will")
        self._claimed.clear()
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        if self._redis is not None:
            redis_client, self._redis = self._redis, None
            await redis_client.aclose()

    @property
    def redis(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("the Redis transport is not open")
        return self._redis

    @staticmethod
    async def _settings(client: aioredis.Redis) -> dict[str, str]:
        found: dict[str, str] = {}
        for name in ("appendonly", "appendfsync", "save"):
            raw = await client.config_get(name)
            for key, value in raw.items():
                found[_text(key)] = _text(value)
        return found

    @staticmethod
    async def _read_limits(client: aioredis.Redis) -> dict[str, int]:
        """The server's size limits: one argument (``proto-max-bulk-len``, 512 MB by default)
        and one whole command (``client-query-buffer-limit``, 1 GB by default)."""
        found: dict[str, int] = {}
        for name in ("proto-max-bulk-len", "client-query-buffer-limit"):
            raw = await client.config_get(name)
            for key, value in raw.items():
                found[_text(key)] = int(_text(value))
        return found

    @property
    def max_payload(self) -> int | None:
        if not self._limits:
            return None
        bulk = self._limits.get("proto-max-bulk-len", 512 * 1024 * 1024)
        command = self._limits.get("client-query-buffer-limit", 1024 * 1024 * 1024)
        return min(bulk, command - COMMAND_ROOM)

    @property
    def max_payload_reason(self) -> str:
        return (
            f"the server's proto-max-bulk-len {self._limits.get('proto-max-bulk-len')} and "
            f"client-query-buffer-limit {self._limits.get('client-query-buffer-limit')} less "
            f"{COMMAND_ROOM} for the rest of the command"
        )

    async def durability(self) -> dict[str, str]:
        """The server's persistence settings, as it reports them."""
        return await self._settings(self.redis)

    async def _ensure_group(self, queue: str, *, force: bool = False) -> None:
        key = self.stream_key(queue)
        if key in self._groups and not force:
            return
        try:
            await self.redis.xgroup_create(key, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(key)

    # -- publishing -------------------------------------------------------------------------

    @staticmethod
    def _fields(payload: bytes, meta: Meta) -> list[Any]:
        fields: list[Any] = [PAYLOAD, payload]
        for key, value in meta.headers().items():
            fields += [key, value]
        return fields

    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        self.check_payloads(jobs)
        for queue in {job.queue for job in jobs}:
            await self._ensure_group(queue)
        for start in range(0, len(jobs), PUBLISH_BATCH):
            chunk = jobs[start : start + PUBLISH_BATCH]
            async with self.redis.pipeline(transaction=False) as pipe:
                for job in chunk:
                    fields = self._fields(job.payload, Meta.new(job))
                    if job.delay > 0:
                        await self._schedule(
                            keys=[
                                self.stream_key(job.queue),
                                self.delayed_key(job.queue),
                                self._message_key(job.queue),
                            ],
                            args=[self.group, self.worker_id, "", int(job.delay * 1000), *fields],
                            client=pipe,
                        )
                    else:
                        pipe.xadd(
                            self.stream_key(job.queue),
                            dict(zip(fields[::2], fields[1::2], strict=True)),
                        )
                await pipe.execute()

    # -- consuming --------------------------------------------------------------------------

    def _delivery(
        self, queue: str, entry_id: Any, fields: dict[Any, Any], delivered: int
    ) -> Delivery:
        data = {_text(k): v for k, v in fields.items()}
        headers = {k: _text(v) for k, v in data.items() if k != PAYLOAD}
        meta = Meta.read(headers)
        attempt = meta.attempts + max(delivered, 1)
        payload = data.get(PAYLOAD, b"")
        return meta.delivery(
            queue,
            bytes(payload) if not isinstance(payload, bytes) else payload,
            attempt,
            token=_text(entry_id),
            ref=self.stream_key(queue),
        )

    async def _promote_due(self, queue: str, *, force: bool = False) -> float | None:
        """Move due delayed jobs of ``queue`` into its stream; seconds until the next."""
        now = time.monotonic()
        if not force and now - self._last_promote.get(queue, 0.0) < PROMOTE_EVERY:
            nxt = self._next_due.get(queue)
            if nxt is None or nxt > now:
                return None if nxt is None else nxt - now
        self._last_promote[queue] = now
        _moved, wait_ms = await self._promote(
            keys=[self.delayed_key(queue), self.stream_key(queue)], args=[500]
        )
        # what this worker scheduled before the script ran, and was due by then, it moved;
        # a retry scheduled meanwhile may be missing from its answer: keep expecting it
        expected = [(r, d) for r, d in self._expected.get(queue, []) if r >= now or d > now]
        if expected:
            self._expected[queue] = expected
        else:
            self._expected.pop(queue, None)
        if int(wait_ms) < 0:
            self._next_due.pop(queue, None)
            return None
        self._next_due[queue] = now + int(wait_ms) / 1000
        self._arm()
        return int(wait_ms) / 1000

    def _expect(self, queue: str, delay: float) -> None:
        """This worker scheduled a delayed copy of a job of ``queue``, due in ``delay``
        seconds: the promotion timer moves it into the stream then."""
        now = time.monotonic()
        self._expected.setdefault(queue, []).append((now, now + delay))
        self._arm()

    def _arm(self) -> None:
        """(Re)start the promotion timer on the earliest due time known."""
        if self._closed:
            return
        if self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._promote_on_time(), name="jobfence-promote")
        self._timer_wake.set()

    def _due_times(self) -> dict[str, float]:
        """Per queue, the earliest time (monotonic) a delayed job is known to fall due."""
        found = dict(self._next_due)
        for queue, expected in self._expected.items():
            earliest = min(due for _, due in expected)
            found[queue] = min(found.get(queue, earliest), earliest)
        return found

    async def _promote_on_time(self) -> None:
        """Promote a queue's delayed jobs as soon as the earliest one falls due. Its XADD
        wakes whichever worker is blocked reading the stream, so a retry runs on time
        instead of after the blocking read that was waiting when it was scheduled."""
        while True:
            self._timer_wake.clear()
            due_times = self._due_times()
            if not due_times:
                await self._timer_wake.wait()
                continue
            queue, due = min(due_times.items(), key=lambda item: item[1])
            wait = due - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._timer_wake.wait()
                continue
            try:
                await self._promote_due(queue, force=True)
            except (OSError, redis.exceptions.RedisError) as exc:
                log.warning(
                    "could not promote due delayed jobs; trying again in a second",
                    extra={"queue": queue, "error": f"{type(exc).__name__}: {exc}"},
                )
                await asyncio.sleep(1.0)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        return await self._reads.fetch(
            self._claimed, limit, lambda: self._read(queues, limit, timeout)
        )

    async def _read(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        found: list[Delivery] = []
        wait = min(timeout, MAX_BLOCK)
        for queue in queues:
            if queue not in self._consumed:
                await self._ensure_group(queue)
                self._consumed.add(queue)
            next_due = await self._promote_due(queue)
            if next_due is not None:
                wait = min(wait, next_due)
        block = int(wait * 1000)
        streams = {self.stream_key(q): ">" for q in queues}
        try:
            reply = await self.redis.xreadgroup(
                self.group,
                self.worker_id,
                streams,  # type: ignore[arg-type]
                count=limit,
                block=block if block > 0 else None,
            )
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning(
                "the Redis consumer group is gone (a restart without persistence?); recreating it"
            )
            for queue in queues:
                await self._ensure_group(queue, force=True)
            return []
        by_key = {self.stream_key(q): q for q in queues}
        rows: list[Any] = list(reply or [])
        for key, entries in rows:
            queue = by_key[_text(key)]
            for entry_id, fields in entries:
                found.append(self._delivery(queue, entry_id, fields, 1))
        return found

    # -- answers ----------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        await self.redis.xack(delivery.ref, self.group, delivery.token)

    async def _copy(self, delivery: Delivery, meta: Meta, delay: float) -> None:
        await self._schedule(
            keys=[
                delivery.ref,
                self.delayed_key(delivery.queue),
                self._message_key(delivery.queue),
            ],
            args=[
                self.group,
                self.worker_id,
                delivery.token,
                max(int(delay * 1000), 0),
                *self._fields(delivery.payload, meta),
            ],
        )

    async def retry(
        self,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        record = retry_record(delivery, delay, category, error, trace)
        meta = Meta.again(delivery, attempts=delivery.attempt, history=[*delivery.history, record])
        await self._copy(delivery, meta, delay.total_seconds())
        if delay.total_seconds() > 0:
            self._expect(delivery.queue, delay.total_seconds())

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        attempts = delivery.attempt if attempted else delivery.attempt - 1
        await self._copy(
            delivery, Meta.again(delivery, attempts=attempts, history=delivery.history), 0.0
        )

    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        """A refunded copy into the delayed set (or the stream, for no delay) and the old
        entry acked, in one script: no moment holds both or neither."""
        seconds = max(delay.total_seconds(), 0.0)
        history = deferred_history(delivery, delay, note)
        meta = Meta.again(delivery, attempts=delivery.attempt - 1, history=history)
        await self._copy(delivery, meta, seconds)
        if seconds > 0:
            self._expect(delivery.queue, seconds)

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        by_stream: dict[str, list[str]] = {}
        for delivery in deliveries:
            by_stream.setdefault(delivery.ref, []).append(delivery.token)
        for key, ids in by_stream.items():
            await self._extend(keys=[key], args=[self.group, self.worker_id, *ids])

    async def maintenance(self) -> None:
        for queue in list(self._consumed):
            await self._promote_due(queue, force=True)
            await self._reclaim(queue)
            await self.trim(queue)

    async def _reclaim(self, queue: str) -> None:
        """Take over entries idle longer than the lease (their worker was lost)."""
        key = self.stream_key(queue)
        lease_ms = int(self.lease.total_seconds() * 1000)
        start = "0-0"
        for _ in range(10):
            reply = await self.redis.xautoclaim(
                key, self.group, self.worker_id, lease_ms, start_id=start, count=100
            )
            start = _text(reply[0])
            entries = [(e_id, f) for e_id, f in reply[1] if f is not None]
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:
                log.error(
                    "pending stream entries were deleted before being acked",
                    extra={"stream": key, "ids": [_text(i) for i in deleted]},
                )
            if entries:
                ids = sorted((_text(e) for e, _ in entries), key=_id_key)
                pending = await self.redis.xpending_range(
                    key,
                    self.group,
                    min=ids[0],
                    max=ids[-1],
                    count=len(ids) + 100,
                    consumername=self.worker_id,
                )
                counts = {_text(p["message_id"]): int(p["times_delivered"]) for p in pending}
                for entry_id, fields in entries:
                    delivered = counts.get(_text(entry_id), 2)
                    self._claimed.append(self._delivery(queue, entry_id, fields, delivered))
                log.warning(
                    "took over jobs whose lease expired (worker killed or lost)",
                    extra={"jobs": len(entries), "queue": queue},
                )
            if start == "0-0":
                break

    async def trim(self, queue: str) -> int:
        """Drop entries every group has acked; never one still pending or undelivered."""
        key = self.stream_key(queue)
        try:
            groups = await self.redis.xinfo_groups(key)
        except redis.exceptions.ResponseError:
            return 0
        if not groups:
            return 0
        bounds: list[str] = []
        for group in groups:
            bounds.append(_successor(_text(group["last-delivered-id"])))
            if int(group["pending"]) > 0:
                summary = await self.redis.xpending(key, _text(group["name"]))
                if summary.get("min"):
                    bounds.append(_text(summary["min"]))
        minid = min(bounds, key=_id_key)
        trimmed: int = await self.redis.xtrim(key, minid=minid, approximate=False)
        return trimmed
