"""NATS JetStream as the queue (``nats://host:4222``), with nats-py.

Per jobfence queue ``Q`` the adapter keeps:

* a stream ``<prefix>_<Q>`` on subject ``<prefix>.jobs.<Q>``: file storage, work-queue
  retention (a message is removed once acked), ``replicas`` copies;
* a durable pull consumer ``<prefix>-workers`` shared by every worker: explicit acks,
  ``AckWait`` = the app's lease (renewed with progress acks, ``+WPI``, while a handler runs),
  ``MaxDeliver`` = ``max_deliver``;
* a retry with a delay is a negative ack with that delay (``nak(delay)``) on the same
  message; what the header cannot carry any more (the attempt's history, hand-backs that
  must not count) goes to the state stream ``<prefix>_STATE``, one subject per message,
  purged when the message is acked;
* MaxDeliver is never silence: the server's MAX_DELIVERIES advisories are captured by the
  stream ``<prefix>_EXHAUSTED``; the adapter hands each such message to the harness again
  (with its true attempt count), which ends it in jobfence's dead letters.

Attempts follow SPEC R1: the message's ``num_delivered`` (every delivery, a lost one
included) minus the deliveries handed back unattempted.

URL options (removed before connecting): ``prefix`` (default ``jobfence``), ``max_deliver``
(default 20; keep it above the policies' attempts), ``replicas`` (default 1; use 3 in a
cluster), ``state_ttl`` seconds (default 8 days; longer than any retry window).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from ..errors import Category, ConfigurationError, EnqueueError
from ..jobs import AttemptRecord, Delivery, history_from, history_json
from ..store import OutgoingJob
from . import Transport
from ._broker import (
    DELAY,
    Meta,
    Options,
    ShieldedFetch,
    retry_record,
)

log = logging.getLogger("jobfence.transport.nats")

PUBLISH_BATCH = 500
#: Bytes of a message's max_payload kept for jobfence's headers. NATS counts headers into
#: max_payload; the longest headers of a first publish (a 255-character job id and
#: correlation id of 4-byte characters, percent-encoded: 3 060 bytes each, plus the attempt
#: count, enqueue time, delay and the expected stream's name) take under 7 KiB.
HEADER_ROOM = 8 * 1024
ADVISORY_ACK_WAIT = 300.0  # seconds
API_TIMEOUT = 15.0  # seconds for a JetStream API answer (a busy server can be slow)
INITIAL_CONNECT_ATTEMPTS = 3  # 0.5 s apart; reconnections after that never give up
ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
_SAFE = " !#$%&'()*+,-./:;<=>?@[]^_`{|}~"


class ClientEvents:
    """nats-py's connection callbacks, each event one log line through jobfence's logger.

    nats-py's default error callback logs every error with its traceback (a reconnecting
    client: one per attempt, twice a second). Here a lost connection, each distinct error
    and the reconnection are one WARNING line each, without a traceback; the same error
    again within ``repeat_window`` seconds (the reconnection attempts of one outage) is a
    DEBUG line, counted in the next WARNING about it and in the reconnection's line.
    """

    def __init__(self, server: str, repeat_window: float = 60.0) -> None:
        self.server = server
        self.repeat_window = repeat_window
        self.closing = False
        # the first connection: its errors become the one-line error of open(), not logs
        self.connecting = True
        self.last_error: BaseException | None = None
        self._last: dict[str, float] = {}
        self._repeats: dict[str, int] = {}
        self._down_since: float | None = None
        self._failed = 0

    async def error(self, exc: Exception) -> None:
        self.last_error = exc
        if self.connecting:
            log.debug("NATS connection attempt failed", extra={"error": _describe(exc)})
            return
        if self._down_since is not None:
            self._failed += 1
        self.note("NATS client error", exc)

    def note(self, event: str, exc: BaseException) -> None:
        """One WARNING line for ``event`` caused by ``exc``; DEBUG when it repeats."""
        text = _describe(exc)
        key = f"{event}|{text}"
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.repeat_window:
            self._repeats[key] = self._repeats.get(key, 0) + 1
            log.debug(f"{event} (again)", extra={"server": self.server, "error": text})
            return
        self._last[key] = now
        extra: dict[str, Any] = {"server": self.server, "error": text}
        repeats = self._repeats.pop(key, 0)
        if repeats:
            extra["repeated"] = repeats
        log.warning(event, extra=extra)

    async def disconnected(self) -> None:
        if self.closing:
            return
        self._down_since = time.monotonic()
        self._failed = 0
        log.warning("NATS connection lost; reconnecting", extra={"server": self.server})

    async def reconnected(self) -> None:
        extra: dict[str, Any] = {"server": self.server}
        if self._down_since is not None:
            extra["down_s"] = round(time.monotonic() - self._down_since, 3)
            extra["failed_attempts"] = self._failed
        self._down_since = None
        self._last.clear()  # the next outage's errors are news again
        self._repeats.clear()
        log.warning("NATS connection restored", extra=extra)

    async def closed(self) -> None:
        if not self.closing:
            log.warning("NATS connection closed for good", extra={"server": self.server})


#: What a connection that is down or a JetStream that is not ready (yet) raise: expected
#: during an outage, logged in one line. (nats-py's TimeoutError is also the builtin one,
#: which a pull fetch raises when there is simply nothing to fetch.)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.js.errors.ServiceUnavailableError,
)


def slug(queue: str) -> str:
    """A stream-name-safe form of a queue name (unique: a hash when characters were lost)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", queue)
    if clean != queue:
        clean += "_" + hashlib.sha1(queue.encode()).hexdigest()[:8]
    return clean


