"""Every place jobfence serves HTTP answers a keep-alive request in a few ms on loopback
(issue 16 §1). A server handed a socket opened as ``socket.socket()`` (protocol 0) gets no
TCP_NODELAY from asyncio, and each response then waits ~40 ms for the client's delayed ACK;
the first test shows the probe sees exactly that, so the others can fail."""

from __future__ import annotations

import asyncio
import http.client
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from jobfence.http import tcp_listen_socket
from jobfence_examples.purchase_orders.demo import LocalStack, Scenario
from jobfence_examples.purchase_orders.erp import ErpProcess

from ..helpers import REPO, wait_until

#: Nagle + delayed ACK costs ≥ 40 ms per answer; a healthy loopback answer is < 2 ms. The
#: threshold sits far from both, so machine load cannot flip the verdict.
HEALTHY_MS = 15.0


def keepalive_ms(url: str, path: str = "/healthz", requests: int = 15) -> float:
    """The fastest of ``requests`` GETs sent one after another on one connection. Nagle and
    delayed ACK delay *every* answer by ≥ 40 ms, so even the fastest shows it; a loaded machine
    only delays some answers, so the fastest stays quick (the median did not, at load 12)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    times = []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            assert response.status < 500, response.status
            times.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return min(times[1:])  # the first one pays for the connection


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def served(sock: socket.socket) -> AsyncIterator[str]:
    server = uvicorn.Server(uvicorn.Config(hello, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=30)
        sock.close()


async def test_the_probe_sees_the_delay_of_a_protocol_0_socket() -> None:
    sock = socket.socket()  # what bench/systems/http_server.py used to do
    sock.bind(("127.0.0.1", 0))
    async with served(sock) as url:
        assert await asyncio.to_thread(keepalive_ms, url, "/") >= 30


async def test_tcp_listen_socket_answers_keepalive_requests_at_once() -> None:
    async with served(tcp_listen_socket()) as url:
        assert await asyncio.to_thread(keepalive_ms, url, "/") < HEALTHY_MS


async def test_the_purchase_order_demo_api_and_erp_answer_at_once(pg_database: str) -> None:
    erp = ErpProcess()
    erp.start()
    try:
        async with LocalStack(pg_database, Scenario(), pipeline=False, erp=erp) as stack:
            assert await asyncio.to_thread(keepalive_ms, stack.api_url) < HEALTHY_MS
            assert await asyncio.to_thread(keepalive_ms, erp.url, "/_stats") < HEALTHY_MS
    finally:
        erp.stop()


def test_ops_serve_answers_keepalive_requests_at_once(pg_database: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "jobfence.cli", "ops", "serve"),
            *("--database-url", pg_database, "--port", str(port), "--log-level", "warning"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                return keepalive_ms(url, requests=2) >= 0
            except OSError:
                return False

        wait_until(up, timeout=60, what="ops serve answering /healthz")
        assert keepalive_ms(url) < HEALTHY_MS
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
