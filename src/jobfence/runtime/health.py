"""Health endpoints of a worker's and a relay's metrics port (docs/deployment.md):

- ``/livez``: 200 while every running worker's and relay's event loop has ticked within the
  liveness timeout; 503 when one is stuck (a handler that blocks the loop, a deadlock): a
  probe that restarts the container is the cure.
- ``/readyz``: 200 while every worker and relay in the process has started, is not draining
  (SIGTERM) and reached its database within the last few seconds; 503 otherwise (nothing to
  restart: the process is shutting down, starting, or the database is away).
- ``/metrics``: the Prometheus series, as before.

The server runs in a thread of its own, so it answers while the event loop is blocked: that
is how ``/livez`` can say the loop is stuck. The checks are written by the event loop and
read by the server's threads; each is a plain attribute (a float, a bool, a str), which the
GIL reads and writes whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from ..metrics import HEARTBEAT, READY

if TYPE_CHECKING:
    from ..db import Database

log = logging.getLogger("jobfence.health")

#: the event loop ticks this often (seconds); the liveness timeout must be well above it
TICK = 1.0
#: the database is pinged this often (seconds), each ping given PING_TIMEOUT to answer
PING_INTERVAL = 5.0
PING_TIMEOUT = 3.0
#: readiness needs a successful ping at most this many seconds old
DB_STALE_AFTER = 3 * PING_INTERVAL
DEFAULT_LIVENESS_TIMEOUT = 30.0


class Health:
    """The state one worker or relay reports to the probes (``component``: worker, relay)."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.tick = time.monotonic()
        self.started = False
        self.draining = False
        self.db_ok_at: float | None = None
        self.db_error: str | None = "not checked yet"

    def live(self, timeout: float, now: float | None = None) -> tuple[bool, str]:
        age = (now or time.monotonic()) - self.tick
        if age > timeout:
            return False, f"event loop stuck: no tick for {age:.1f}s (limit {timeout:g}s)"
        return True, f"event loop ticked {age:.1f}s ago"

    def ready(self, now: float | None = None) -> tuple[bool, str]:
        now = now or time.monotonic()
        if self.draining:
            return False, "draining: shutting down after SIGTERM"
        if not self.started:
            return False, "starting"
        if self.db_error is not None:
            return False, f"database unreachable: {self.db_error}"
        if self.db_ok_at is None or now - self.db_ok_at > DB_STALE_AFTER:
            return False, "database not reached recently"
        return True, "ready"

    async def watch(self, db: Database, on_tick: Callable[[], None] | None = None) -> None:
        """Tick every second (and call ``on_tick``) and ping ``db`` every few, until
        cancelled."""
        ping = asyncio.create_task(self._ping(db), name=f"jobfence-{self.component}-ping")
        gauge, ready = HEARTBEAT.labels(self.component), READY.labels(self.component)
        try:
            while True:
                self.tick = time.monotonic()
                gauge.set_to_current_time()
                ready.set(1 if self.ready()[0] else 0)
                if on_tick is not None:
                    on_tick()
                await asyncio.sleep(TICK)
        finally:
            ping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ping
            ready.set(0)

    async def _ping(self, db: Database) -> None:
        while True:
            try:
                async with asyncio.timeout(PING_TIMEOUT):
                    await db.run("db_now")
            except Exception as exc:
                if self.db_error is None:
                    log.warning(
                        "database unreachable: not ready",
                        extra={"component": self.component, "error": repr(exc)},
                    )
                self.db_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                self.db_ok_at, self.db_error = time.monotonic(), None
            await asyncio.sleep(PING_INTERVAL)


_lock = threading.Lock()
_checks: list[Health] = []


def register(health: Health) -> None:
    with _lock:
        _checks.append(health)


def unregister(health: Health) -> None:
    with _lock:
        if health in _checks:
            _checks.remove(health)


def _report(results: Iterable[tuple[str, bool, str]]) -> tuple[bool, dict[str, Any]]:
    found = list(results)
    ok = bool(found) and all(good for _, good, _ in found)
    return ok, {
        "status": "ok" if ok else "fail",
        "checks": [{"component": c, "ok": good, "detail": d} for c, good, d in found],
    }


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would flood stderr


Start = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], Start], Any]


def app(liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT) -> WSGIApp:
    """The WSGI app behind the port: /livez, /readyz, anything else /metrics."""
    metrics = make_wsgi_app()

    def handle(environ: dict[str, Any], start: Start) -> Any:
        path = environ.get("PATH_INFO", "")
        if path not in ("/livez", "/readyz"):
            return metrics(environ, start)
        with _lock:
            checks = list(_checks)
        now = time.monotonic()
        if path == "/livez":  # no worker or relay running (yet, or any more) is still alive
            ok, body = _report((h.component, *h.live(liveness_timeout, now)) for h in checks)
            if not checks:
                ok, body = True, {"status": "ok", "checks": []}
        else:
            ok, body = _report((h.component, *h.ready(now)) for h in checks)
        data = json.dumps(body).encode()
        start(
            "200 OK" if ok else "503 Service Unavailable",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return handle


def serve(
    port: int, host: str = "127.0.0.1", *, liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
) -> WSGIServer:
    """Serve /metrics, /livez and /readyz on ``host:port`` in a daemon thread. Raises
    :class:`OSError` when the port cannot be bound, ``ValueError`` for a liveness timeout
    that the loop's tick could not meet."""
    if liveness_timeout < 2 * TICK:
        raise ValueError(f"the liveness timeout must be at least {2 * TICK:g}s")
    server = make_server(host, port, app(liveness_timeout), _Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="jobfence-health", daemon=True)
    thread.start()
    return server
