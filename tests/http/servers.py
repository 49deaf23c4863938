"""Real HTTP servers on loopback for tests: uvicorn in the test's event loop, or a process."""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn


def loopback_socket() -> socket.socket:
    """A bound loopback socket on a free port. IPPROTO_TCP explicitly: asyncio sets
    TCP_NODELAY only on sockets that say so, and without it loopback answers take 40 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 (lifespan on); yield its base URL."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if task.done():
                await task
                raise RuntimeError("uvicorn stopped before it started")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start within 20 s")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=30)
        sock.close()


def start_server_process(module: str, *args: str, timeout: float = 30.0) -> tuple[Any, str]:
    """Run ``python -m module args…``, which prints ``listening on http://…`` first; return
    the process and the URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if "listening on " not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{module} did not start (said {line.strip()!r})")
    return proc, line.strip().rsplit(" ", 1)[-1]
