"""An ERP stand-in: a small HTTP server behaving like Oracle Fusion's purchase-order endpoint.

Run it as its own process (``python -m jobfence_examples.purchase_orders.erp --port 0``
prints the address it listens on). It issues client-credentials tokens that expire, creates
purchase orders de-duplicated by ``requestId`` (as the real one would be configured to, seed
004 E6) unless that is switched off, finds orders by ``requestId`` (``GET`` on the orders path
with ``?q=requestId=…``, the finder the adapter's reconcile uses) and counts what it created.
Switches (flags at start, or ``POST /_control`` while running):

- ``deduplicate``: create at most one order per ``requestId`` (default on). Off, every
  create makes a new order, as an ERP without an idempotency key would: a repeated call is a
  double order (counted as ``duplicates``)

- ``latency_ms``: added to every order call
- ``error_rate``: share of calls answered 503 *before* creating anything
- ``ambiguous_rate``: share of calls that create the order and then answer 500
- ``timeout_rate``: share of calls that create the order and answer only after
  ``timeout_seconds`` (longer than the client waits: a timeout)
- ``functional_rate``: share of *requests* (decided by requestId, so stable across retries)
  answered 400, a functional rejection
- ``business_rate``: the same, answered 409 (a business rule)
- ``token_ttl``: seconds a token lives; an expired token gets 401

``POST /_expire_tokens`` expires every token issued so far; ``POST /_reset`` forgets
everything and takes new switches; ``GET /_stats`` returns the counters; ``GET /_orders``
the orders created.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import random
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobfence.http import tcp_listen_socket

from .adapter import ORDERS_PATH, TOKEN_PATH


@dataclass
class Switches:
    deduplicate: bool = True
    latency_ms: float = 0.0
    error_rate: float = 0.0
    ambiguous_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_seconds: float = 30.0
    functional_rate: float = 0.0
    business_rate: float = 0.0
    token_ttl: float = 3600.0
    seed: int = 4
    client_id: str = "jobfence-po"
    client_secret: str = "stand-in-secret"


@dataclass
class Counters:
    order_calls: int = 0
    orders_created: int = 0
    deduplicated: int = 0
    duplicates: int = 0  # orders created for a requestId that had one (deduplicate off)
    lookups: int = 0
    unavailable: int = 0
    ambiguous: int = 0
    timeouts: int = 0
    rejected_functional: int = 0
    rejected_business: int = 0
    unauthorized: int = 0
    tokens_issued: int = 0


@dataclass
class ErpState:
    switches: Switches
    counters: Counters = field(default_factory=Counters)
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)  # requestId → first order
    every_order: list[dict[str, Any]] = field(default_factory=list)  # duplicates too
    tokens: dict[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_number: int = 100000


def _share(seed: int, kind: str, request_id: str) -> float:
    """A stable number in [0, 1) for (kind, request): the same request always gets it."""
    digest = hashlib.sha256(f"{seed}:{kind}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def create_erp_app(switches: Switches | None = None) -> Starlette:
    state = ErpState(switches or Switches())
    state.rng.seed(state.switches.seed)

    async def token(request: Request) -> Response:
        sw = state.switches
        auth = request.headers.get("authorization", "")
        expected = base64.b64encode(f"{sw.client_id}:{sw.client_secret}".encode()).decode()
        if auth != f"Basic {expected}":
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        value = secrets.token_urlsafe(24)
        state.tokens[value] = time.monotonic() + sw.token_ttl
        state.counters.tokens_issued += 1
        return JSONResponse(
            {"access_token": value, "token_type": "Bearer", "expires_in": sw.token_ttl}
        )

    def unauthorized(request: Request) -> Response | None:
        auth = request.headers.get("authorization", "")
        expiry = state.tokens.get(auth.removeprefix("Bearer "))
        if expiry is None or expiry < time.monotonic():
            state.counters.unauthorized += 1
            return JSONResponse(
                {"title": "Unauthorized", "detail": "the access token is invalid or expired"},
                status_code=401,
            )
        return None

    async def find_orders(request: Request) -> Response:
        """``GET …/purchaseOrders?q=requestId=<id>``: the orders made for a request (Fusion's
        finder syntax), ``{"items": […], "count": n}``; every one with deduplication off."""
        refused = unauthorized(request)
        if refused is not None:
            return refused
        query = request.query_params.get("q", "")
        name, _, value = query.partition("=")
        if name != "requestId" or not value:
            return JSONResponse(
                {"title": "Bad Request", "detail": "give q=requestId=<the request id>"}, 400
            )
        state.counters.lookups += 1
        if state.switches.latency_ms > 0:
            await asyncio.sleep(state.switches.latency_ms / 1000)
        items = [o for o in state.every_order if o["requestId"] == value]
        return JSONResponse({"items": items, "count": len(items)})

    async def create_order(request: Request) -> Response:
        sw = state.switches
        counters = state.counters
        counters.order_calls += 1
        refused = unauthorized(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            request_id = str(body["requestId"])
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"title": "Bad Request", "detail": "requestId missing"}, 400)
        if sw.latency_ms > 0:
            await asyncio.sleep(sw.latency_ms / 1000)
        existing = state.orders.get(request_id) if sw.deduplicate else None
        if existing is not None:
            counters.deduplicated += 1
            return JSONResponse(existing, status_code=200)
        if _share(sw.seed, "functional", request_id) < sw.functional_rate:
            counters.rejected_functional += 1
            return JSONResponse(
                {
                    "title": "Bad Request",
                    "detail": "PO-2001: the supplier site is not valid for this business unit",
                    "o:errorCode": "PO-2001",
                },
                status_code=400,
            )
        if _share(sw.seed, "business", request_id) < sw.business_rate:
            counters.rejected_business += 1
            return JSONResponse(
                {"title": "Conflict", "detail": "PO-3007: the budget for this account is closed"},
                status_code=409,
            )
        draw = state.rng.random()
        if draw < sw.error_rate:
            counters.unavailable += 1
            return JSONResponse(
                {"title": "Service Unavailable", "detail": "try again later"}, status_code=503
            )
        async with state.lock:
            existing = state.orders.get(request_id) if sw.deduplicate else None
            if existing is None:
                state.next_number += 1
                existing = {
                    "OrderNumber": f"PO{state.next_number}",
                    "POHeaderId": state.next_number,
                    "requestId": request_id,
                    "Lines": len(body.get("lines") or []),
                }
                if request_id in state.orders:
                    counters.duplicates += 1
                state.orders.setdefault(request_id, existing)
                state.every_order.append(existing)
                counters.orders_created += 1
        draw -= sw.error_rate
        if 0 <= draw < sw.ambiguous_rate:
            counters.ambiguous += 1
            return JSONResponse(
                {"title": "Internal Server Error", "detail": "ORA-01013 after commit"},
                status_code=500,
            )
        draw -= sw.ambiguous_rate
        if 0 <= draw < sw.timeout_rate:
            counters.timeouts += 1
            await asyncio.sleep(sw.timeout_seconds)
        return JSONResponse(existing, status_code=201)

    async def expire_tokens(request: Request) -> Response:
        """Expire every token issued so far (what a rotated secret or a clock jump does)."""
        expired = len(state.tokens)
        for value in state.tokens:
            state.tokens[value] = 0.0
        return JSONResponse({"expired": expired})

    async def stats(request: Request) -> Response:
        return JSONResponse(asdict(state.counters))

    async def orders(request: Request) -> Response:
        return JSONResponse(state.orders)

    async def control(request: Request) -> Response:
        if request.method == "POST":
            changes = await request.json()
            known = {f.name: f.type for f in fields(Switches)}
            unknown = sorted(set(changes) - set(known))
            if unknown:
                return JSONResponse({"detail": f"unknown switches: {unknown}"}, 422)
            for name, value in changes.items():
                setattr(state.switches, name, value)
            if "seed" in changes:
                state.rng.seed(state.switches.seed)
        return JSONResponse(asdict(state.switches))

    async def reset(request: Request) -> Response:
        """Forget every order, counter and token; take the given switches (default ones for
        those not given). Tests reuse one stand-in process this way."""
        changes = await request.json()
        unknown = sorted(set(changes) - {f.name for f in fields(Switches)})
        if unknown:
            return JSONResponse({"detail": f"unknown switches: {unknown}"}, 422)
        state.switches = Switches(**changes)
        state.counters = Counters()
        state.orders.clear()
        state.every_order.clear()
        state.tokens.clear()
        state.rng.seed(state.switches.seed)
        return JSONResponse(asdict(state.switches))

    return Starlette(
        routes=[
            Route("/_reset", reset, methods=["POST"]),
            Route(TOKEN_PATH, token, methods=["POST"]),
            Route(ORDERS_PATH, create_order, methods=["POST"]),
            Route(ORDERS_PATH, find_orders, methods=["GET"]),
            Route("/_stats", stats, methods=["GET"]),
            Route("/_orders", orders, methods=["GET"]),
            Route("/_control", control, methods=["GET", "POST"]),
            Route("/_expire_tokens", expire_tokens, methods=["POST"]),
        ]
    )


def _flag(text: str) -> bool:
    """A switch given on the command line: true/false (also on/off, 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("true", "on", "1", "yes"):
        return True
    if value in ("false", "off", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a switch value: give true or false")


def main(argv: list[str] | None = None) -> None:
    """Serve the stand-in; print ``ERP stand-in listening on http://HOST:PORT`` once ready."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m jobfence_examples.purchase_orders.erp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    for item in fields(Switches):
        default = item.default
        kind = _flag if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{item.name.replace('_', '-')}", type=kind, default=default)
    args = parser.parse_args(argv)
    switches = Switches(**{f.name: getattr(args, f.name) for f in fields(Switches)})
    sock = tcp_listen_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        create_erp_app(switches), log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.01)
        print(f"ERP stand-in listening on http://{host}:{port}", flush=True)
        await task

    asyncio.run(serve())


class ErpProcess:
    """The stand-in as a child process (what tests and the demo start)."""

    def __init__(self, switches: Switches | None = None) -> None:
        self.switches = switches or Switches()
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout: float = 20.0) -> str:
        args = [sys.executable, "-m", "jobfence_examples.purchase_orders.erp", "--port", "0"]
        for item in fields(Switches):
            args += [f"--{item.name.replace('_', '-')}", str(getattr(self.switches, item.name))]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        # the first line is the address; wait for it with a deadline
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"the ERP stand-in did not start (said {line.strip()!r})")
        self.url = line.strip().rsplit(" ", 1)[-1]
        return self.url

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def reset(self, switches: Switches | None = None) -> None:
        """Forget orders, counters and tokens and take ``switches`` (a running process)."""
        import httpx

        self.switches = switches or Switches()
        response = httpx.post(f"{self.url}/_reset", json=asdict(self.switches), timeout=10)
        response.raise_for_status()

    def __enter__(self) -> ErpProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_erp(switches: Switches | None = None) -> Iterator[ErpProcess]:
    process = ErpProcess(switches)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def stats_of(url: str) -> dict[str, Any]:
    """The stand-in's counters (a blocking helper for scripts)."""
    import httpx

    response = httpx.get(f"{url}/_stats", timeout=10)
    response.raise_for_status()
    data: dict[str, Any] = json.loads(response.text)
    return data


if __name__ == "__main__":  # pragma: no cover
    main()
