"""Measuring tools for bench/run.py: databases, subprocesses, CPU/RSS sampling, statistics.

Runs in bench/.venv-peers (psutil, psycopg, redis are there). Nothing here imports jobfence:
every system under test runs in its own subprocess, in its own virtualenv.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SYSTEMS = BENCH / "systems"
ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("JOBFENCE_BENCH_REDIS", "redis://127.0.0.1:6379/13")


class BenchError(Exception):
    """A run that did not do what it must (wrong effect count, a crashed worker, a timeout)."""


def db_url(name: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + name


@contextlib.contextmanager
def fresh_database(prefix: str = "jf_bench") -> Iterator[str]:
    """A new empty database on the benchmark server, dropped afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield db_url(name)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def python_for(system: str) -> str:
    """The interpreter a system runs under: jobfence in the project's virtualenv, peers in
    bench/.venv-peers (never the other way round)."""
    if system == "jobfence":
        return os.environ.get("BENCH_PROJECT_PYTHON", "python")
    return str(BENCH / ".venv-peers" / "bin" / "python")


def command(system: str, *args: str) -> list[str]:
    return [python_for(system), str(SYSTEMS / f"{system}_sys.py"), *args]


def run_json(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 900
) -> dict[str, Any]:
    """Run a command to its end; return the last JSON line it printed (fail loudly)."""
    proc = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:3])}… exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"{' '.join(cmd[:3])}… printed no result:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def scalar(url: str, sql: str, params: Sequence[Any] = ()) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of a process, its live descendants and its reaped children."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        t = proc.cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
    return total


def tree_rss(proc: psutil.Process) -> float:
    """Resident memory (MB) of a process and its descendants."""
    total = 0
    with contextlib.suppress(psutil.Error):
        total += proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    return total / 1e6


class ServerCPU:
    """CPU seconds spent by the PostgreSQL backends serving one database (the server side of
    a run), sampled from /proc: each backend's last seen total, minus what it had at the
    start of the measured window."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.dbname = self.conn.info.dbname
        self.last: dict[int, float] = {}
        self.base: dict[int, float] = {}

    def sample(self) -> None:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.dbname,),
        ).fetchall()
        for (pid,) in rows:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                self.last[pid] = t.user + t.system

    def start(self) -> None:
        self.sample()
        self.base = dict(self.last)

    def spent(self) -> float:
        return sum(v - self.base.get(pid, 0.0) for pid, v in self.last.items())

    def close(self) -> None:
        self.conn.close()


@dataclass
class Drain:
    """One measured drain: rate over the window from the first observed progress to the
    last job, CPU of the worker process tree and of the server backends in that window."""

    jobs_per_s: float
    cpu_per_1k: float
    server_cpu_per_1k: float
    rss_start_mb: float
    rss_max_mb: float
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    """A worker subprocess, stopped with SIGTERM (then SIGKILL) on exit."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.cmd = list(cmd)
        self.log = open(os.devnull, "w")  # noqa: SIM115
        self.stderr_path = Path(f"/tmp/jf-bench-{uuid.uuid4().hex[:8]}.stderr")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=open(self.stderr_path, "w"),  # noqa: SIM115
            text=True,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            start_new_session=True,
        )
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 60) -> dict[str, Any]:
        """Wait for the ``{"ready": …}`` line; return it."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise BenchError(f"worker exited before it was ready:\n{self.stderr()}")
            if '"ready"' in line:
                ready: dict[str, Any] = json.loads(line)
                return ready
        raise BenchError("worker not ready in time")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"worker died (exit {self.proc.returncode}):\n{self.stderr()}")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.stderr_path.unlink(missing_ok=True)
        self.log.close()


def drain(
    worker: Worker,
    url: str,
    total: int,
    progress: Callable[[], int],
    *,
    timeout: float,
    poll: float = 0.02,
) -> Drain:
    """Watch ``worker`` work off ``total`` jobs: ``progress()`` says how many are done.
    ``extra["samples"]``: (seconds since the first progress, jobs done, worker RSS MB) every
    0.25 s, for the shape of the run (bench/growth.py: RSS flatness, rate over a long run)."""
    server = ServerCPU(url)
    try:
        deadline = time.monotonic() + timeout
        rss_max = 0.0
        first: tuple[float, int, float] | None = None
        next_sample = 0.0
        samples: list[tuple[float, int, float]] = []
        while True:
            worker.check_alive()
            done = progress()
            now = time.perf_counter()
            if first is None and done > 0:
                server.start()
                first = (now, done, tree_cpu(worker.ps))
                rss_start = tree_rss(worker.ps)
                rss_max = max(rss_max, rss_start)
                samples.append((0.0, done, rss_start))
                next_sample = now + 0.25
            if first is not None and (done >= total or now >= next_sample):
                server.sample()
                rss = tree_rss(worker.ps)
                rss_max = max(rss_max, rss)
                samples.append((now - first[0], done, rss))
                next_sample = now + 0.25
            if done >= total:
                cpu = tree_cpu(worker.ps)
                break
            if time.monotonic() > deadline:
                raise BenchError(f"timed out with {done}/{total} jobs done:\n{worker.stderr()}")
            time.sleep(poll)
        assert first is not None
        t0, done0, cpu0 = first
        jobs = max(1, total - done0)
        elapsed = max(now - t0, 1e-6)
        return Drain(
            jobs_per_s=jobs / elapsed,
            cpu_per_1k=(cpu - cpu0) / jobs * 1000,
            server_cpu_per_1k=server.spent() / jobs * 1000,
            rss_start_mb=rss_start,
            rss_max_mb=rss_max,
            seconds=elapsed,
            extra={"samples": samples},
        )
    finally:
        server.close()


def effects_progress(url: str, total: int) -> Callable[[], int]:
    """Progress of a durable run: the highest effect id (cheap, indexed), confirmed by a
    count once it reaches the end (a higher id can commit before a lower one)."""
    conn = psycopg.connect(url, autocommit=True)

    def progress() -> int:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM bench_effects").fetchone()
        top = int(row[0]) if row else 0
        if top < total:
            return top
        row = conn.execute("SELECT count(*) FROM bench_effects").fetchone()
        return int(row[0]) if row else 0

    progress.conn = conn  # type: ignore[attr-defined]
    return progress


def sql_progress(url: str, remaining_sql: str, total: int) -> Callable[[], int]:
    """Progress as ``total`` minus what a query says is left."""
    conn = psycopg.connect(url, autocommit=True)

    def progress() -> int:
        row = conn.execute(remaining_sql).fetchone()  # type: ignore[arg-type]
        return total - int(row[0] if row else 0)

    progress.conn = conn  # type: ignore[attr-defined]
    return progress


def close_progress(progress: Callable[[], int]) -> None:
    conn = getattr(progress, "conn", None)
    if conn is not None:
        conn.close()


# -- statistics -------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return "(1 run)"
    return f"{min(values):,.{digits}f}–{max(values):,.{digits}f}"
