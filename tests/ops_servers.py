"""Real ``jobfence ops serve`` processes for tests, and a tiny round-robin TCP proxy in front
of several of them (loopback only): what a Kubernetes Service without session affinity does
to a browser talking to two replicas."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from .helpers import REPO, eventually


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OpsServe:
    """``jobfence ops serve`` as a subprocess on its own loopback port."""

    def __init__(self, database_url: str, log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "jobfence.cli", "ops", "serve"),
                    *("--database-url", database_url, "--port", str(self.port)),
                    *("--log-level", "warning", *args),
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def started(self) -> None:
        async def answers() -> bool:
            assert self.proc.poll() is None, f"ops serve exited:\n{self.output()}"
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    return (await client.get(f"{self.url}/livez")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(answers, timeout=60, interval=0.1, what="ops serve answering /livez")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@asynccontextmanager
async def ops_servers(
    database_url: str, folder: Path, count: int = 1, *args: str
) -> AsyncIterator[list[OpsServe]]:
    servers = [OpsServe(database_url, folder / f"ops-{i}.log", *args) for i in range(count)]
    try:
        for server in servers:
            await server.started()
        yield servers
    finally:
        for server in servers:
            server.stop()


class RoundRobinProxy:
    """Each request goes to the next backend in turn: the proxy reads one request from the
    client, asks the backend to close after answering (``Connection: close``), copies the
    answer back and closes, so a browser's next request opens a new connection and lands on
    the other replica. Loopback only; enough HTTP/1.1 for a console (bodies with a
    Content-Length)."""

    def __init__(self, backends: Sequence[int]) -> None:
        self.backends = list(backends)
        self.requests: list[tuple[int, str]] = []  # (backend index, request line)
        self._next = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RoundRobinProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")[:-2]
        kept = [h for h in lines[1:] if not h.lower().startswith(("connection:", "keep-alive:"))]
        length = next(
            (int(h.split(":", 1)[1]) for h in kept if h.lower().startswith("content-length:")), 0
        )
        body = await reader.readexactly(length) if length else b""
        index = self._next
        self._next = (self._next + 1) % len(self.backends)
        self.requests.append((index, lines[0]))
        request = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backends[index])
            up_writer.write(request + body)
            await up_writer.drain()
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
            up_writer.close()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def backends_of(self, fragment: str) -> set[int]:
        """The backends that served requests whose request line contains ``fragment``."""
        return {i for i, line in self.requests if fragment in line}
