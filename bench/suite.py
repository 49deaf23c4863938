"""The workloads of the benchmark suite, and the one table (see bench/run.py for usage)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis
from measure import (
    ADMIN,
    BENCH,
    REDIS,
    ROOT,
    BenchError,
    Drain,
    Worker,
    close_progress,
    command,
    drain,
    effects_progress,
    fresh_database,
    median,
    python_for,
    run_json,
    scalar,
    spread,
    sql_progress,
)
from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=max(Console().width, 190))

# -- systems and their settings -----------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One system with one set of settings."""

    system: str  # jobfence | procrastinate | pgqueuer | celery | pgbench
    label: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return self.label


JF_CONCURRENCY = "32"

JF_BATCH = "50"  # group commit: up to 50 jobs per transaction, each in its own savepoint
JOBFENCE = Variant(
    "jobfence", "jobfence (fence)", ("--concurrency", JF_CONCURRENCY, "--batch-size", JF_BATCH)
)
JOBFENCE_NOFENCE = Variant(
    "jobfence",
    "jobfence (no fence)",
    ("--concurrency", JF_CONCURRENCY, "--batch-size", JF_BATCH, "--no-fence"),
)
JOBFENCE_SINGLE = Variant(
    "jobfence",
    "jobfence (fence, one job per tx)",
    ("--concurrency", JF_CONCURRENCY, "--batch-size", "1"),
)
#: what a user gets with no tuning flag at all (concurrency 10, group commit of up to 50)
JOBFENCE_DEFAULT = Variant("jobfence", "jobfence (defaults: no flags)", ())
JOBFENCE_DEFAULT_NOFENCE = Variant("jobfence", "jobfence (defaults, no fence)", ("--no-fence",))
PROCRASTINATE = Variant("procrastinate", "Procrastinate (c=32)", ("--concurrency", "32"))
PGQUEUER = [
    Variant("pgqueuer", f"PGQueuer (batch {b})", ("--batch-size", str(b), "--managers", "2"))
    for b in (10, 100, 200)
]
CELERY = [
    Variant(
        "celery",
        f"Celery/Redis (prefork 2, prefetch {p})",
        ("--concurrency", "2"),
        (("BENCH_PREFETCH", str(p)),),
    )
    for p in (4, 32)
]
PGBENCH = Variant("pgbench", "pgbench, same transaction (c=8)", ("8",))

#: peers too slow to drain 50 000 jobs in a reasonable time here: they drain --slow-jobs
SLOW = {"procrastinate", "celery"}


def pick(results: Results, workload: str, group: list[Variant]) -> Variant:
    """The variant of ``group`` with the best median so far."""
    measured = [(results.get(workload, v.label), v) for v in group]
    scored = [(r.median, v) for r, v in measured if r is not None and r.values]
    return max(scored, key=lambda x: x[0])[1] if scored else group[0]


REMAINING = {
    "jobfence": "SELECT count(*) FROM core.jobs",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
}


# -- results ---------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    label: str
    unit: str
    values: list[float]
    cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)
    baseline: str | None = None  # the label of another row of the same workload
    higher_is_better: bool = True
    note: str = ""

    @property
    def median(self) -> float:
        return median(self.values)


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}
        self.profile = ""

    def row(self, workload: str, label: str, unit: str, **kw: Any) -> Row:
        key = (workload, label)
        if key not in self.rows:
            self.rows[key] = Row(workload, label, unit, [], **kw)
        return self.rows[key]

    def add_drain(self, workload: str, label: str, d: Drain, **kw: Any) -> None:
        r = self.row(workload, label, "jobs/s", **kw)
        r.values.append(d.jobs_per_s)
        r.cpu.append(d.cpu_per_1k)
        r.server_cpu.append(d.server_cpu_per_1k)
        r.rss.append((d.rss_start_mb, d.rss_max_mb))

    def load(self, path: Path) -> None:
        for data in json.loads(path.read_text())["rows"]:
            data["rss"] = [tuple(x) for x in data["rss"]]
            row = Row(**data)
            self.rows[(row.workload, row.label)] = row

    def get(self, workload: str, label: str) -> Row | None:
        return self.rows.get((workload, label))

    def best(self, workload: str, prefix: str) -> Row | None:
        rows = [
            r for (w, label), r in self.rows.items() if w == workload and label.startswith(prefix)
        ]
        return max(rows, key=lambda r: r.median) if rows else None


# -- helpers ---------------------------------------------------------------------------------


