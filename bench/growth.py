"""How jobfence's worker holds up as things grow (issue 16 §3): a deep backlog, many queues,
several worker processes, a long run. Each figure is a ratio against its small case measured
in the same invocation (bench/run.py --only backlog,queues,processes,memory).

Every run gets a fresh database (dropped after) and verifies its result: as many effect rows
as jobs drained, all distinct, none for a job still queued, nothing left running.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
from measure import (
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
    run_json,
    scalar,
)
from suite import JOBFENCE, JOBFENCE_DEFAULT, Results, Row, execute, throughput, wait_for

Step = Callable[[str], None]
Verdict = Callable[[bool], str]

#: jobs of the small cases (backlog, queues, processes) at --scale 1
SMALL = 20_000
#: many queues against one
QUEUES = 100
#: jobs of the queues workload at --scale 1: 600 a queue, more than one claim takes (550), so
#: that each queue's range scan in a claim is full (20 000 hides what a claim costs then)
QUEUES_JOBS = 60_000
#: worker processes tried, on the same queue
PROCESSES = (1, 2, 4)
#: the claim EXPLAINed for the plan check: the defaults' usual claim when a slot frees under
#: a backlog (one batch of 50 for the free slot + a prefetch of 10 slots × 50)
CLAIM_LIMIT = 550
QUEUE_SQL = ROOT / "src" / "jobfence" / "sql" / "postgresql" / "queries" / "jobs.sql"


# -- one drain ----------------------------------------------------------------------------------


def queue_names(queues: int) -> list[str]:
    """As bench/systems/jobfence_sys.py names them."""
    return ["bench"] if queues <= 1 else [f"bench-{i:03d}" for i in range(queues)]


def claim_sql() -> str:
    """jobfence's claim statement, as the worker runs it (read from the library's SQL)."""
    text = QUEUE_SQL.read_text()
    body = text.split("-- name: claim\n", 1)[1].split("\n-- name:", 1)[0]
    return "\n".join(line for line in body.splitlines() if not line.startswith("--"))


def explain_claim(url: str, queues: int) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim of CLAIM_LIMIT jobs, rolled back: how it
    reads core.jobs (any sequential scan?), its time, and the pages its candidate range scan
    touched (dead index entries left by a drain show up there)."""
    params = {
        "queues": queue_names(queues),
        "limit": CLAIM_LIMIT,
        # as jobfence.transports.database.per_queue_limit (the peers' virtualenv, where this
        # runs, has no jobfence to import it from)
        "per_queue": CLAIM_LIMIT
        if queues <= 1
        else min(CLAIM_LIMIT, max(-(-CLAIM_LIMIT // queues), 50)),
        "lease": 60.0,
        "worker_id": "bench-explain",
    }
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim_sql()
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
        conn.rollback()
    assert row is not None
    plan = row[0][0]
    nodes: list[tuple[dict[str, Any], str]] = []  # (node, its parent's type)

    def walk(node: dict[str, Any], parent: str) -> None:
        nodes.append((node, parent))
        for child in node.get("Plans", []):
            walk(child, node["Node Type"])

    walk(plan["Plan"], "")
    scans = [
        (n, parent)
        for n, parent in nodes
        if n.get("Relation Name") == "jobs" and n["Node Type"].endswith("Scan")
    ]
    cte = next((n for n, _ in nodes if n.get("Subplan Name") == "CTE candidates"), plan["Plan"])
    return {
        "seq_scans": sum(n["Node Type"] == "Seq Scan" for n, _ in scans),
        "scans": sorted(
            {
                f"{n['Node Type']}"
                + (f" using {n['Index Name']}" if n.get("Index Name") else "")
                + f" under {parent}"
                for n, parent in scans
            }
        ),
        "ms": float(plan["Execution Time"]),
        "buffers": int(cte.get("Shared Hit Blocks", 0)) + int(cte.get("Shared Read Blocks", 0)),
    }


def table_stats(url: str) -> dict[str, float]:
    """The queue table's live and dead tuples and its size with indexes (MB)."""
    time.sleep(1.2)  # backends flush their statistics at most once a second
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_live_tup, n_dead_tup, pg_total_relation_size('core.jobs'),"
            " pg_relation_size('core.jobs_available_idx')"
            " FROM pg_stat_user_tables WHERE relid = 'core.jobs'::regclass"
        ).fetchone()
    assert row is not None
    return {"live": row[0], "dead": row[1], "mb": row[2] / 1e6, "index_mb": row[3] / 1e6}


def claim_times(path: Path) -> dict[str, float]:
    """p50, p99 and max (ms) of the worker's claims that returned jobs, and their mean size."""
    if not path.exists():
        return {}
    claims = [c for c in json.loads(path.read_text()) if c[2] > 0]
    path.unlink()
    if not claims:
        return {}
    ms = sorted(c[1] * 1000 for c in claims)
    return {
        "p50": median(ms),
        "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "max": ms[-1],
        "rows": sum(c[2] for c in claims) / len(claims),
        "claims": len(claims),
    }


def hold(url: str, queues: int, paused: bool) -> None:
    """Pause the queues (the worker claims nothing while they are), or resume them and wake
    the worker, as `jobfence queues resume` does: every process starts the drain together."""
    names = queue_names(queues)
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        if paused:
            for name in names:
                conn.execute(
                    "INSERT INTO core.queue_pauses (queue, paused_by) VALUES (%s, 'bench')",
                    (name,),
                )
        else:
            conn.execute("DELETE FROM core.queue_pauses")
            conn.execute(
                "SELECT pg_notify('jobfence_jobs', q) FROM unnest(%s::text[]) AS q", (names,)
            )


def verify(url: str, n: int, *, complete: bool) -> int:
    """The run did what it must: effects = jobs gone from the queue, all distinct, none for a
    job still queued, nothing left running; with ``complete``, an empty queue. Returns the
    jobs done."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bench_effects),"
            " (SELECT count(DISTINCT job_id) FROM bench_effects),"
            " (SELECT count(*) FROM core.jobs),"
            " (SELECT count(*) FROM core.jobs WHERE state = 'running'),"
            " (SELECT count(*) FROM core.jobs AS j JOIN bench_effects AS e USING (job_id))"
        ).fetchone()
    assert row is not None
    effects, distinct, queued, running, both = (int(x) for x in row)
    if effects != distinct or effects + queued != n or running or both:
        raise BenchError(
            f"{effects} effects ({distinct} distinct), {queued} jobs still queued "
            f"({running} running, {both} with an effect): expected {n} in all"
        )
    if complete and queued:
        raise BenchError(f"{queued} jobs left in the queue, expected none")
    return effects


def run_drain(
    n: int,
    *,
    window: int = 0,
    queues: int = 1,
    processes: int = 1,
    explain: bool = False,
) -> tuple[Drain, dict[str, Any]]:
    """Enqueue ``n`` jobs over ``queues`` queues (paused), start ``processes`` workers at the
    defaults, resume the queues and time the drain of the first ``window`` jobs (0: all).
    Returns the drain and facts: the worker's claim times; with ``explain``, the claim's
    plan and the queue table's statistics before and after."""
    target = window or n
    facts: dict[str, Any] = {}
    with fresh_database() as url:
        run_json(command("jobfence", "setup", url))
        run_json(command("jobfence", "enqueue", url, str(n), "--queues", str(queues)), timeout=3600)
        execute(url, "VACUUM ANALYZE")
        if scalar(url, "SELECT count(*) FROM core.jobs") != n:
            raise BenchError(f"{n} jobs expected in the queue after the enqueue")
        if explain:
            facts["before"] = table_stats(url)
            facts["plan_before"] = explain_claim(url, queues)  # (its rollback leaves dead rows)
        hold(url, queues, paused=True)
        log = Path(f"/tmp/jf-bench-claims-{uuid.uuid4().hex[:8]}.json")
        cmd = command(
            "jobfence", "worker", url, "--mode", "durable", *JOBFENCE_DEFAULT.args,
            "--queues", str(queues), "--processes", str(processes),
        )  # fmt: skip
        if processes == 1:  # (one log per worker process)
            cmd += ["--claim-log", str(log)]
        worker = Worker(cmd)
        progress = effects_progress(url, target)
        try:
            worker.wait_ready()
            hold(url, queues, paused=False)
            c0, t0 = busy_cpu(), time.perf_counter()
            result = drain(worker, url, target, progress, timeout=max(120.0, target / 100))
            facts["machine"] = (busy_cpu() - c0) / (time.perf_counter() - t0)
            if window and window < n:
                # pause, let the worker finish what it claimed, then stop it idle (a stop
                # that lands on a claim in flight can leave it running until its lease ends)
                hold(url, queues, paused=True)
                running = "SELECT count(*) FROM core.jobs WHERE state = 'running'"
                wait_for(lambda: scalar(url, running) == 0, 60, "the claimed jobs done")
            else:
                wait_for(lambda: scalar(url, "SELECT count(*) FROM core.jobs") == 0, 30, "empty")
            worker.stop()
            hold(url, queues, paused=False)  # (for the EXPLAIN after)
            facts["done"] = verify(url, n, complete=not window or window >= n)
            facts["claims"] = claim_times(log)
            if explain:
                facts["after"] = table_stats(url)
                facts["plan_after"] = explain_claim(url, queues)
            return result, facts
        finally:
            worker.stop()
            close_progress(progress)
            log.unlink(missing_ok=True)


def busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (every process: ours and the others')."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))


def cores(d: Drain) -> float:
    """Cores kept busy over the drain: worker + server CPU seconds per second."""
    return (d.cpu_per_1k + d.server_cpu_per_1k) / 1000 * d.jobs_per_s


# -- the workloads --------------------------------------------------------------------------------


def backlog(args: argparse.Namespace, results: Results, step: Step) -> None:
    """The drain rate with a deep backlog waiting (1 000 000 jobs at --scale 1; the first
    --backlog-window drained) against a small one (20 000, drained whole)."""
    small = max(1000, int(SMALL * args.scale))
    big = max(small * 5, int(args.backlog_jobs * args.scale))
    window = (
        min(big, max(small, int(args.backlog_window * args.scale))) if args.backlog_window else 0
    )
    base = f"defaults, {small:,} queued (all drained)"
    label = f"defaults, {big:,} queued (" + (
        f"first {window:,} drained)" if window else "all drained)"
    )
    for i in range(args.repeat):
        pair = [(small, base, 0), (big, label, window)]
        for size, text, win in pair if i % 2 == 0 else pair[::-1]:  # (alternating: drift)
            t0 = time.monotonic()
            d, facts = run_drain(size, window=win, explain=True)
            kw = {} if size == small else {"baseline": base}
            results.add_drain("backlog: drain rate", text, d, **kw)
            claims = facts["claims"]
            if claims:
                results.row(
                    "backlog: claim p99 (worker)", text, "ms", higher_is_better=False, **kw
                ).values.append(claims["p99"])
            before, after = facts["before"], facts["after"]
            plans = [("before", facts["plan_before"]), ("after", facts["plan_after"])]
            seq = results.row(
                "backlog: seq scans of core.jobs in the claim", f"{size:,} queued", "nodes"
            )
            seq.values = [max([*seq.values, *(p["seq_scans"] for _, p in plans)])]
            seq.note = "; ".join(sorted({x for _, p in plans for x in p["scans"]}))
            for (when, plan), stats in zip(plans, (before, after), strict=True):
                if size == small and when == "after":
                    continue
                what = f"{size:,} queued, {when} the drain"
                r = results.row("backlog: claim of 550, its range scan (EXPLAIN)", what, "buffers")
                r.values.append(plan["buffers"])
                r.note = f"claim {plan['ms']:.0f} ms"
                if size == big:
                    r = results.row("backlog: core.jobs + indexes", what, "MB")
                    r.values.append(stats["mb"])
                    r.note = f"{stats['dead']:,} dead, {stats['live']:,} live tuples"
            step(
                f"backlog {i + 1}/{args.repeat} {size:,} queued: {d.jobs_per_s:,.0f} jobs/s over "
                f"{win or size:,}; claim p50 {claims.get('p50', 0):.1f} p99 "
                f"{claims.get('p99', 0):.1f} ms ({claims.get('rows', 0):.0f} rows); table "
                f"{before['mb']:.0f}→{after['mb']:.0f} MB, dead {before['dead']:,}→"
                f"{after['dead']:,}; claim reads core.jobs by {seq.note}; its range scan "
                f"{plans[0][1]['buffers']}→{plans[1][1]['buffers']} buffers, "
                f"{plans[0][1]['ms']:.0f}→{plans[1][1]['ms']:.0f} ms "
                f"({time.monotonic() - t0:.0f} s)"
            )


def many_queues(args: argparse.Namespace, results: Results, step: Step) -> None:
    """One worker (defaults) on 100 queues against one queue, the same jobs in all
    (--queues-jobs)."""
    n = max(1000, int(args.queues_jobs * args.scale))
    base = f"defaults, 1 queue · {n:,} jobs"
    for i in range(args.repeat):
        for queues in (1, QUEUES) if i % 2 == 0 else (QUEUES, 1):  # (alternating: drift)
            label = base if queues == 1 else f"defaults, {queues} queues · {n:,} jobs"
            kw = {} if queues == 1 else {"baseline": base}
            t0 = time.monotonic()
            d, facts = run_drain(n, queues=queues)
            results.add_drain("queues: drain rate", label, d, **kw)
            claims = facts["claims"]
            if claims:
                results.row(
                    "queues: claim p99 (worker)", label, "ms", higher_is_better=False, **kw
                ).values.append(claims["p99"])
            step(
                f"queues {i + 1}/{args.repeat} {queues}: {d.jobs_per_s:,.0f} jobs/s, claim p50 "
                f"{claims.get('p50', 0):.1f} p99 {claims.get('p99', 0):.1f} ms "
                f"({claims.get('rows', 0):.0f} rows) ({time.monotonic() - t0:.0f} s)"
            )


def processes(args: argparse.Namespace, results: Results, step: Step) -> None:
    """1, 2 and 4 worker processes (defaults each) on the same queue and jobs (--jobs); CPU
    of the workers and of the server, the cores they keep busy together, and the cores the
    whole machine was busy (the other processes on a shared machine take their share)."""
    n = max(1000, int(args.jobs * args.scale))
    base = f"1 process (defaults) · {n:,} jobs"
    for i in range(args.repeat):
        for k in PROCESSES:
            label = base if k == 1 else f"{k} processes (defaults each) · {n:,} jobs"
            kw = {} if k == 1 else {"baseline": base}
            t0 = time.monotonic()
            d, facts = run_drain(n, processes=k)
            results.add_drain("processes: drain rate", label, d, **kw)
            results.row("processes: cores busy (workers + server)", label, "cores").values.append(
                cores(d)
            )
            results.row("processes: cores busy (whole machine)", label, "cores").values.append(
                facts["machine"]
            )
            step(
                f"processes {i + 1}/{args.repeat} {k}: {d.jobs_per_s:,.0f} jobs/s, CPU s/1k "
                f"worker {d.cpu_per_1k:.2f} server {d.server_cpu_per_1k:.2f}, {cores(d):.2f} "
                f"cores busy (machine {facts['machine']:.2f}) ({time.monotonic() - t0:.0f} s)"
            )


def memory(args: argparse.Namespace, results: Results, step: Step) -> None:
    """The worker's RSS over a long run (1 000 000 jobs at --scale 1): at the start of the
    drain, after 10 % of it (warmed up), and its maximum over the rest; and the drain rate of
    the first and the last 10 % (the fence and effect tables grow meanwhile)."""
    n = max(1000, int(args.memory_jobs * args.scale))
    t0 = time.monotonic()
    d = throughput(JOBFENCE, "durable", n)
    results.add_drain("worker memory", JOBFENCE.label, d)
    results.get("worker memory", JOBFENCE.label).note = f"{n:,} jobs, one run"  # type: ignore[union-attr]
    shape = flatness(d, n)
    warm = "RSS after 10 % of the drain (warmed up)"
    for label, value in (
        ("RSS at the start of the drain", shape["start"]),
        (warm, shape["warm"]),
        ("RSS max over the last 90 %", shape["rest"]),
    ):
        kw = {"baseline": warm} if label != warm else {}
        results.row("worker memory: RSS", label, "MB", higher_is_better=False, **kw).values.append(
            value
        )
    first = "rate over the first 10 %"
    results.row("worker memory: drain rate", first, "jobs/s").values.append(shape["rate_first"])
    results.row(
        "worker memory: drain rate", "rate over the last 10 %", "jobs/s", baseline=first
    ).values.append(shape["rate_last"])
    step(
        f"memory: {n:,} jobs, {d.jobs_per_s:,.0f} jobs/s, RSS {shape['start']:.0f} → "
        f"{shape['warm']:.0f} at 10 % → max {shape['rest']:.0f} MB after; rate first 10 % "
        f"{shape['rate_first']:,.0f}, last 10 % {shape['rate_last']:,.0f} jobs/s "
        f"({time.monotonic() - t0:.0f} s)"
    )


def flatness(d: Drain, n: int) -> dict[str, float]:
    """RSS and rate along a drain, from its samples (seconds, jobs done, RSS MB)."""
    samples: list[tuple[float, int, float]] = d.extra["samples"]
    t0, done0, start = samples[0]
    tenth = done0 + (n - done0) / 10
    warm_i = next(i for i, s in enumerate(samples) if s[1] >= tenth)
    last_i = next(i for i, s in enumerate(samples) if s[1] >= n - (n - done0) / 10)
    t_w, done_w, rss_w = samples[warm_i]
    t_l, done_l, _ = samples[last_i]
    t_e, done_e, _ = samples[-1]
    return {
        "start": start,
        "warm": rss_w,
        "rest": max(s[2] for s in samples[warm_i:]),
        "rate_first": (done_w - done0) / max(t_w - t0, 1e-6),
        "rate_last": (done_e - done_l) / max(t_e - t_l, 1e-6),
    }


# -- targets ------------------------------------------------------------------------------------


def _ratio(results: Results, workload: str, label_prefix: str) -> tuple[Row, Row, float] | None:
    rows = [r for (w, _), r in results.rows.items() if w == workload]
    base = next((r for r in rows if r.baseline is None), None)
    other = next((r for r in rows if r.label.startswith(label_prefix) and r is not base), None)
    if base is None or other is None or not base.median:
        return None
    return base, other, other.median / base.median


def _cpu_ratio(base: Row, other: Row) -> str:
    """CPU per job (worker + server, medians) of ``other`` against ``base``: the part of a
    measurement that holds still when other processes load the machine."""
    mine = median(other.cpu) + median(other.server_cpu)
    theirs = median(base.cpu) + median(base.server_cpu)
    return f"{mine / theirs:.2f}× ({mine:.3f} / {theirs:.3f} s per 1 000 jobs)"


def growth_targets(results: Results, verdict: Verdict) -> list[tuple[str, str, str]]:
    """Issue 16 §3's targets, each from the physical limit (docs/benchmarks.md, Method)."""
    out: list[tuple[str, str, str]] = []
    got = _ratio(results, "backlog: drain rate", "defaults")
    if got:
        x = got[2]
        out.append(
            ("backlog: drain rate ≥ 0.9× the small backlog's", f"{x:.2f}×", verdict(x >= 0.9))
        )
        out.append(("backlog: CPU per job, deep / small backlog", _cpu_ratio(*got[:2]), "info"))
    got = _ratio(results, "backlog: claim p99 (worker)", "defaults")
    if got:
        _, _, x = got
        out.append(("backlog: claim p99 ≤ 1.5× the small case's", f"{x:.2f}×", verdict(x <= 1.5)))
    for (w, label), r in results.rows.items():
        if w.startswith("backlog: seq scans"):
            out.append(
                (f"backlog: the claim reads core.jobs by index only ({label})",
                 f"{max(r.values):.0f} seq scans: {r.note}", verdict(max(r.values) == 0))
            )  # fmt: skip
    got = _ratio(results, "queues: drain rate", "defaults")
    if got:
        _, _, x = got
        out.append(
            (f"queues: one worker on {QUEUES} queues ≥ 0.8× on 1", f"{x:.2f}×", verdict(x >= 0.8))
        )
        out.append((f"queues: CPU per job, {QUEUES} queues / 1", _cpu_ratio(*got[:2]), "info"))
    out += _process_targets(results, verdict)
    rss = _ratio(results, "worker memory: RSS", "RSS max")
    if rss:
        warm, top, x = rss
        out.append(
            ("worker memory: max RSS after warm-up ≤ 1.1× RSS at 10 %",
             f"{x:.2f}× ({warm.median:.0f} → {top.median:.0f} MB)", verdict(x <= 1.1))
        )  # fmt: skip
    rate = _ratio(results, "worker memory: drain rate", "rate over the last")
    if rate:
        out.append(("worker memory: rate of the last 10 % / first 10 %", f"{rate[2]:.2f}×", "info"))
    return out


def _process_targets(results: Results, verdict: Verdict) -> list[tuple[str, str, str]]:
    """k processes reach at least 0.9 × min(k, the cores left to us / the cores one process
    keeps busy) × one process's rate: they scale until the CPUs are busy, then hold. The
    cores left to us: the CPUs minus what the other processes on the machine took meanwhile
    (the whole machine's busy cores minus ours, in the k-process runs)."""

    def by_k(workload: str) -> dict[str, Row]:
        return {r.label.split(" ")[0]: r for (w, _), r in results.rows.items() if w == workload}

    rows = by_k("processes: drain rate")
    ours = by_k("processes: cores busy (workers + server)")
    machine = by_k("processes: cores busy (whole machine)")
    one, one_busy = rows.get("1"), ours.get("1")
    if one is None or one_busy is None or not one_busy.median:
        return []
    cpus = psutil.cpu_count() or 1
    out = []
    for k in PROCESSES[1:]:
        r, mine, everyone = rows.get(str(k)), ours.get(str(k)), machine.get(str(k))
        if r is None or mine is None or everyone is None:
            continue
        x = r.median / one.median
        left = cpus - max(0.0, everyone.median - mine.median)
        limit = max(1.0, min(k, left / one_busy.median))
        out.append(
            (f"processes: {k} ≥ 0.9 × min({k}, {left:.2f} cores left by others / "
             f"{one_busy.median:.2f} busy with 1) = {0.9 * limit:.2f}× of 1",
             f"{x:.2f}× ({mine.median:.2f} cores busy, machine {everyone.median:.2f})",
             verdict(x >= 0.9 * limit))
        )  # fmt: skip
        per_job = (median(r.cpu) + median(r.server_cpu)) / (
            median(one.cpu) + median(one.server_cpu)
        )
        out.append(
            (f"processes: {k} — CPU per job (workers + server) ≤ 1.15× one process's (the "
             "rate then follows the cores they get)",
             f"{per_job:.2f}×", verdict(per_job <= 1.15))
        )  # fmt: skip
    return out


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backlog-jobs", type=int, default=1_000_000, help="jobs waiting in the backlog workload"
    )
    parser.add_argument(
        "--backlog-window",
        type=int,
        default=50_000,
        help="jobs drained and timed from the deep backlog (0: all of it)",
    )
    parser.add_argument(
        "--queues-jobs",
        type=int,
        default=QUEUES_JOBS,
        help="jobs of the queues workload (from 100 × 550 up, a claim over 100 queues locks "
        "55 000 rows to take 550)",
    )


def run_growth(args: argparse.Namespace, only: set[str], results: Results, step: Step) -> None:
    """The workloads of this module that ``only`` selects."""
    if "backlog" in only:
        backlog(args, results, step)
    if "queues" in only:
        many_queues(args, results, step)
    if "processes" in only:
        processes(args, results, step)
