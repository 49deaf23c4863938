"""The NATS topology of jobfence queues: names, the work-queue streams, the workers' durable
consumer and the MaxDeliver advisories' consumers (created once, idempotently)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from datetime import timedelta
from typing import Any

import nats.js.errors
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

from ...errors import ConfigurationError

ADVISORY_ACK_WAIT = 300.0  # seconds
ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"


def slug(queue: str) -> str:
    """A stream-name-safe form of a queue name (unique: a hash when characters were lost)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", queue)
    if clean != queue:
        clean += "_" + hashlib.sha1(queue.encode()).hexdigest()[:8]
    return clean


class NatsTopology:
    """The names, streams and consumers of a :class:`~.transport.NatsTransport` (its base)."""

    prefix: str
    lease: timedelta
    max_deliver: int
    replicas: int
    consumer: str
    exhausted_stream: str
    _js: JetStreamContext | None
    _ready: set[str]
    _ready_lock: asyncio.Lock

    # -- names ------------------------------------------------------------------------------

    def stream_name(self, queue: str) -> str:
        return f"{self.prefix}_{slug(queue)}"

    def subject(self, queue: str) -> str:
        return f"{self.prefix}.jobs.{slug(queue)}"

    def _state_subject(self, stream: str, seq: int) -> str:
        return f"{self.prefix}.state.{stream}.{seq}"

    # -- streams and consumers --------------------------------------------------------------

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
