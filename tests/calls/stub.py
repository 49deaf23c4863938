"""A downstream for the call ledger's fault suite: a tiny HTTP/1.1 server on loopback, run as
its own process (``python -m tests.calls.stub PORTFILE``).

It does **not** deduplicate: every ``POST /orders`` it reads is an effect, counted per
``Idempotency-Key`` (``GET /effects``). ``GET /orders/<key>`` finds a key's order (404: none),
for reconcile. A request's ``X-Fault`` header injects what can go wrong around an effect:

- ``timeout``: apply, then answer only after ``SLOW`` seconds (the client times out first)
- ``reset``: apply, then drop the connection without an answer
- ``reset_before``: drop the connection without applying
- ``500``: apply, then answer 500
- ``503``: answer 503 without applying
- ``kill``: apply, then ``kill -9`` the worker named by ``X-Worker-Pid`` (the request was in
  flight when its worker died), then drop the connection
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

SLOW = 3.0

effects: collections.Counter[str] = collections.Counter()
orders: dict[str, str] = {}
faults: collections.Counter[str] = collections.Counter()


async def _read(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return method, target, headers, body


def _answer(writer: asyncio.StreamWriter, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    reason = {200: "OK", 201: "Created", 404: "Not Found", 500: "Error", 503: "Unavailable"}
    writer.write(
        f"HTTP/1.1 {status} {reason.get(status, 'X')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )


def _apply(key: str) -> str:
    effects[key] += 1
    reference = orders.setdefault(key, f"PO-{len(orders) + 1}")
    return reference


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await _read(reader)
        if request is None:
            return
        method, target, headers, _body = request
        if method == "GET" and target == "/effects":
            _answer(writer, 200, {"effects": dict(effects), "faults": dict(faults)})
        elif method == "GET" and target.startswith("/orders/"):
            key = target.removeprefix("/orders/")
            if key in orders:
                _answer(writer, 200, {"id": orders[key]})
            else:
                _answer(writer, 404, {"error": "no such order"})
        elif method == "POST" and target == "/orders":
            key = headers.get("idempotency-key", "")
            fault = headers.get("x-fault", "")
            faults[fault or "none"] += 1
            if fault in ("reset_before",):
                writer.transport.abort()
                return
            if fault == "503":
                _answer(writer, 503, {"error": "try later"})
            else:
                reference = _apply(key)
                if fault == "timeout":
                    await asyncio.sleep(SLOW)
                    _answer(writer, 201, {"id": reference})
                elif fault == "reset":
                    writer.transport.abort()
                    return
                elif fault == "500":
                    _answer(writer, 500, {"error": "internal"})
                elif fault == "kill":
                    pid = int(headers.get("x-worker-pid", "0"))
                    if pid > 0:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    writer.transport.abort()
                    return
                else:
                    _answer(writer, 201, {"id": reference})
        else:
            _answer(writer, 404, {"error": f"no route {method} {target}"})
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(portfile: Path) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=512)
    port = server.sockets[0].getsockname()[1]
    portfile.with_suffix(".tmp").write_text(str(port))
    portfile.with_suffix(".tmp").rename(portfile)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
