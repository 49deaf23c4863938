"""The worker's and the relay's /livez and /readyz (jobfence.runtime.health), on real subprocesses:
readiness follows the database (reached through a TCP proxy the test cuts and restores) and
SIGTERM's draining; liveness catches an event loop that a handler blocks."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from jobfence import App

from .helpers import REPO, start_worker, stop_process, wait_until

APP = "tests.apps.shutdown_app:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proxy:
    """A TCP forwarder to PostgreSQL that the test can cut (listener and every connection
    closed: the database is unreachable) and restore on the same port."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.open()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(32)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if listener is not self._listener:  # cut meanwhile: an accept() already waiting
                client.close()  # on the old socket outlives close(), so refuse here
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._conns += [client, server]
            if listener is not self._listener:  # cut while connecting
                client.close()
                server.close()
                return
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() waiting on it
            listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._conns.clear()


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError as exc:  # not listening yet
        return 0, {"error": str(exc)}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def start_relay(url: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """``jobfence relay`` as a real subprocess, serving its probes on ``port``."""
    args = ["relay", "--database-url", url, "--metrics-port", str(port)]
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "jobfence.cli", *args, "--liveness-timeout", "2s"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def expect(port: int, path: str, status: int, detail: str = "", timeout: float = 30) -> None:
    def check() -> bool:
        code, body = probe(port, path)
        return code == status and detail in json.dumps(body)

    wait_until(check, timeout=timeout, what=f"{path} {status} {detail!r}: {probe(port, path)}")


async def _enqueue(url: str, job_id: str, payload: dict[str, Any]) -> None:
    async with App(url) as app:
        await app.enqueue("work", payload, job_id=job_id)


async def test_worker_probes_follow_the_database_a_stuck_loop_and_sigterm(
    pg_ledger: str, tmp_path: Path
) -> None:
    proxy = Proxy()
    port = free_port()
    via_proxy = pg_ledger.replace(":5432/", f":{proxy.port}/")
    env = {"JF_DB": via_proxy, "JF_MARKS": str(tmp_path), "JF_LEASE": "30"}
    args = ("--metrics-port", str(port), "--liveness-timeout", "2s", "--queues", "work")
    proc = start_worker(APP, env, tmp_path / "w.log", *args)
    try:
        expect(port, "/readyz", 200, '"component": "worker"')
        expect(port, "/livez", 200)
        text = scrape(port)
        assert 'jobfence_heartbeat_timestamp_seconds{component="worker"}' in text
        assert "jobfence_workers 1.0" in text

        # the database goes away: not ready (nothing to restart), still alive; and back
        proxy.cut()
        expect(port, "/readyz", 503, "database unreachable")
        assert probe(port, "/livez")[0] == 200
        proxy.open()
        expect(port, "/readyz", 200, timeout=60)

        # a handler blocks the event loop: not alive while it lasts, alive again after
        await _enqueue(pg_ledger, "block-1", {"mode": "block-loop", "seconds": 8})
        expect(port, "/livez", 503, "event loop stuck")
        wait_until(lambda: (tmp_path / "block-1.woke.1").exists(), what="handler done")
        expect(port, "/livez", 200)

        # SIGTERM with a job in flight: draining, so not ready; still alive
        await _enqueue(pg_ledger, "slow-1", {"mode": "sleep", "seconds": 60})
        wait_until(lambda: (tmp_path / "slow-1.started.1").exists(), what="slow job running")
        wait_until(lambda: "jobfence_worker_inflight_jobs 1.0" in scrape(port), what="in flight")
        proc.send_signal(signal.SIGTERM)
        expect(port, "/readyz", 503, "draining")
        assert probe(port, "/livez")[0] == 200
    finally:
        proc.kill()
        proc.wait()
        proxy.cut()


async def test_relay_serves_the_probes_and_its_metrics(pg_database: str, tmp_path: Path) -> None:
    port = free_port()
    proc = start_relay(pg_database, port, tmp_path / "relay.log")
    try:
        expect(port, "/readyz", 200, '"component": "relay"')
        expect(port, "/livez", 200)
        text = scrape(port)
        assert 'jobfence_heartbeat_timestamp_seconds{component="relay"}' in text
        assert "jobfence_relays 1.0" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop_process(proc)
