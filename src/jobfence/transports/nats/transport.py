"""The NATS JetStream adapter (see :mod:`jobfence.transports.nats` for the layout on the
server): connecting, publishing, consuming, the answers, and the messages JetStream stopped
redelivering (MaxDeliver)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from urllib.parse import quote, unquote

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from ...core.jobs import Delivery, OutgoingJob
from ...errors import Category, ConfigurationError, EnqueueError
from .. import Transport
from .._broker import (
    DELAY,
    Meta,
    Options,
    deferred_history,
    retry_record,
)
from ..shielded import ShieldedFetch
from .connection import (
    API_TIMEOUT,
    INITIAL_CONNECT_ATTEMPTS,
    UNAVAILABLE,
    ClientEvents,
    describe_error,
    display_url,
    is_missing,
    log,
)
from .messages import HEADER_ROOM, SAFE_CHARS, MessageState, MessageToken, header_bytes
from .topology import ADVISORY, NatsTopology

PUBLISH_BATCH = 500


class NatsTransport(NatsTopology, Transport):
    """Jobs as messages in NATS JetStream work-queue streams."""

    name = "nats"
    no_priorities_reason = (
        "a JetStream consumer delivers in stream order; NATS has no message priorities"
    )
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

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> None:
        events = ClientEvents(display_url(self.url))
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
                f"cannot connect to NATS at {display_url(self.url)}: {describe_error(cause)}"
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
        headers = {k: quote(v, safe=SAFE_CHARS) for k, v in meta.headers().items()}
        if delay > 0:
            headers[DELAY] = f"{delay:.6f}"
        # the server closes the connection on a message over max_payload: never send one
        # (a copy of a job can carry more headers than HEADER_ROOM: its attempt history)
        stream = self.stream_name(queue)
        size = len(payload) + header_bytes({**headers, "Nats-Expected-Stream": stream})
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

    async def _load_state(self, stream: str, seq: int) -> MessageState | None:
        try:
            raw = await self.js.get_last_msg(self.state_stream, self._state_subject(stream, seq))
        except nats.js.errors.APIError as exc:
            if is_missing(exc):
                return None
            raise
        return MessageState.decode(raw.data or b"{}")

    async def _save_state(self, stream: str, seq: int, state: MessageState) -> None:
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
                state = state or MessageState()
                state.refunds += 1
                await self._save_state(stream, seq, state)
                await msg.nak(delay=wait)
                return None
        refunds = state.refunds if state else 0
        attempt = meta.attempts + md.num_delivered - refunds
        history = [*meta.history, *(state.history if state else [])]
        meta = replace(meta, history=history)
        token = MessageToken(msg, stream, seq, state)
        return meta.delivery(queue, msg.data, attempt, token=token, ref=stream)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        return await self._reads.fetch(
            self._exhausted, limit, lambda: self._read(queues, limit, timeout)
        )

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
            log.warning(event, extra={"error": describe_error(exc)})

    # -- answers ----------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        token: MessageToken = delivery.token
        if token.exhausted:
            self._exhausted_keys.discard((token.stream, token.seq))
            try:
                await self.js.delete_msg(token.stream, token.seq)
            except nats.js.errors.APIError as exc:
                if not is_missing(exc):
                    raise
            await token.msg.ack()
        else:
            await token.msg.ack()
        if token.state is not None or token.exhausted:
            await self._drop_state(token.stream, token.seq)

    async def retry(
        self,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        token: MessageToken = delivery.token
        record = retry_record(delivery, delay, category, error, trace)
        if token.exhausted:
            # the server will not deliver this message again: publish a new copy
            meta = Meta.again(
                delivery, attempts=delivery.attempt, history=[*delivery.history, record]
            )
            await self._send(delivery.queue, delivery.payload, meta, delay.total_seconds())
            await self.ack(delivery)
            return
        state = token.state or MessageState()
        state.history.append(record)
        await self._save_state(token.stream, token.seq, state)
        token.state = state
        await token.msg.nak(delay=delay.total_seconds() or None)

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        token: MessageToken = delivery.token
        if token.exhausted:
            self._exhausted_keys.discard((token.stream, token.seq))
            await token.msg.nak()  # the advisory comes back; the count is unchanged
            return
        if not attempted:
            state = token.state or MessageState()
            state.refunds += 1
            await self._save_state(token.stream, token.seq, state)
        await token.msg.nak()

    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        """Nak'ed with ``delay`` and the delivery refunded in the message's state, while its
        ``num_delivered`` leaves room under MaxDeliver (a nak counts a delivery there);
        else, and for a message JetStream gave up on, a refunded copy with the delay in its
        header is published and the old one acked, so no number of deferrals reaches
        MaxDeliver."""
        token: MessageToken = delivery.token
        seconds = max(delay.total_seconds(), 0.0)
        if not token.exhausted and token.msg.metadata.num_delivered < self.max_deliver - 1:
            state = token.state or MessageState()
            state.refunds += 1
            if note is not None:
                state.history.append(deferred_history(delivery, delay, note)[-1])
            await self._save_state(token.stream, token.seq, state)
            token.state = state
            await token.msg.nak(delay=seconds or None)
            return
        history = deferred_history(delivery, delay, note)
        meta = Meta.again(delivery, attempts=delivery.attempt - 1, history=history)
        await self._send(delivery.queue, delivery.payload, meta, seconds)
        await self.ack(delivery)

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            token: MessageToken = delivery.token
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
            if not is_missing(exc):
                raise
            await advisory.ack()  # acked or handled meanwhile
            return None
        headers = {k: unquote(v) for k, v in (raw.headers or {}).items()}
        meta = Meta.read(headers)
        state = await self._load_state(stream, seq)
        refunds = state.refunds if state else 0
        attempt = meta.attempts + int(info.get("deliveries", self.max_deliver)) - refunds + 1
        history = [*meta.history, *(state.history if state else [])]
        meta = replace(meta, history=history)
        log.warning(
            "JetStream stopped redelivering a message (MaxDeliver): handing it to the harness",
            extra={"job_id": meta.job_id, "stream": stream, "seq": seq},
        )
        token = MessageToken(advisory, stream, seq, state, exhausted=True)
        return meta.delivery(queue, raw.data or b"", attempt, token=token, ref=stream)