def execute(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def celery_env(v: Variant, queue: str, url: str) -> dict[str, str]:
    return {**dict(v.env), "BENCH_QUEUE": queue, "BENCH_REDIS": REDIS, "BENCH_DATABASE_URL": url}


def celery_remaining(queue: str, total: int) -> Callable[[], int]:
    r = redis.Redis.from_url(REDIS)

    def progress() -> int:
        pipe = r.pipeline()
        pipe.llen(queue)
        pipe.hlen("unacked")
        waiting, unacked = pipe.execute()
        return total - int(waiting) - int(unacked)

    progress.conn = r  # type: ignore[attr-defined]
    return progress


def celery_cleanup(queue: str) -> None:
    r = redis.Redis.from_url(REDIS)
    keys = [queue, "unacked", "unacked_index", "unacked_mutex", *r.keys("_kombu.binding*")]
    r.delete(*keys)
    r.close()


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- workloads -------------------------------------------------------------------------------


def throughput(v: Variant, mode: str, n: int, *, dup: float = 0.0) -> Drain:
    """Enqueue ``n`` jobs with the worker stopped, start it, time the drain, verify."""
    if v.system == "pgbench":
        return pgbench(v, n)
    with fresh_database() as url:
        queue = f"bench_{uuid.uuid4().hex[:8]}"
        env = celery_env(v, queue, url) if v.system == "celery" else {}
        run_json(command(v.system, "setup", url), env=env)
        extra = ["--dup", str(dup)] if dup else []
        run_json(command(v.system, "enqueue", url, str(n), "--mode", mode, *extra), env=env)
        if v.system != "celery":
            execute(url, "VACUUM ANALYZE")
        unique = round(n * (1 - dup)) if dup else n
        if v.system == "celery":
            remaining = celery_remaining(queue, n)
        else:
            remaining = sql_progress(url, REMAINING[v.system], n)
        if remaining() != 0:
            raise BenchError(f"{v.label}: {n - remaining()} jobs missing after enqueue")
        # durable runs count effects; no-op runs and duplicate storms count the queue down
        progress = effects_progress(url, n) if mode == "durable" and not dup else remaining
        worker = Worker(command(v.system, "worker", url, "--mode", mode, *v.args), env=env)
        try:
            result = drain(worker, url, n, progress, timeout=max(120.0, n / 100))
            wait_for(lambda: remaining() == n, 30, f"{v.label}: an empty queue")
            if mode == "durable":
                count, distinct = _effects(url)
                if (count, distinct) != (unique, unique):
                    raise BenchError(
                        f"{v.label}: {count} effects ({distinct} distinct), expected {unique}"
                    )
            return result
        finally:
            worker.stop()
            close_progress(progress)
            close_progress(remaining)
            if v.system == "celery":
                celery_cleanup(queue)


def drain_together(variants: list[Variant], mode: str, n: int) -> list[Drain]:
    """Drain ``n`` jobs with each of ``variants`` (jobfence workers) *at the same time*, each
    on its own fresh database: whatever else loads the machine then loads every variant
    alike, and their CPU per job is comparable within the run. The workers start in the
    order given; each result is verified as in :func:`throughput`."""
    with contextlib.ExitStack() as stack:
        setups = []
        for v in variants:
            url = stack.enter_context(fresh_database())
            run_json(command(v.system, "setup", url))
            run_json(command(v.system, "enqueue", url, str(n), "--mode", mode))
            execute(url, "VACUUM ANALYZE")
            progress = effects_progress(url, n) if mode == "durable" else None
            remaining = sql_progress(url, REMAINING[v.system], n)
            stack.callback(close_progress, remaining)
            if progress is not None:
                stack.callback(close_progress, progress)
            setups.append((v, url, progress or remaining, remaining))
        workers = []
        for v, url, _, _ in setups:
            worker = Worker(command(v.system, "worker", url, "--mode", mode, *v.args))
            stack.callback(worker.stop)
            workers.append(worker)
        with ThreadPoolExecutor(len(setups)) as pool:
            futures = [
                pool.submit(drain, worker, url, n, progress, timeout=max(120.0, n / 100))
                for worker, (_, url, progress, _) in zip(workers, setups, strict=True)
            ]
            out = [f.result() for f in futures]
        for v, url, _, remaining in setups:
            wait_for(lambda r=remaining: r() == n, 30, f"{v.label}: an empty queue")  # type: ignore[misc]
            if mode == "durable" and _effects(url) != (n, n):
                raise BenchError(f"{v.label}: {_effects(url)} effects (distinct), expected {n}")
        return out


def _effects(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM bench_effects").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def pgbench(v: Variant, n: int) -> Drain:
    """The physical reference: pgbench running jobfence's per-job statements (one job per
    transaction) over ``n`` queued jobs; server CPU from the backends it uses."""
    from measure import ServerCPU, tree_cpu

    clients = int(v.args[0])
    per_client = n // clients
    with fresh_database() as url:
        run_json(command("jobfence", "setup", url))
        run_json(command("jobfence", "enqueue", url, str(n)))
        execute(url, "VACUUM ANALYZE")
        name = url.rsplit("/", 1)[1]
        cmd = [
            "pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", "2",
            "-t", str(per_client), "-f", str(BENCH / "pgbench" / "durable.sql"),
            "-h", "127.0.0.1", "-U", "postgres", name,
        ]  # fmt: skip
        server = ServerCPU(url)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ps = psutil.Process(proc.pid)
        server.start()
        cpu = 0.0
        while proc.poll() is None:
            server.sample()
            cpu = max(cpu, tree_cpu(ps))
            time.sleep(0.1)
        out, err = proc.communicate()
        server.close()
        if proc.returncode != 0:
            raise BenchError(f"pgbench failed:\n{err[-2000:]}\n{out[-2000:]}")
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        if not match:
            raise BenchError(f"no tps in pgbench's output:\n{out}")
        total = per_client * clients
        count, distinct = _effects(url)
        if (count, distinct) != (total, total):
            raise BenchError(f"pgbench: {count} effects ({distinct} distinct), expected {total}")
        return Drain(
            jobs_per_s=float(match.group(1)),
            cpu_per_1k=cpu / total * 1000,
            server_cpu_per_1k=server.spent() / total * 1000,
            rss_start_mb=0.0,
            rss_max_mb=0.0,
            seconds=total / float(match.group(1)),
        )


def latency(v: Variant, rate: float, seconds: float) -> dict[str, float]:
    """A worker waits; a producer enqueues one job at a time at ``rate`` for ``seconds``;
    latency = the effect row's clock_timestamp() minus the wall-clock time the producer
    called enqueue (both on this machine)."""
    with fresh_database() as url:
        queue = f"bench_{uuid.uuid4().hex[:8]}"
        env = celery_env(v, queue, url) if v.system == "celery" else {}
        run_json(command(v.system, "setup", url), env=env)
        worker = Worker(command(v.system, "worker", url, "--mode", "durable", *v.args), env=env)
        try:
            worker.wait_ready()
            time.sleep(1.5)  # let it reach its idle wait: the first job must wake it
            sent = run_json(
                command(v.system, "produce", url, "--rate", str(rate), "--seconds", str(seconds)),
                env=env,
            )
            total = int(sent["sent"])
            wait_for(lambda: _effects(url)[0] >= total, 60, f"{v.label}: {total} effects")
            count, distinct = _effects(url)
            if (count, distinct) != (total, total):
                raise BenchError(
                    f"{v.label}: {count} effects ({distinct} distinct), expected {total}"
                )
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),"
                    " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)"
                    " FROM (SELECT (extract(epoch FROM at) - t_enq) * 1000 AS ms"
                    " FROM bench_effects) AS l"
                ).fetchone()
            assert row is not None
            return {
                "p50": float(row[0]),
                "p99": float(row[1]),
                "max": float(row[2]),
                "achieved_rate": total / float(sent["seconds"]),
            }
        finally:
            worker.stop()
            if v.system == "celery":
                celery_cleanup(queue)


