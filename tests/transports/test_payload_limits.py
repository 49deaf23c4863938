"""Every transport states its payload size limit and enforces it at enqueue (issue 10 §3.2).

A payload above the limit is an ``EnqueueError`` that names the size and the limit, before
anything is sent (a batch with one such job enqueues nothing); the CLI prints one line. The
limits are the servers' own: NATS's ``max_payload`` from the connection, less room for
jobfence's headers; RabbitMQ's ``max_message_size``; Redis's bulk and query-buffer limits;
what a PostgreSQL or SQLite row can hold and give back. Oversized payloads are ``bytes(n)``:
zero pages the OS maps lazily, so a 1 GB payload costs no memory until something reads it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobfence import EnqueueError
from jobfence.core.jobs import Delivery
from jobfence.transports.nats import NatsTransport
from jobfence.transports.rabbitmq import RabbitMQTransport

from ..contract.support import KINDS, Target, cleanup, make_target, remaining
from ..helpers import REPO, eventually

MiB = 1024 * 1024


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


def _names_size_and_limit(exc: EnqueueError, size: int, limit: int, kind: str) -> None:
    message = str(exc)
    assert f"{size} bytes" in message, message
    assert f"at most {limit} bytes" in message, message
    assert kind in message, message
    assert "\n" not in message


async def test_each_transport_states_its_limit_and_refuses_a_bigger_payload(
    target: Target,
) -> None:
    """The transport's ``max_payload`` is a number of bytes; one byte more is refused with
    both numbers in the message, alone or in a batch (which then enqueues nothing), and on
    the database queue also inside the caller's transaction and from sync code."""
    app = target.app()
    async with app:
        limit = app.transport.max_payload
        assert isinstance(limit, int)
        assert limit >= 1_000_000, limit  # NATS's default is the smallest: 1 MiB less headers
        big = bytes(limit + 1)
        with pytest.raises(EnqueueError) as caught:
            await app.enqueue(target.queue, big, job_id="too-big")
        _names_size_and_limit(caught.value, limit + 1, limit, app.transport.name)

        await app.enqueue(target.queue, b"small", job_id="small-1")
        batch = [
            app.job(target.queue, b"small", job_id="small-2"),
            app.job(target.queue, big, job_id="too-big"),
        ]
        with pytest.raises(EnqueueError):
            await app.enqueue_many(batch)
        if target.kind in ("postgresql", "sqlite"):
            async with app.db.transaction() as tx:
                with pytest.raises(EnqueueError) as caught:
                    await app.enqueue(target.queue, big, job_id="too-big", connection=tx)
            _names_size_and_limit(caught.value, limit + 1, limit, target.kind)
            with pytest.raises(EnqueueError):
                await asyncio.to_thread(app.enqueue_sync, target.queue, big, job_id="too-big")
    assert await remaining(target) == 1  # small-1 only


async def test_nats_limit_leaves_room_for_the_longest_headers(nats: Target) -> None:
    """NATS counts headers into ``max_payload``, and a message over it makes the server
    close the connection. The stated limit is the server's value less room for jobfence's
    headers: a payload of exactly the limit with the longest ids goes through byte-exact;
    a payload of the server's own max_payload is refused before it is sent, and the
    connection keeps working."""
    app = nats.app()
    async with app:
        transport = app.transport
        assert isinstance(transport, NatsTransport)
        server_max = transport.server_max_payload
        limit = transport.max_payload
        assert limit is not None
        assert 0 < server_max - limit <= 16 * 1024
        payload = (bytes(range(256)) * (limit // 256 + 1))[:limit]
        job_id = "€" * 255  # 3 UTF-8 bytes each, every one percent-encoded in the header
        correlation_id = "😀" * 255  # 4 bytes each
        await app.enqueue(nats.queue, payload, job_id=job_id, correlation_id=correlation_id)

        with pytest.raises(EnqueueError) as caught:
            await app.enqueue(nats.queue, bytes(server_max), job_id="server-max")
        _names_size_and_limit(caught.value, server_max, limit, "nats")
        await app.enqueue(nats.queue, b"after", job_id="after-1")

        got: list[Delivery] = []

        async def both() -> bool:
            got.extend(await transport.fetch([nats.queue], 2, 0.5))
            return len(got) >= 2

        await eventually(both, what="both messages")
        by_id = {d.job_id: d for d in got}
        assert by_id[job_id].payload == payload
        assert by_id[job_id].correlation_id == correlation_id
        assert by_id["after-1"].payload == b"after"
        for delivery in got:
            await transport.ack(delivery)


async def test_rabbitmq_takes_a_body_of_exactly_its_limit(rabbitmq: Target) -> None:
    """RabbitMQ checks the body against max_message_size (128 MiB by default on 3.8–3.13,
    16 MiB from 4.0; ``?max_message_size=`` for a server configured otherwise): a body of
    exactly the stated limit is confirmed by this server."""
    app = rabbitmq.app()
    async with app:
        transport = app.transport
        assert isinstance(transport, RabbitMQTransport)
        assert transport.max_payload == (
            128 * MiB if transport.server_version.startswith("3.") else 16 * MiB
        )
        await app.enqueue(rabbitmq.queue, bytes(transport.max_payload), job_id="at-limit")
    assert await remaining(rabbitmq) == 1


def test_the_cli_refuses_a_payload_above_the_nats_limit_in_one_line(nats: Target) -> None:
    """`jobfence enqueue --raw --payload -` with 1 MiB + 1 bytes on NATS: one line naming
    the size and the limit, exit 1, no traceback."""
    assert nats.transport_url is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    result = subprocess.run(
        [
            sys.executable, "-m", "jobfence.cli", "enqueue", nats.queue, "--raw",
            "--payload", "-", "--database-url", nats.database_url,
            "--transport", nats.transport_url,
        ],
        cwd=REPO, env=env, input=bytes(MiB + 1), capture_output=True, timeout=120,
    )  # fmt: skip
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jobfence: error: payload of job ")
    assert f"{MiB + 1} bytes" in lines[0]
    assert "the nats transport takes at most" in lines[0]
