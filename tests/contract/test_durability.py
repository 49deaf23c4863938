"""Each transport's declared durability, read back from the server itself (SPEC Q1)."""

from __future__ import annotations

import json
import logging
import subprocess
from datetime import timedelta
from typing import Any

import pytest

from jobfence import Job, Tx
from jobfence.transports.nats import NatsTransport
from jobfence.transports.pubsub import PubSubTransport
from jobfence.transports.rabbitmq import delay_bucket, delay_name, exhausted_name
from jobfence.transports.redis import RedisTransport

from ..helpers import query
from .servers import RedisServer
from .support import Target


def rabbitmq_queues(*names: str) -> dict[str, dict[str, Any]]:
    """Queue type, durability and arguments as ``rabbitmqctl`` reports them."""
    out = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "type", "durable", "arguments",
         "--formatter", "json", "--quiet"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    found = {}
    for queue in json.loads(out):
        if queue["name"] in names:
            arguments = {key: value for key, _type, value in queue["arguments"]}
            found[queue["name"]] = {
                "type": queue["type"],
                "durable": queue["durable"],
                "arguments": arguments,
            }
    return found


async def test_the_queue_is_as_durable_as_declared(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL: fsync and synchronous commit on, the queue a logged table. SQLite: WAL,
    synchronous FULL. RabbitMQ: durable quorum queues, delivery limit dead-lettered at least
    once. NATS: file-backed work-queue streams, explicit acks, AckWait = lease. Redis: the
    adapter reports the server's persistence and warns when it keeps nothing. Pub/Sub: the
    seed's subscription (dead-letter topic ``<topic>.dlq`` after 10 deliveries, backoff 10 s to
    10 min), exactly-once delivery off, and the DLQ and delay subscriptions, as the emulator
    reports them (it keeps them in memory only: see test_restart)."""
    app = target.app(lease=5.0)

    @app.consumer(target.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        return None

    caplog.set_level(logging.WARNING, logger="jobfence.transport.redis")
    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="d-1", delay=0.5)
        if target.kind == "sqlite":
            async with app.db.transaction() as tx:
                mode = await tx.fetchall("PRAGMA journal_mode")
                sync = await tx.fetchall("PRAGMA synchronous")
        transport = app.transport

        if target.kind == "postgresql":
            settings = await query(
                target.database_url,
                "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
                "relpersistence FROM pg_class WHERE oid = 'core.jobs'::regclass",
            )
            assert settings == [("on", "on", "p")]
        elif target.kind == "sqlite":
            assert (mode, sync) == ([("wal",)], [(2,)])
        elif target.kind == "rabbitmq":
            bucket = delay_bucket(0.5)
            delayed = delay_name(target.queue, bucket)
            queues = rabbitmq_queues(target.queue, exhausted_name(target.queue), delayed)
            assert queues[target.queue] == {
                "type": "quorum",
                "durable": True,
                "arguments": {
                    "x-queue-type": "quorum",
                    "x-delivery-limit": 20,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": exhausted_name(target.queue),
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            }
            assert queues[exhausted_name(target.queue)] == {
                "type": "quorum",
                "durable": True,
                "arguments": {"x-queue-type": "quorum"},
            }
            assert queues[delayed]["type"] == "quorum"
            # a 0.5 s retry waits 512 ms: buckets round up (490 ms ran it early)
            assert queues[delayed]["arguments"]["x-message-ttl"] == bucket == 512
            assert queues[delayed]["arguments"]["x-dead-letter-routing-key"] == target.queue
        elif target.kind == "nats":
            assert isinstance(transport, NatsTransport)
            assert await transport.durability(target.queue) == {
                "storage": "file",
                "retention": "workqueue",
                "replicas": 1,
                "ack_policy": "explicit",
                "ack_wait": 5.0,
                "max_deliver": 20,
                "durable": transport.consumer,
            }
            for stream in (transport.state_stream, transport.exhausted_stream):
                info = await transport.js.stream_info(stream)
                assert info.config.storage == "file"
        elif target.kind == "pubsub":
            assert isinstance(transport, PubSubTransport)
            names = transport.names(target.queue)
            assert names.topic == f"jobfence.{target.queue}"
            assert await transport.durability(target.queue) == {
                "topic": names.topic,
                "subscription": f"{names.topic}.workers",
                "ack_deadline_seconds": 10,  # Pub/Sub's minimum; the lease is set per message
                "dead_letter_topic": f"{names.topic}.dlq",
                "max_delivery_attempts": 10,
                "minimum_backoff": 10.0,
                "maximum_backoff": 600.0,
                "exactly_once": False,
                "dlq_subscription": (f"{names.topic}.dlq.workers", f"{names.topic}.dlq"),
                # no dead-letter policy, no backoff: a held delayed job comes back on time
                "delay_subscription": (
                    f"{names.topic}.delay.workers",
                    f"{names.topic}.delay",
                    False,
                    0.0,
                ),
            }
        else:
            assert isinstance(transport, RedisTransport)
            # the shared test server runs with --appendonly no: it loses all on restart
            assert await transport.durability() == {
                "appendonly": "no",
                "appendfsync": "everysec",
                "save": "",
            }
            warnings = [r.getMessage() for r in caplog.records]
            assert any("a restart loses every queued job" in w for w in warnings), warnings


async def test_redis_with_an_append_only_file_reports_it_and_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a Redis started with --appendonly yes --appendfsync always the adapter reads
    exactly that back and logs no warning."""
    server = RedisServer()
    server.start()
    try:
        caplog.set_level(logging.WARNING, logger="jobfence.transport.redis")
        red = RedisTransport.from_url(server.url, lease=timedelta(seconds=5), worker_id="t")
        await red.open()
        try:
            assert await red.durability() == {
                "appendonly": "yes",
                "appendfsync": "always",
                "save": "",
            }
        finally:
            await red.close()
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        server.close()