def jobfence_paths(command_name: str, n: int, *extra: str) -> dict[str, Any]:
    """One of jobfence's own paths (bulk enqueue, dead-letter replay, outbox relay), run
    in-process by bench/systems/jobfence_sys.py on a fresh database."""
    with fresh_database() as url:
        return run_json(command("jobfence", command_name, url, str(n), *extra), timeout=1800)


# -- the suite -------------------------------------------------------------------------------

WORKLOADS = {
    "durable": "durable-effect throughput (one INSERT committed before the ack)",
    "noop": "no-op throughput (empty handler; jobfence still writes its fence)",
    "fence": "the fence's cost at the defaults: paired runs with and without it",
    "latency": "enqueue → effect latency at a steady rate, and idle wake-up",
    "duplicates": "duplicate storm (50 % duplicate job_ids), jobfence",
    "bulk": "bulk enqueue in one caller transaction",
    "deadletters": "bulk replay of dead letters",
    "outbox": "outbox relay throughput",
    "http": "HTTP ingestion with idempotency keys (purchase-order POST)",
    "transports": "jobfence's durable workload on each transport",
    "memory": "jobfence worker RSS over one 1 000 000-job durable run (--memory-jobs): flat?",
    "profile": "py-spy profile of the worker at its defaults, durable (after the table)",
    # tables that grew (issue 16 §3, bench/growth_tables.py)
    "letters": "dead letters at 1 000 000 vs 1 000: list, search and the ops API, p50/p99",
    "fences": "fences at 10 000 000 vs empty: insert latency, drain, cleanup rows/s",
    # -- issue 16 §3, growth (bench/growth.py)
    "backlog": "drain rate with 1 000 000 jobs waiting vs 20 000 (--backlog-jobs, -window)",
    "queues": "one worker on 100 queues vs 1 queue, the same 60 000 jobs (--queues-jobs)",
    "processes": "1, 2 and 4 worker processes on one queue: rate, CPU, where it saturates",
    # -- end of growth
    "flow": "flow control (issue 26): CPU per job with a Limit vs without; a saturated rate",
}


#: the table's workload names (row prefixes) of each workload option
ROW_PREFIXES = {
    "durable": ("durable",),
    "noop": ("noop",),
    "fence": ("fence cost",),
    "latency": ("latency", "idle wake-up"),
    "duplicates": ("duplicate storm",),
    "bulk": ("bulk enqueue",),
    "deadletters": ("dead-letter replay",),
    "outbox": ("outbox relay",),
    "http": ("HTTP",),
    "transports": ("transports",),
    "memory": ("worker memory",),
    # tables that grew (issue 16 §3)
    "letters": ("dead letters:",),
    "fences": ("fence insert", "fence table", "fence cleanup"),
    # -- issue 16 §3, growth (bench/growth.py)
    "backlog": ("backlog",),
    "queues": ("queues",),
    "processes": ("processes",),
    # -- end of growth
    "flow": ("flow control",),
}


#: external programs the workloads need, and how to get them (Debian)
TOOLS: dict[str, tuple[str, str]] = {
    "durable": ("pgbench", "shipped with PostgreSQL: apt-get install -y postgresql-contrib"),
    "http": ("wrk", "apt-get install -y wrk"),
    "transports": ("redis-server", "apt-get install -y redis-server"),
}


def selected(args: argparse.Namespace) -> set[str]:
    """The workloads to run; exits at once on an unknown name or a missing tool."""
    only = set(args.only.split(",")) if args.only else set(WORKLOADS)
    unknown = only - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}; see --list")
    # fail now, not after a quarter of an hour, when a tool a selected workload needs is missing
    missing = [
        f"{tool} (for {workload}: {how})"
        for workload, (tool, how) in TOOLS.items()
        if workload in only and shutil.which(tool) is None
    ]
    if missing:
        raise SystemExit(
            f"missing: {'; '.join(missing)} — install it, or leave the workload out with --only"
        )
    return only


