"""The servers of the HTTP ingestion workload, each under uvicorn in its own process (runs in
the project's virtualenv).

    python bench/systems/http_server.py po URL          # the purchase-order API
    python bench/systems/http_server.py middleware URL  # IdempotencyMiddleware + a trivial app
    python bench/systems/http_server.py middleware-commit URL  # the same, claim_at_commit=True
    python bench/systems/http_server.py bare            # a bare ASGI app (the physical floor)
    python bench/systems/http_server.py hand URL        # the keyed POST written by hand

``BENCH_HTTP`` picks uvicorn's HTTP/1.1 parser: ``h11`` (the default here, whatever is
installed) or ``httptools`` (``uvicorn[standard]``).

Each prints ``{"ready": true, "port": …, …}`` and serves on 127.0.0.1 until SIGTERM. With
``BENCH_HTTP_PROCESSES=N`` the process forks N-1 more after its setup (migration, partner)
and all serve the same listening socket, each with its own pool (as ``uvicorn --workers N``).

- ``po``: migrates, creates one partner (its token is printed); only the API runs (no worker,
  no relay): the workload measures the POST — idempotency key claimed, request row and outbox
  event written, the response stored for replays. The ERP is never called on this path.
- ``middleware``: :class:`jobfence.http.IdempotencyMiddleware` on its own pool in front of an
  ASGI handler that answers 202 at once: the middleware's cost per request.
- ``middleware-commit``: the same with ``claim_at_commit=True`` (the trivial app has no
  effect outside the transaction, so it may run before its key is claimed): a look-up, then
  the claim and the stored response with COMMIT, both shared with concurrent requests.
- ``hand``: bench/systems/http_handwritten.py, the same work as ``po``'s POST written by
  hand (FastAPI + pydantic + a psycopg pool of 20, six round trips and a commit): the
  baseline the keyed POST is held against (issue 27).
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


#: uvicorn's HTTP parser (uvicorn's own default, "auto", takes httptools when installed)
HTTP = os.environ.get("BENCH_HTTP", "h11")
if HTTP not in ("h11", "httptools"):
    raise SystemExit(f"BENCH_HTTP={HTTP!r}: h11 or httptools")

#: the listening socket, bound before any fork (every process serves it)
SOCK = tcp_listen_socket()
#: this process's index among BENCH_HTTP_PROCESSES (0: the first, which says it is ready)
INDEX = 0


async def serve(app: Any, pool: Any = None, **ready: Any) -> None:
    if STATS:
        global _pool
        _pool = pool
        loop = asyncio.get_running_loop()
        loop.set_task_factory(_count_tasks)  # type: ignore[arg-type]
        loop.add_signal_handler(signal.SIGUSR1, _stats)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="critical", access_log=False, lifespan="on", http=HTTP)
    )
    task = asyncio.create_task(server.serve(sockets=[SOCK]))
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.05)
    if INDEX == 0:
        print(json.dumps({"ready": True, "port": SOCK.getsockname()[1], **ready}), flush=True)
    await task


async def setup(mode: str, url: str | None) -> dict[str, Any]:
    """What runs once before any fork: migrations, the partner (its token)."""
    if mode in ("middleware", "middleware-commit"):
        assert url
        from jobfence import App

        await App(url).migrate()
    elif mode in ("po", "hand"):
        assert url
        from jobfence_examples.purchase_orders.adapter import ErpSettings
        from jobfence_examples.purchase_orders.service import PurchaseOrderService, migrate

        await migrate(url)
        service = PurchaseOrderService(url, erp=ErpSettings("http://127.0.0.1:9"))
        await service.open(pool_size=2)
        try:
            return {"token": await service.create_partner("bench", "Bench partner")}
        finally:
            await service.close()
    elif mode != "bare":
        raise SystemExit(f"unknown mode {mode!r}: po, hand, middleware(-commit) or bare")
    return {}


async def main(mode: str, url: str | None, ready: dict[str, Any]) -> None:
    if mode == "bare":
        await serve(bare)
    elif mode in ("middleware", "middleware-commit"):
        assert url
        from jobfence import App

        app = App(url)
        await app.open(pool_size=20)
        try:
            middleware = IdempotencyMiddleware(
                bare, database=app.db, claim_at_commit=mode == "middleware-commit"
            )
            await serve(middleware, getattr(app.db, "pool", None))
        finally:
            await app.close()
    elif mode == "po":
        assert url
        from jobfence_examples.purchase_orders.adapter import ErpSettings
        from jobfence_examples.purchase_orders.api import create_api
        from jobfence_examples.purchase_orders.service import PurchaseOrderService

        service = PurchaseOrderService(url, erp=ErpSettings("http://127.0.0.1:9"))
        await service.open(pool_size=20)
        try:
            api = create_api(service, manage_service=False)
            await serve(api, getattr(service.db, "pool", None), **ready)
        finally:
            await service.close()
    elif mode == "hand":
        assert url
        from http_handwritten import create_app
        from psycopg_pool import AsyncConnectionPool

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url, min_size=20, max_size=20, open=False
        )
        await pool.open(wait=True)
        try:
            await serve(create_app(pool), pool, **ready)
        finally:
            await pool.close()


if __name__ == "__main__":
    mode, url = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    ready = asyncio.run(setup(mode, url))
    for index in range(1, int(os.environ.get("BENCH_HTTP_PROCESSES", "1"))):
        if os.fork() == 0:
            INDEX = index
            break
    asyncio.run(main(mode, url, ready))