@dataclass
class _State:
    """What a message's headers cannot carry after a nak: history and refunds."""

    refunds: int = 0
    history: list[AttemptRecord] = field(default_factory=list)

    def encode(self) -> bytes:
        return json.dumps(
            {"refunds": self.refunds, "history": json.loads(history_json(self.history))}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> _State:
        raw = json.loads(data)
        return cls(int(raw.get("refunds", 0)), history_from(json.dumps(raw.get("history", []))))


@dataclass
class _Token:
    msg: Msg  # the job message (or, for an exhausted one, the advisory)
    stream: str
    seq: int
    state: _State | None
    exhausted: bool = False


class NatsTransport(Transport):
    """Jobs as messages in NATS JetStream work-queue streams."""

    name = "nats"
    shares_database = False
    #: seconds to wait for a JetStream API answer
    api_timeout = API_TIMEOUT

    def __init__(
        self,
        url: str,
        *,
        lease: timedelta = timedelta(seconds=30),
        worker_id: str = "jobfence",
        prefix: str = "jobfence",
        max_deliver: int = 20,
        replicas: int = 1,
        state_ttl: float = 8 * 86400.0,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
            raise ConfigurationError(f"NATS prefix {prefix!r} may use only A-Z a-z 0-9 _ -")
        self.url = url
        self.lease = lease
        self.worker_id = worker_id
        self.prefix = prefix
        self.max_deliver = max_deliver
        self.replicas = replicas
        self.state_ttl = state_ttl
        self.consumer = f"{prefix}-workers"
        self.state_stream = f"{prefix}_STATE"
        self.exhausted_stream = f"{prefix}_EXHAUSTED"
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._ready: set[str] = set()
        self._ready_lock = asyncio.Lock()
        self._subs: dict[str, JetStreamContext.PullSubscription] = {}
        self._advisory_subs: dict[str, JetStreamContext.PullSubscription] = {}
        self._exhausted: deque[Delivery] = deque()
        self._exhausted_keys: set[tuple[str, int]] = set()
        self._reads = ShieldedFetch()
        self._events: ClientEvents | None = None

    @classmethod
    def from_url(cls, url: str, *, lease: timedelta, worker_id: str) -> NatsTransport:
        options = Options(url, "nats")
        prefix = options.text("prefix", "jobfence")
        max_deliver = options.integer("max_deliver", 20, minimum=2)
        replicas = options.integer("replicas", 1, minimum=1)
        state_ttl = float(options.integer("state_ttl", 8 * 86400, minimum=60))
        return cls(
            options.remaining_url(),
            lease=lease,
            worker_id=worker_id,
            prefix=prefix,
            max_deliver=max_deliver,
            replicas=replicas,
            state_ttl=state_ttl,
        )

    # -- names ------------------------------------------------------------------------------

    def stream_name(self, queue: str) -> str:
        return f"{self.prefix}_{slug(queue)}"

    def subject(self, queue: str) -> str:
        return f"{self.prefix}.jobs.{slug(queue)}"

    def _state_subject(self, stream: str, seq: int) -> str:
        return f"{self.prefix}.state.{stream}.{seq}"

    # -- connection and topology ------------------------------------------------------------

    async def open(self) -> None:
        events = ClientEvents(_display(self.url))
        try:
            self._nc = await nats.connect(
                servers=[self.url],
                name=f"jobfence {self.worker_id}",
                # the first connection gives up after a few attempts (a clear error instead of
                # waiting forever for a server that is not there); once connected, the client
                # reconnects forever (set below)
                max_reconnect_attempts=INITIAL_CONNECT_ATTEMPTS,
                reconnect_time_wait=0.5,
                connect_timeout=5,
                error_cb=events.error,
                disconnected_cb=events.disconnected,
                reconnected_cb=events.reconnected,
                closed_cb=events.closed,
            )
        except (OSError, nats.errors.Error) as exc:
            cause = events.last_error or exc
            raise ConfigurationError(
                f"cannot connect to NATS at {_display(self.url)}: {_describe(cause)}"
            ) from None
        self._nc.options["max_reconnect_attempts"] = -1
        events.connecting = False
        self._events = events
        self._js = self._nc.jetstream(timeout=self.api_timeout)
        await self._ensure_stream(
            StreamConfig(
                name=self.state_stream,
                subjects=[f"{self.prefix}.state.>"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                num_replicas=self.replicas,
                max_msgs_per_subject=1,
                max_age=self.state_ttl,
                discard=DiscardPolicy.OLD,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=self.exhausted_stream,
                subjects=[f"{ADVISORY}.*.{self.consumer}"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                num_replicas=self.replicas,
            )
        )

    async def close(self) -> None:
        if self._nc is None:
            return
        if self._events is not None:
            self._events.closing = True
        for delivery in await self._reads.settle():
            try:
                await self.release(delivery, attempted=False)
            except Exception:
                log.exception("could not hand back a fetched message; AckWait will")
        for queue, sub in self._subs.items():
            # messages that reached the client after its last fetch: hand them back now,
            # refunded, instead of letting AckWait count them as lost
            pending = getattr(getattr(sub, "_sub", None), "_pending_queue", None)
            while pending is not None and not pending.empty():
                msg = pending.get_nowait()
                if msg.headers and msg.headers.get("Status"):
                    continue  # a status message of the pull protocol, not a job
                try:
                    late = await self._to_delivery(queue, msg)
                    if late is not None:
                        await self.release(late, attempted=False)
                except Exception:
                    log.exception("could not hand back a prefetched message; AckWait will")
        with contextlib.suppress(Exception):
            await self._nc.flush(timeout=5)
        with contextlib.suppress(Exception):
            await self._nc.close()
        self._nc = None
        self._js = None
        self._subs.clear()
        self._advisory_subs.clear()
        self._ready.clear()

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("the NATS transport is not open")
        return self._js

    async def _ensure_stream(self, config: StreamConfig) -> None:
        assert config.name is not None
        try:
            info = await self.js.stream_info(config.name)
        except nats.js.errors.NotFoundError:
            await self.js.add_stream(config)
            return
        if info.config.storage != StorageType.FILE:
            raise ConfigurationError(
                f"NATS stream {config.name!r} exists with {info.config.storage} storage; "
                "jobfence needs file storage: delete the stream or use another prefix"
            )

    def stream_config(self, queue: str) -> StreamConfig:
        return StreamConfig(
            name=self.stream_name(queue),
            subjects=[self.subject(queue)],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            discard=DiscardPolicy.NEW,
        )

    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.consumer,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.lease.total_seconds(),
            max_deliver=self.max_deliver,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=10_000,
        )

    async def declare(self, queue: str) -> None:
        """Create ``queue``'s stream and its durable consumer (idempotent)."""
        if queue in self._ready:
            return
        async with self._ready_lock:
            if queue in self._ready:
                return
            stream = self.stream_name(queue)
            await self._ensure_stream(self.stream_config(queue))
            try:
                await self.js.consumer_info(stream, self.consumer)
            except nats.js.errors.NotFoundError:
                await self.js.add_consumer(stream, self.consumer_config())
            try:
                await self.js.consumer_info(self.exhausted_stream, stream)
            except nats.js.errors.NotFoundError:
                await self.js.add_consumer(
                    self.exhausted_stream,
                    ConsumerConfig(
                        durable_name=stream,
                        ack_policy=AckPolicy.EXPLICIT,
                        # held in this worker until a harness takes it: a long wait, and
                        # a redelivered advisory is recognised and not handed out twice
                        ack_wait=max(self.lease.total_seconds(), ADVISORY_ACK_WAIT),
                        filter_subject=f"{ADVISORY}.{stream}.{self.consumer}",
                    ),
                )
            self._ready.add(queue)

    # -- publishing -------------------------------------------------------------------------

    @property
    def server_max_payload(self) -> int:
        """The connected server's max_payload (headers included), 0 when not connected."""
        return self._nc.max_payload if self._nc is not None else 0

    @property
    def max_payload(self) -> int | None:
        if self._nc is None:
            return None
        return self._nc.max_payload - HEADER_ROOM

    @property
    def max_payload_reason(self) -> str:
        return (
            f"the server's max_payload, {self.server_max_payload} bytes with headers, less "
            f"{HEADER_ROOM} for jobfence's headers"
        )

    async def _send(self, queue: str, payload: bytes, meta: Meta, delay: float) -> None:
        headers = {k: quote(v, safe=_SAFE) for k, v in meta.headers().items()}
        if delay > 0:
            headers[DELAY] = f"{delay:.6f}"
        # the server closes the connection on a message over max_payload: never send one
        # (a copy of a job can carry more headers than HEADER_ROOM: its attempt history)
        stream = self.stream_name(queue)
        size = len(payload) + _header_bytes({**headers, "Nats-Expected-Stream": stream})
        if self._nc is not None and size > self._nc.max_payload:
            raise EnqueueError(
                f"message of job {meta.job_id!r} is {size} bytes with its headers; the NATS "
                f"server takes at most {self._nc.max_payload} bytes (max_payload)"
            )
        await self.js.publish(self.subject(queue), payload, stream=stream, headers=headers)

    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        self.check_payloads(jobs)
        for queue in {job.queue for job in jobs}:
            await self.declare(queue)
        for start in range(0, len(jobs), PUBLISH_BATCH):
            chunk = jobs[start : start + PUBLISH_BATCH]
            await asyncio.gather(
                *(self._send(job.queue, job.payload, Meta.new(job), job.delay) for job in chunk)
            )

    # -- state of a message -----------------------------------------------------------------

    async def _load_state(self, stream: str, seq: int) -> _State | None:
        try:
            raw = await self.js.get_last_msg(self.state_stream, self._state_subject(stream, seq))
        except nats.js.errors.APIError as exc:
            if _missing(exc):
                return None
            raise
        return _State.decode(raw.data or b"{}")

    async def _save_state(self, stream: str, seq: int, state: _State) -> None:
        await self.js.publish(
            self._state_subject(stream, seq), state.encode(), stream=self.state_stream
        )

    async def _drop_state(self, stream: str, seq: int) -> None:
        await self.js.purge_stream(self.state_stream, subject=self._state_subject(stream, seq))

    # -- consuming --------------------------------------------------------------------------

    async def _sub(self, queue: str) -> JetStreamContext.PullSubscription:
        sub = self._subs.get(queue)
        if sub is None:
            await self.declare(queue)
            sub = await self.js.pull_subscribe_bind(
                durable=self.consumer, stream=self.stream_name(queue)
            )
            self._subs[queue] = sub
        return sub

    async def _to_delivery(self, queue: str, msg: Msg) -> Delivery | None:
        """The delivery for ``msg``, or None when it is not due yet (it is nak'ed until it
        is, and that delivery is refunded)."""
        md = msg.metadata
        stream, seq = md.stream, md.sequence.stream
        headers = {k: unquote(v) for k, v in (msg.headers or {}).items()}
        meta = Meta.read(headers)
        state = await self._load_state(stream, seq) if md.num_delivered > 1 else None
        delay = float(headers.get(DELAY) or 0)
        if delay > 0:
            due = md.timestamp.timestamp() + delay
            wait = due - time.time()
            if wait > 0.001:
                state = state or _State()
                state.refunds += 1
                await self._save_state(stream, seq, state)
                await msg.nak(delay=wait)
                return None
        refunds = state.refunds if state else 0
        attempt = meta.attempts + md.num_delivered - refunds
        history = [*meta.history, *(state.history if state else [])]
        meta = Meta(meta.job_id, meta.correlation_id, meta.enqueued_at, meta.attempts, history)
        token = _Token(msg, stream, seq, state)
        return meta.delivery(queue, msg.data, attempt, token=token, ref=stream)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        if limit <= 0:
            return []
        found: list[Delivery] = []
        while self._exhausted and len(found) < limit:
            found.append(self._exhausted.popleft())
        found += self._reads.take(limit - len(found))
        if found:
            return found
        return await self._reads.run(self._read(queues, limit, timeout))

    async def _read(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        found: list[Delivery] = []
        per_queue = max(timeout / max(len(queues), 1), 0.05)
        for queue in queues:
            if len(found) >= limit:
                break
            try:
                sub = await self._sub(queue)
                msgs = await sub.fetch(batch=limit - len(found), timeout=per_queue)
            except UNAVAILABLE as exc:
                # the server is away or JetStream not ready yet (a restart): one line, not
                # a traceback per fetch; the client reconnects by itself
                if not isinstance(exc, TimeoutError) or queue not in self._subs:
                    self._note("NATS unavailable while fetching; trying again", exc)
                    await asyncio.sleep(per_queue)
                continue  # a fetch that timed out: nothing there
            for msg in msgs:
                delivery = await self._to_delivery(queue, msg)
                if delivery is not None:
                    found.append(delivery)
        return found

    def _note(self, event: str, exc: BaseException) -> None:
        if self._events is not None:
            self._events.note(event, exc)
        else:
            log.warning(event, extra={"error": _describe(exc)})

    # -- answers ----------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        token: _Token = delivery.token
        if token.exhausted:
            self._exhausted_keys.discard((token.stream, token.seq))
            try:
                await self.js.delete_msg(token.stream, token.seq)
            except nats.js.errors.APIError as exc:
                if not _missing(exc):
                    raise
            await token.msg.ack()
        else:
            await token.msg.ack()
        if token.state is not None or token.exhausted:
            await self._drop_state(token.stream, token.seq)

    async def retry(
        self, delivery: Delivery, delay: timedelta, category: Category, error: str
    ) -> None:
        token: _Token = delivery.token
        record = retry_record(delivery, delay, category, error)
        if token.exhausted:
            # the server will not deliver this message again: publish a new copy
            meta = Meta.again(
                delivery, attempts=delivery.attempt, history=[*delivery.history, record]
            )
            await self._send(delivery.queue, delivery.payload, meta, delay.total_seconds())
            await self.ack(delivery)
            return
        state = token.state or _State()
        state.history.append(record)
        await self._save_state(token.stream, token.seq, state)
        token.state = state
        await token.msg.nak(delay=delay.total_seconds() or None)

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        token: _Token = delivery.token
        if token.exhausted:
            self._exhausted_keys.discard((token.stream, token.seq))
            await token.msg.nak()  # the advisory comes back; the count is unchanged
            return
        if not attempted:
            state = token.state or _State()
            state.refunds += 1
            await self._save_state(token.stream, token.seq, state)
        await token.msg.nak()

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            token: _Token = delivery.token
            with contextlib.suppress(Exception):
                await token.msg.in_progress()

    async def maintenance(self) -> None:
        """Collect messages JetStream stopped redelivering (MaxDeliver reached)."""
        for queue in list(self._subs):
            stream = self.stream_name(queue)
            sub = self._advisory_subs.get(queue)
            if sub is None:
                sub = await self.js.pull_subscribe_bind(
                    durable=stream, stream=self.exhausted_stream
                )
                self._advisory_subs[queue] = sub
            try:
                advisories = await sub.fetch(batch=50, timeout=0.1)
            except TimeoutError:
                continue
            for advisory in advisories:
                key = (stream, int(json.loads(advisory.data)["stream_seq"]))
                if key in self._exhausted_keys:
                    await advisory.in_progress()  # already waiting for a harness
                    continue
                delivery = await self._from_advisory(queue, stream, advisory)
                if delivery is not None:
                    self._exhausted_keys.add(key)
                    self._exhausted.append(delivery)

    async def _from_advisory(self, queue: str, stream: str, advisory: Msg) -> Delivery | None:
        info = json.loads(advisory.data)
        seq = int(info["stream_seq"])
        try:
            raw = await self.js.get_msg(stream, seq)
        except nats.js.errors.APIError as exc:
            if not _missing(exc):
                raise
            await advisory.ack()  # acked or handled meanwhile
            return None
        headers = {k: unquote(v) for k, v in (raw.headers or {}).items()}
        meta = Meta.read(headers)
        state = await self._load_state(stream, seq)
        refunds = state.refunds if state else 0
        attempt = meta.attempts + int(info.get("deliveries", self.max_deliver)) - refunds + 1
        history = [*meta.history, *(state.history if state else [])]
        meta = Meta(meta.job_id, meta.correlation_id, meta.enqueued_at, meta.attempts, history)
        log.warning(
            "JetStream stopped redelivering a message (MaxDeliver): handing it to the harness",
            extra={"job_id": meta.job_id, "stream": stream, "seq": seq},
        )
        token = _Token(advisory, stream, seq, state, exhausted=True)
        return meta.delivery(queue, raw.data or b"", attempt, token=token, ref=stream)

    # -- introspection ----------------------------------------------------------------------

    async def durability(self, queue: str) -> dict[str, Any]:
        """The stream and consumer settings as the server reports them."""
        await self.declare(queue)
        info = await self.js.stream_info(self.stream_name(queue))
        consumer = await self.js.consumer_info(self.stream_name(queue), self.consumer)
        return {
            "storage": info.config.storage,
            "retention": info.config.retention,
            "replicas": info.config.num_replicas,
            "ack_policy": consumer.config.ack_policy,
            "ack_wait": consumer.config.ack_wait,
            "max_deliver": consumer.config.max_deliver,
            "durable": consumer.config.durable_name,
        }


def _describe(exc: BaseException) -> str:
    detail = str(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _display(url: str) -> str:
    """``url`` without its secret (``nats://user:***@host``; a token alone: ``***@host``)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    masked = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))


def _header_bytes(headers: dict[str, str]) -> int:
    """The size of ``headers`` on the wire (``NATS/1.0``, a line each, a blank line)."""
    return len(b"NATS/1.0\r\n\r\n") + sum(
        len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()
    )


def _missing(exc: nats.js.errors.APIError) -> bool:
    """The server says the message is not there (404, or "no message found")."""
    if isinstance(exc, nats.js.errors.NotFoundError):
        return True
    return "no message found" in str(getattr(exc, "description", "") or "").lower()