def run_suite(args: argparse.Namespace, results: Results) -> None:
    only = selected(args)
    scale = args.scale
    n_tp = max(200, int(args.jobs * scale))
    n_slow = max(200, int(args.slow_jobs * scale))
    peers_ok = not args.no_peers

    def step(text: str) -> None:
        console.print(f"[dim]{dt.datetime.now():%H:%M:%S}[/dim] {text}")

    for workload in ("durable", "noop"):
        if workload not in only:
            continue
        fixed = (
            [PGBENCH, JOBFENCE_DEFAULT, JOBFENCE, JOBFENCE_NOFENCE, JOBFENCE_SINGLE]
            if workload == "durable"
            else [JOBFENCE_DEFAULT, JOBFENCE, JOBFENCE_SINGLE]
        )
        sweeps = [PGQUEUER, CELERY] if peers_ok else []
        slow = [PROCRASTINATE] if peers_ok else []
        for i in range(args.repeat):
            # the peers' settings are swept in the first round; later rounds repeat the best
            chosen = [
                v
                for group in sweeps
                for v in (group if i == 0 else [pick(results, workload, group)])
            ]
            for v in [*fixed, *slow, *chosen]:  # interleaved: drift hits every system alike
                n = n_slow if v.system in SLOW else n_tp
                d = throughput(v, workload, n)
                results.add_drain(workload, v.label, d)
                results.get(workload, v.label).note = f"{n:,} jobs"  # type: ignore[union-attr]
                step(
                    f"{workload} {i + 1}/{args.repeat} {v.label}: {d.jobs_per_s:,.0f} jobs/s, "
                    f"{d.cpu_per_1k:.2f} CPU s/1k, RSS {d.rss_start_mb:.0f}→{d.rss_max_mb:.0f} MB"
                )
    if "fence" in only:
        fence_cost(args, results, max(200, int(FENCE_JOBS * scale)), step)
    if "latency" in only:
        seconds = max(2.0, args.latency_seconds * min(1.0, scale * 4))
        steady = [JOBFENCE]
        wakers = [JOBFENCE]
        if peers_ok:
            best_pgq = pick(results, "durable", PGQUEUER)
            steady.append(best_pgq)  # the only peer here that drains more than 1 000 jobs/s
            wakers += [PROCRASTINATE, best_pgq, pick(results, "durable", CELERY)]
        for i in range(args.repeat):
            for v in steady:
                lat = latency(v, 1000.0, seconds)
                for key in ("p50", "p99"):
                    results.row(
                        f"latency {key} @1000/s", v.label, "ms", higher_is_better=False
                    ).values.append(lat[key])
                results.row("latency: rate reached", v.label, "jobs/s").values.append(
                    lat["achieved_rate"]
                )
                step(
                    f"latency {i + 1}/{args.repeat} {v.label}: p50 {lat['p50']:.1f} ms, "
                    f"p99 {lat['p99']:.1f} ms at {lat['achieved_rate']:,.0f}/s"
                )
            for v in wakers:
                wake = latency(v, 2.0, 5.0)
                for key in ("p50", "max"):
                    results.row(
                        f"idle wake-up {key}", v.label, "ms", higher_is_better=False
                    ).values.append(wake[key])
                step(
                    f"wake-up {i + 1}/{args.repeat} {v.label}: p50 {wake['p50']:.1f} ms, "
                    f"max {wake['max']:.1f} ms"
                )
    if "duplicates" in only:
        for i in range(args.repeat):
            d = throughput(JOBFENCE, "durable", n_tp, dup=0.5)
            results.add_drain("duplicate storm", "jobfence (fence), 50 % duplicates", d)
            base = throughput(JOBFENCE, "durable", n_tp)
            results.add_drain("duplicate storm", "jobfence (fence), no duplicates", base)
            step(
                f"duplicates {i + 1}/{args.repeat}: {d.jobs_per_s:,.0f} deliveries/s "
                f"(no duplicates: {base.jobs_per_s:,.0f})"
            )
    if "bulk" in only:
        n = max(1000, int(100_000 * scale))
        for i in range(args.repeat):
            out = jobfence_paths("bulk", n)
            results.row(
                "bulk enqueue", f"jobfence enqueue_many, {n:,} jobs, one tx", "jobs/s"
            ).values.append(out["jobfence"])
            results.row("bulk enqueue", f"COPY, {n:,} rows, one tx", "jobs/s").values.append(
                out["copy"]
            )
            step(
                f"bulk {i + 1}/{args.repeat}: {out['jobfence']:,.0f} jobs/s "
                f"(COPY {out['copy']:,.0f})"
            )
    if "deadletters" in only:
        n = max(500, int(10_000 * scale))
        for i in range(args.repeat):
            out = jobfence_paths("deadletters", n)
            results.row(
                "dead-letter replay", f"bulk replay of {n:,} letters", "letters/s"
            ).values.append(out["replay"])
            results.row(
                "dead-letter replay", f"enqueue_many of {n:,} jobs", "jobs/s"
            ).values.append(out["enqueue"])
            step(
                f"deadletters {i + 1}/{args.repeat}: {out['replay']:,.0f} letters/s "
                f"(enqueue_many {out['enqueue']:,.0f})"
            )
    if "outbox" in only:
        n = max(500, int(10_000 * scale))
        for i in range(args.repeat):
            out = jobfence_paths("outbox", n)
            results.row("outbox relay", f"relay of {n:,} events", "events/s").values.append(
                out["relay"]
            )
            results.row("outbox relay", f"enqueue_many of {n:,} jobs", "jobs/s").values.append(
                out["enqueue"]
            )
            step(
                f"outbox {i + 1}/{args.repeat}: {out['relay']:,.0f} events/s "
                f"(enqueue_many {out['enqueue']:,.0f})"
            )
    if "http" in only:
        from http_bench import HTTP_BASELINES, http_ingestion

        seconds = max(3.0, 15.0 * min(1.0, scale * 4))
        for i in range(args.repeat):
            out = http_ingestion(seconds)
            for label, data in out.items():
                base = HTTP_BASELINES.get(label)
                results.row("HTTP requests/s", label, "req/s", baseline=base).values.append(
                    data["rps"]
                )
                results.row(
                    "HTTP p99", label, "ms", higher_is_better=False, baseline=base
                ).values.append(data["p99"])
                results.row(
                    "HTTP server CPU", label, "ms/req", higher_is_better=False, baseline=base
                ).values.append(data["cpu_ms_per_request"])
            step(
                f"http {i + 1}/{args.repeat}: "
                + ", ".join(
                    f"{k}: {v['rps']:,.0f} req/s p99 {v['p99']:.1f} ms" for k, v in out.items()
                )
            )
    if "memory" in only:
        from growth import memory

        memory(args, results, step)
    if "profile" in only:
        from profile import profile_jobfence

        results.profile = profile_jobfence(n_tp, seconds=max(5.0, 15.0 * min(1.0, scale * 4)))
        step("profile written to bench/results/profile-*.txt")
    # tables that grew (issue 16 §3)
    if "letters" in only:
        from growth_tables import letters_workload

        letters_workload(args, results, step)
    if "fences" in only:
        from growth_tables import fences_workload

        fences_workload(args, results, step)
    # -- issue 16 §3, growth (bench/growth.py)
    if only & {"backlog", "queues", "processes"}:
        from growth import run_growth

        run_growth(args, only, results, step)
    # -- end of growth
    if "flow" in only:
        flow_control(args, results, step)
    if "transports" in only:
        from transports_bench import transports

        for i in range(args.repeat):
            for label, d in transports(max(200, int(args.transport_jobs * scale))):
                results.add_drain("transports (durable)", label, d)
                step(f"transports {i + 1}/{args.repeat} {label}: {d.jobs_per_s:,.0f} jobs/s")


