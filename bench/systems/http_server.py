"""The servers of the HTTP ingestion workload, each under uvicorn in its own process (runs in
the project's virtualenv).

    python bench/systems/http_server.py po URL          # the purchase-order API
    python bench/systems/http_server.py middleware URL  # IdempotencyMiddleware + a trivial app
    python bench/systems/http_server.py bare            # a bare ASGI app (the physical floor)

Each prints ``{"ready": true, "port": …, …}`` and serves on 127.0.0.1 until SIGTERM.

- ``po``: migrates, creates one partner (its token is printed); only the API runs (no worker,
  no relay): the workload measures the POST — idempotency key claimed, request row and outbox
  event written, the response stored for replays. The ERP is never called on this path.
- ``middleware``: :class:`jobfence.http.IdempotencyMiddleware` on its own pool in front of an
  ASGI handler that answers 202 at once: the middleware's cost per request.
- ``bare``: ``GET /healthz`` of a raw ASGI callable — what uvicorn itself costs here, the
  floor every other figure is held against.

The socket comes from :func:`jobfence.http.tcp_listen_socket`: a ``socket.socket()``
(protocol 0) gets no TCP_NODELAY from asyncio, and every keep-alive answer then waits ~40 ms
for the client's delayed ACK (what this file did until issue 16).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import uvicorn

from jobfence.http import IdempotencyMiddleware, tcp_listen_socket


async def bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``{"status":"ok"}`` for any request: no framework, no database."""
    if scope["type"] != "http":
        return
    if scope["method"] == "POST":  # drain the body, as any handler would
        while (await receive()).get("more_body"):
            pass
    await send(
        {
            "type": "http.response.start",
            "status": 202 if scope["method"] == "POST" else 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"status":"ok"}'})


#: BENCH_HTTP_STATS=1 (bench/http_profile.py): count the asyncio tasks created and print them,
#: with the pool's statistics, as one JSON line on SIGUSR1
STATS = os.environ.get("BENCH_HTTP_STATS") == "1"
_tasks = 0
_pool: Any = None


def _count_tasks(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
    global _tasks
    _tasks += 1
    return asyncio.Task(coro, loop=loop, **kw)


def _stats() -> None:
    stats = _pool.get_stats() if _pool is not None else {}
    print(json.dumps({"stats": True, "tasks": _tasks, "pool": stats}), flush=True)


async def serve(app: Any, pool: Any = None, **ready: Any) -> None:
    if STATS:
        global _pool
        _pool = pool
        loop = asyncio.get_running_loop()
        loop.set_task_factory(_count_tasks)  # type: ignore[arg-type]
        loop.add_signal_handler(signal.SIGUSR1, _stats)
    sock = tcp_listen_socket()
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.05)
    print(json.dumps({"ready": True, "port": sock.getsockname()[1], **ready}), flush=True)
    await task


async def main(mode: str, url: str | None) -> None:
    if mode == "bare":
        await serve(bare)
    elif mode == "middleware":
        assert url
        from jobfence import App

        app = App(url)
        await app.migrate()
        await app.open(pool_size=20)
        try:
            await serve(IdempotencyMiddleware(bare, database=app.db), getattr(app.db, "pool", None))
        finally:
            await app.close()
    elif mode == "po":
        assert url
        from jobfence_examples.purchase_orders.adapter import ErpSettings
        from jobfence_examples.purchase_orders.api import create_api
        from jobfence_examples.purchase_orders.service import PurchaseOrderService, migrate

        await migrate(url)
        service = PurchaseOrderService(url, erp=ErpSettings("http://127.0.0.1:9"))
        await service.open(pool_size=20)
        token = await service.create_partner("bench", "Bench partner")
        try:
            api = create_api(service, manage_service=False)
            await serve(api, getattr(service.db, "pool", None), token=token)
        finally:
            await service.close()
    else:
        raise SystemExit(f"unknown mode {mode!r}: po, middleware or bare")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