#: jobs per drain of the flow-control cost workload at scale 1
FLOW_JOBS = 20_000
#: the saturated rate limit of the flow-control workload: RATE starts per RATE_PER seconds
FLOW_RATE, FLOW_RATE_PER = 400, 2.0
FLOW_CPU = "flow control CPU/job"
FLOW_RATE_ROW = "flow control: saturated rate"


def flow_control(args: argparse.Namespace, results: Results, step: Callable[[str], None]) -> None:
    """bench/flow_bench.py under the project's interpreter (it imports jobfence): pairs of
    drains with a Limit that is never reached and without one, and a saturated rate."""
    jobs = max(2000, int(FLOW_JOBS * args.scale))
    script = str(Path(__file__).resolve().parent / "flow_bench.py")
    python = python_for("jobfence")
    for i in range(args.repeat):
        cost = run_json(
            [python, script, "cost", "--jobs", str(jobs), "--repeat", "1"], timeout=1800
        )
        results.row(
            FLOW_CPU,
            "jobfence, a Limit not reached",
            "ms/job",
            higher_is_better=False,
            baseline="jobfence, no Limit",
        ).values.append(cost["limited_cpu_ms"])
        results.row(FLOW_CPU, "jobfence, no Limit", "ms/job", higher_is_better=False).values.append(
            cost["plain_cpu_ms"]
        )
        rate = run_json(
            [
                python,
                script,
                "rate",
                "--rate",
                str(FLOW_RATE),
                "--per",
                str(FLOW_RATE_PER),
                "--repeat",
                "1",
            ],
            timeout=1800,
        )
        results.row(
            FLOW_RATE_ROW,
            f"starts/s at Rate({FLOW_RATE}, per={FLOW_RATE_PER:g} s)",
            "starts/s",
            baseline="configured",
        ).values.append(rate["achieved"])
        results.row(FLOW_RATE_ROW, "configured", "starts/s").values.append(rate["configured"])
        step(
            f"flow {i + 1}/{args.repeat}: CPU/job {cost['limited_cpu_ms']:.3f} ms with a Limit, "
            f"{cost['plain_cpu_ms']:.3f} ms without; saturated rate {rate['achieved']:.1f}/s "
            f"of {rate['configured']:.1f}/s"
        )


def flow_targets(results: Results, verdict: Callable[[bool], str]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    limited = results.get(FLOW_CPU, "jobfence, a Limit not reached")
    plain = results.get(FLOW_CPU, "jobfence, no Limit")
    if limited and plain:
        cost = limited.median / plain.median - 1
        out.append(("a Limit costs <= 10 % CPU/job", f"{cost:+.1%}", verdict(cost <= 0.10)))
    achieved = results.best(FLOW_RATE_ROW, "starts/s")
    configured = results.get(FLOW_RATE_ROW, "configured")
    if achieved and configured:
        off = achieved.median / configured.median - 1
        out.append(
            (
                "saturated rate within 2 % of the configured",
                f"{off:+.2%}",
                verdict(abs(off) <= 0.02),
            )
        )
    return out


#: paired runs of the fence-cost workload (at least): with 15 pairs the distribution-free 95 %
#: interval of the median pair runs from the 4th to the 12th smallest pair
FENCE_PAIRS = 15
#: pairs run one after the other (time per job needs the machine to itself; informative)
FENCE_SEQUENTIAL_PAIRS = 7
#: jobs per drain of the fence-cost workload at scale 1: shorter drains, more pairs
FENCE_JOBS = 20_000


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    (k, n + 1 - k) with the largest k whose binomial tail P(Bin(n, ½) < k) stays within
    (1 - confidence) / 2. No assumption about the noise's shape (the machine's load is not
    normal); with fewer than 6 values it is [min, max] at a lower confidence."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (float("nan"), float("nan"))
    tail, k, cumulative = (1 - confidence) / 2, 1, 0.0
    for j in range(n):
        cumulative += math.comb(n, j) / 2**n  # P(Bin(n, ½) = j), summed: P(Bin ≤ j)
        if cumulative > tail:
            break
        k = j + 1  # P(Bin < j + 1) ≤ tail: the (j + 1)-th order statistic qualifies
    k = min(k, (n + 1) // 2)
    return (xs[k - 1], xs[n - k])


def fence_verdict(values: list[float], limit: float = 5.0) -> str:
    """met when the whole interval of the median pair is within ``limit`` %, MISSED when the
    whole interval is above it, and otherwise says the measurement could not tell."""
    lo, hi = median_interval(values)
    if hi <= limit:
        return "met"
    if lo > limit:
        return "MISSED"
    return f"not conclusive: the 95 % interval of the median spans {limit:g} %"


def fence_cost(
    args: argparse.Namespace, results: Results, n: int, step: Callable[[str], None]
) -> None:
    """The fence's cost at the defaults: back-to-back pairs (with and without the fence, the
    order alternating), so that each pair sees the same load; the cost is read per pair, in
    throughput and in CPU per job (worker + server), and the median pair is reported with a
    distribution-free 95 % interval: the verdict is given only when the interval is on one
    side of the target."""
    sequential, together = max(FENCE_SEQUENTIAL_PAIRS, args.repeat), max(FENCE_PAIRS, args.repeat)
    for i in range(sequential):
        order = [JOBFENCE_DEFAULT, JOBFENCE_DEFAULT_NOFENCE]
        if i % 2:
            order.reverse()
        got = {v.label: throughput(v, "durable", n) for v in order}
        fenced, bare = got[JOBFENCE_DEFAULT.label], got[JOBFENCE_DEFAULT_NOFENCE.label]
        for label, d in got.items():
            results.add_drain("fence cost", label, d)
            results.get("fence cost", label).note = f"{n:,} jobs"  # type: ignore[union-attr]
        slower = bare.jobs_per_s / fenced.jobs_per_s - 1
        cpu = _drain_cpu(fenced) / _drain_cpu(bare) - 1
        results.row("fence cost: per pair", "time per job, fence vs none", "%").values.append(
            100 * slower
        )
        results.row("fence cost: per pair", "CPU per job, fence vs none", "%").values.append(
            100 * cpu
        )
        step(
            f"fence {i + 1}/{sequential}: {fenced.jobs_per_s:,.0f} vs "
            f"{bare.jobs_per_s:,.0f} jobs/s ({slower:+.1%} time per job, {cpu:+.1%} CPU per job)"
        )
    # the same pairs drained at the same time: the load is shared by both variants, so the
    # CPU per job of the two is compared under one and the same load (the decisive figure)
    for i in range(together):
        order = [JOBFENCE_DEFAULT, JOBFENCE_DEFAULT_NOFENCE]
        if i % 2:
            order.reverse()
        got = dict(zip([v.label for v in order], drain_together(order, "durable", n), strict=True))
        fenced, bare = got[JOBFENCE_DEFAULT.label], got[JOBFENCE_DEFAULT_NOFENCE.label]
        cpu = _drain_cpu(fenced) / _drain_cpu(bare) - 1
        results.row(
            "fence cost: per pair", "CPU per job, fence vs none, run together", "%"
        ).values.append(100 * cpu)
        step(
            f"fence together {i + 1}/{together}: {_drain_cpu(fenced):.3f} vs "
            f"{_drain_cpu(bare):.3f} ms CPU per job ({cpu:+.1%})"
        )
    # what one fence row costs the server, part by part (pgbench, one backend at a time)
    from fence_parts import fence_parts

    for part, us in fence_parts(rounds=max(5, args.repeat), transactions=max(200, n // 10)).items():
        results.row(
            "fence cost: server CPU per fence row", part, "µs", higher_is_better=False
        ).values.append(us)
    step("fence parts: " + ", ".join(f"{r.label} {r.median:.1f} µs" for r in _parts(results)))


def _parts(results: Results) -> list[Row]:
    return [r for (w, _), r in results.rows.items() if w == "fence cost: server CPU per fence row"]


def _drain_cpu(d: Drain) -> float:
    """Worker + server CPU ms per job of one drain."""
    return d.cpu_per_1k + d.server_cpu_per_1k


# -- the table -------------------------------------------------------------------------------

BASELINES = {
    "durable": PGBENCH.label,
    "noop": None,  # the best PGQueuer row, found at print time
    "duplicate storm": "jobfence (fence), no duplicates",
}


#: decimals of a row's spread, by unit (as _fmt shows the median)
SPREAD_DIGITS = {"ms": 1, "%": 1, "µs": 1, "ms/req": 2, "cores": 2}


def _fmt(value: float, unit: str) -> str:
    if value != value:  # nan
        return "—"
    if unit in ("ms/req", "cores"):
        return f"{value:,.2f}"
    if unit in ("ms", "%", "µs"):
        return f"{value:+,.1f}" if unit == "%" else f"{value:,.1f}"
    return f"{value:,.0f}"


def baseline_for(results: Results, r: Row) -> Row | None:
    w = r.workload
    if r.baseline is not None:
        return results.get(w, r.baseline)
    if w == "durable":
        return results.get(w, PGBENCH.label)
    if w == "noop":
        return results.best(w, "PGQueuer")
    if w.startswith(("latency", "idle wake-up")):
        return results.best(w, "PGQueuer") or results.get(w, PGQUEUER[1].label)
    rows = [x for (wl, _), x in results.rows.items() if wl == w]
    if w == "duplicate storm":
        return results.get(w, "jobfence (fence), no duplicates")
    if w == "fence cost":
        return results.get(w, JOBFENCE_DEFAULT_NOFENCE.label)
    if w in ("bulk enqueue", "dead-letter replay", "outbox relay", "transports (durable)"):
        return rows[-1] if w != "transports (durable)" else rows[0]
    return None


def ordered(results: Results) -> list[Row]:
    """Rows grouped by workload, in the order workloads were first measured."""
    order: dict[str, int] = {}
    for w, _ in results.rows:
        order.setdefault(w, len(order))
    return sorted(results.rows.values(), key=lambda r: order[r.workload])


def render(results: Results) -> tuple[Table, list[list[str]]]:
    table = Table(title="jobfence benchmark: medians of the runs, spread = min–max (runs)")
    headers = [
        "workload", "system / setting", "median", "spread (runs)",
        "CPU s/1k jobs: worker", "server", "RSS MB start→max", "baseline (same run)", "ratio",
    ]  # fmt: skip
    for h in headers:
        left = h in ("workload", "system / setting", "baseline (same run)")
        table.add_column(h, justify="left" if left else "right", overflow="fold")
    plain: list[list[str]] = []
    last = None
    for r in ordered(results):
        base = baseline_for(results, r)
        ratio = ""
        base_text = ""
        if base is not None and base is not r and base.median == base.median and base.median:
            ratio = f"{r.median / base.median:.2f}×"
            base_text = f"{base.label}: {_fmt(base.median, base.unit)} {base.unit}"
        rss = ""
        if r.rss and max(m for _, m in r.rss) > 0:
            rss = f"{median([s for s, _ in r.rss]):.0f}→{max(m for _, m in r.rss):.0f}"
        cells = [
            r.workload if r.workload != last else "",
            r.label + (f" · {r.note}" if r.note else ""),
            f"{_fmt(r.median, r.unit)} {r.unit}",
            f"{spread(r.values, SPREAD_DIGITS.get(r.unit, 0))} ({len(r.values)})"
            if len(r.values) > 1
            else "(1)",
            f"{median(r.cpu):.2f}" if r.cpu else "",
            f"{median(r.server_cpu):.2f}"
            if r.server_cpu and median(r.server_cpu) == median(r.server_cpu)
            else "",
            rss,
            base_text,
            ratio,
        ]
        last = r.workload
        table.add_row(*cells)
        plain.append(cells)
    return table, [headers, *plain]


def targets(results: Results) -> list[tuple[str, str, str]]:
    """The issue's targets: (target, measured, verdict)."""
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    jf = results.get("durable", JOBFENCE.label)
    if jf:
        pro = results.get("durable", PROCRASTINATE.label)
        if pro:
            x = jf.median / pro.median
            out.append(("durable: fence ≥ 5× Procrastinate", f"{x:.2f}×", verdict(x >= 5)))
        peers = [
            r
            for (w, label), r in results.rows.items()
            if w == "durable" and not label.startswith(("jobfence", "pgbench"))
        ]
        if peers:
            best = max(peers, key=lambda r: r.median)
            x = jf.median / best.median
            out.append(
                (
                    f"durable: fence ≥ 1.5× the best peer ({best.label})",
                    f"{x:.2f}×",
                    verdict(x >= 1.5),
                )
            )
        nf = results.get("durable", JOBFENCE_NOFENCE.label)
        if nf:
            cost = 1 - jf.median / nf.median
            out.append(
                ("the fence costs ≤ 10 % (vs no fence)", f"{cost:+.1%}", verdict(cost <= 0.10))
            )
        pg = results.get("durable", PGBENCH.label)
        if pg:
            x = jf.median / pg.median
            out.append(("≥ 50 % of pgbench, same transaction", f"{x:.0%}", verdict(x >= 0.5)))
        mem = results.get("worker memory", JOBFENCE.label) or jf
        if mem.rss:
            top = max(m for _, m in mem.rss)
            out.append(
                ("worker RSS < 150 MB over the run", f"max {top:.0f} MB", verdict(top < 150))
            )
    out += defaults_targets(results, verdict)
    from growth import growth_targets as worker_growth_targets  # issue 16 §3
    from growth_tables import growth_targets as table_growth_targets

    out += worker_growth_targets(results, verdict)
    out += table_growth_targets(results, verdict)
    out += flow_targets(results, verdict)
    noop = results.get("noop", JOBFENCE.label)
    best_pgq = results.best("noop", "PGQueuer")
    if noop and best_pgq:
        x = noop.median / best_pgq.median
        out.append((f"no-op: ≥ PGQueuer's best ({best_pgq.label})", f"{x:.2f}×", verdict(x >= 1)))
    wake = results.get("idle wake-up p50", JOBFENCE.label)
    if wake:
        out.append(
            ("idle wake-up < 50 ms (p50)", f"{wake.median:.1f} ms", verdict(wake.median < 50))
        )
    p99 = results.get("latency p99 @1000/s", JOBFENCE.label)
    if p99:
        out.append(
            (
                "p99 enqueue → effect < 100 ms at 1 000/s",
                f"{p99.median:.1f} ms",
                verdict(p99.median < 100),
            )
        )
    return out


def _cpu_per_job(r: Row) -> float:
    """Worker + server CPU ms per job (the medians of the runs); 0 when not measured."""
    if not r.cpu or not r.server_cpu:
        return 0.0
    total = median(r.cpu) + median(r.server_cpu)
    return total if total == total else 0.0


def defaults_targets(
    results: Results, verdict: Callable[[bool], str]
) -> list[tuple[str, str, str]]:
    """Issue 16 §2: the defaults (no tuning flag) at the physical limit; the fence's cost;
    the outbox relay."""
    out: list[tuple[str, str, str]] = []
    df = results.get("durable", JOBFENCE_DEFAULT.label)
    if df:
        pg = results.get("durable", PGBENCH.label)
        if pg:
            x = df.median / pg.median
            out.append(("defaults: ≥ 1.0× pgbench, same transaction", f"{x:.2f}×", verdict(x >= 1)))
        peers = [
            r
            for (w, label), r in results.rows.items()
            if w == "durable" and not label.startswith(("jobfence", "pgbench"))
        ]
        if peers:
            best = max(peers, key=lambda r: r.median)
            x = df.median / best.median
            out.append(
                (
                    f"defaults: ≥ 1.5× the best peer's best setting ({best.label})",
                    f"{x:.2f}×",
                    verdict(x >= 1.5),
                )
            )
        # what a saturated machine would give: throughput = cores / CPU per job (worker +
        # server), the part of the measurement that holds still when others load the cores
        for other in [r for r in (pg, best if peers else None) if r is not None]:
            mine, theirs = _cpu_per_job(df), _cpu_per_job(other)
            if mine and theirs:
                out.append(
                    (
                        f"defaults: CPU per job, {other.label} / defaults (capacity)",
                        f"{theirs / mine:.2f}× ({theirs:.2f} / {mine:.2f} ms)",
                        "info",
                    )
                )
    for label in (
        "time per job, fence vs none",
        "CPU per job, fence vs none",
        "CPU per job, fence vs none, run together",
    ):
        pair = results.get("fence cost: per pair", label)
        if pair and pair.values:
            m = median(pair.values)
            lo, hi = median_interval(pair.values)
            out.append(
                (
                    f"the fence costs ≤ 5 % ({label.replace(', fence vs none', '')}, "
                    f"median of "
                    f"{len(pair.values)} pairs, 95 % interval)",
                    f"{m:+.1f} % ({lo:+.1f} … {hi:+.1f})",
                    fence_verdict(pair.values),
                )
            )
    row = results.get("fence cost: server CPU per fence row", "fence row")
    job = results.get("fence cost", JOBFENCE_DEFAULT.label) or df
    if row and job and _cpu_per_job(job):
        share = row.median / (_cpu_per_job(job) * 1000) * 100
        out.append(
            (
                "the fence costs ≤ 5 % (its row's server CPU / a job's CPU at the defaults)",
                f"{share:.1f} % ({row.median:.1f} µs / {_cpu_per_job(job) * 1000:.0f} µs)",
                verdict(share <= 5),
            )
        )
    out += http_targets(results, verdict)
    relay = [r for (w, _), r in results.rows.items() if w == "outbox relay"]
    if len(relay) == 2 and relay[1].median:
        x = relay[0].median / relay[1].median
        out.append(("outbox relay ≥ 0.5× enqueue_many", f"{x:.2f}×", verdict(x >= 0.5)))
    return out


#: issue 16 §1: (keyed POST, its floor in the same process) of the HTTP workload
HTTP_PAIRS = (
    (
        "purchase-order API: POST /requests with Idempotency-Key",
        "purchase-order API: GET /healthz (no database)",
    ),
    (
        "IdempotencyMiddleware + trivial app: POST with Idempotency-Key",
        "bare ASGI app: POST (no middleware)",
    ),
)


def http_targets(results: Results, verdict: Callable[[bool], str]) -> list[tuple[str, str, str]]:
    """Issue 16 §1: a keyed POST at ≥ 0.5× the floor of its own process, p99 < 50 ms at 16
    connections; and its server CPU per request against the floor's (what bounds it)."""
    from http_bench import issue27_targets

    out: list[tuple[str, str, str]] = issue27_targets(results, verdict)
    for post, floor in HTTP_PAIRS:
        rate, base = results.get("HTTP requests/s", post), results.get("HTTP requests/s", floor)
        p99 = results.get("HTTP p99", post)
        cpu, cpu_base = results.get("HTTP server CPU", post), results.get("HTTP server CPU", floor)
        name = post.split(":")[0]
        if rate and base:
            x = rate.median / base.median
            out.append((f"HTTP: {name} keyed POST ≥ 0.5× {floor}", f"{x:.2f}×", verdict(x >= 0.5)))
        if p99:
            out.append(
                (
                    f"HTTP: {name} keyed POST p99 < 50 ms at 16 connections",
                    f"{p99.median:.1f} ms",
                    verdict(p99.median < 50),
                )
            )
        if cpu and cpu_base and cpu_base.median:
            out.append(
                (
                    f"HTTP: {name} server CPU per keyed POST / per {floor.split(':')[-1].strip()}",
                    f"{cpu.median / cpu_base.median:.1f}× ({cpu.median:.2f} / "
                    f"{cpu_base.median:.2f} ms)",
                    "info: the bound on one core",
                )
            )
    return out


def revision() -> str:
    """The commit measured, and whether src/ differed from it (others work in this tree)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return f"jobfence {head or '?'}{' + uncommitted changes in src/' if dirty else ''}"


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{revision()} · "
        f"{platform.node()} · {psutil.cpu_count()} CPUs · "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB · Python {platform.python_version()} · "
        f"PostgreSQL {scalar(ADMIN, 'SHOW server_version')} · "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def main(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", help="comma-separated workloads (see --list)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per throughput run")
    parser.add_argument(
        "--slow-jobs",
        type=int,
        default=10_000,
        help="jobs per run for the slow peers (Procrastinate, Celery)",
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=10.0,
        help="seconds of steady 1 000 jobs/s in the latency workload",
    )
    parser.add_argument(
        "--memory-jobs", type=int, default=1_000_000, help="jobs in the worker-memory run"
    )
    parser.add_argument(
        "--transport-jobs",
        type=int,
        default=10_000,
        help="jobs per transport run (bench/transports.py)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="size factor (0.05 for a smoke run)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: --scale 0.05 --repeat 1")
    parser.add_argument("--no-peers", action="store_true", help="jobfence and pgbench only")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    # -- issue 16 §3, growth (bench/growth.py)
    from growth import add_options

    add_options(parser)
    # -- end of growth
    parser.add_argument(
        "--resume",
        metavar="RESULTS.json",
        help="start from the rows of an earlier run (bench/results/*.json), e.g. to add the "
        "workloads it did not reach (--only ...)",
    )
    args = parser.parse_args()
    if args.list:
        for name, text in WORKLOADS.items():
            console.print(f"{name:12} {text}")
        return
    if args.quick:
        args.scale, args.repeat = min(args.scale, 0.05), 1
    selected(args)
    started = dt.datetime.now(dt.UTC)
    before = machine()
    console.print(f"[bold]machine[/bold]: {before}")
    results = Results()
    if args.resume:
        results.load(Path(args.resume))
        redo = set(args.only.split(",")) if args.only else set(WORKLOADS)
        prefixes = tuple(p for w in redo for p in ROW_PREFIXES.get(w, ()))
        for key in [k for k in results.rows if k[0].startswith(prefixes)]:
            del results.rows[key]  # measured again in this run
        console.print(f"resumed {len(results.rows)} rows from {args.resume}")
    try:
        run_suite(args, results)
    finally:
        after = os.getloadavg()
        table, plain = render(results)
        console.print(table)
        goals = targets(results)
        if goals:
            t = Table(title="targets (issue 6)")
            for h in ("target", "measured", ""):
                t.add_column(h)
            for g in goals:
                t.add_row(*g, style=None if g[2] == "met" else "red")
            console.print(t)
        if results.profile:
            console.print("[bold]where jobfence's worker spends its CPU (py-spy)[/bold]")
            console.print(results.profile)
        console.print(f"load average at the end: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
        save(args, started, before, plain, goals, results)


def save(
    args: argparse.Namespace,
    started: dt.datetime,
    before: str,
    plain: list[list[str]],
    goals: list[tuple[str, str, str]],
    results: Results,
) -> None:
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    data = {
        "started": started.isoformat(),
        "args": vars(args),
        "machine": before,
        "load_after": os.getloadavg(),
        "rows": [asdict(r) for r in results.rows.values()],
        "targets": goals,
    }
    (out / f"{stamp}.json").write_text(json.dumps(data, indent=1))
    lines = [f"Machine: {before}", ""]
    header, *body = plain
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(c or "" for c in row) + " |" for row in body]
    if goals:
        lines += ["", "| target | measured | |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in goals]
    (out / f"{stamp}.md").write_text("\n".join(lines) + "\n")
    with contextlib.suppress(OSError):
        (out / "latest.md").unlink()
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    console.print(f"results: {out.relative_to(ROOT)}/{stamp}.json and .md")
