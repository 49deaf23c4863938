"""Tables that grew (issue 16 §3): dead letters at 1 000 000 and fences at 10 000 000, each
measured against its small case in the same run.

The suite (bench/suite.py, in bench/.venv-peers) calls :func:`letters_workload` and
:func:`fences_workload`; each runs this file as a child under the project's interpreter
(jobfence importable), which seeds a small and a big fresh database, measures both in
interleaved rounds (so the machine's drift hits both alike) and prints one JSON line:

    python bench/growth_tables.py letters SMALL_URL BIG_URL --small 1000 --big 1000000
    python bench/growth_tables.py fences  SMALL_URL BIG_URL --big 10000000

``letters``: the first page (50, the default) of the service functions behind
``jobfence dead-letters list`` (:func:`jobfence.review.deadletters.letters`) and the ops API's
search (:func:`jobfence.review.deadletters.search`) with each filter they offer, and
``GET /v1/dead-letters`` of the ops API served by uvicorn on 127.0.0.1 (a socket from
:func:`jobfence.http.tcp_listen_socket`); p50/p99 per round; each first page is checked
against an independent query (ids, order, count), and the big database's plan of each
search is read with EXPLAIN ANALYZE (seq scans, sorts, rows read). ``fences``: the harness's
fence insert (:func:`jobfence.core.fence.claim_tx`, one short transaction each, 4 writers) on an
empty table and on the big one, the durable drain rate of an in-process worker on each, then
:func:`jobfence.runtime.cleanup.cleanup_fences` of the expired 90 % of a small and of the big table
(rows/s, longest batch).

The seeding (:func:`seed_fences`, :func:`seed_letters`: one INSERT … SELECT generate_series
each) is shared with bench/deadletters.py and bench/gauges.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent

# -- seeding (shared with bench/deadletters.py and bench/gauges.py) ---------------------------

FENCES_SQL = """
INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at)
SELECT (ARRAY['orders', 'invoices', 'emails', 'webhooks'])[1 + g %% 4], md5(%(tag)s || g),
       e - interval '7 days', e
FROM (
    SELECT g, CASE WHEN g <= %(expired)s
                   THEN now() - interval '30 days' + interval '7 days' * g / %(expired)s
                   ELSE now() + interval '7 days' * (g - %(expired)s) / (%(n)s - %(expired)s + 1)
              END AS e
    FROM generate_series(1, %(n)s) AS g
) AS s
"""
#: the day partitions the seed's rows expire on (a day around each end): every row lands in
#: its day, as the maintenance loop's days would hold them (an empty table gets the days of
#: the live week too: a fresh deployment's layout)
FENCE_DAYS_SQL = """
SELECT core.fence_partitions_add((now() - interval '31 days')::date,
                                 (now() - interval '22 days')::date)
     + core.fence_partitions_add((now() - interval '1 day')::date,
                                 (now() + interval '8 days')::date)
"""


#: from this many rows, the indexes are dropped and built again after the INSERT (by a sort,
#: ~10× faster than 10 000 000 inserts at random places of a key larger than shared_buffers)
REBUILD_FROM = 1_000_000
FENCE_INDEXES = [
    ("DROP INDEX core.processed_jobs_key_idx",
     "CREATE INDEX processed_jobs_key_idx ON core.processed_jobs (job_id, consumer)"),
]  # fmt: skip


def seed_fences(conn: psycopg.Connection[Any], n: int, *, expired: int = 0, tag: str = "") -> None:
    """``n`` fence rows over 4 consumers, job_ids spread like UUIDs (md5), in one INSERT into
    their day partitions (created first): the first ``expired`` expired evenly over the week
    from 30 to 23 days ago, the rest live, expiring evenly over the next 7 days (each
    processed 7 days before it expires: a week of a steady rate). ``tag`` makes the job_ids of
    another call differ. From :data:`REBUILD_FROM` rows the key index (the same definition as
    the schema's) is built after the rows are in."""
    rebuild = n >= REBUILD_FROM
    conn.execute(FENCE_DAYS_SQL)  # type: ignore[arg-type]
    if rebuild:
        conn.execute("SET maintenance_work_mem = '512MB'")
        for drop, _ in FENCE_INDEXES:
            conn.execute(drop)  # type: ignore[arg-type]
    conn.execute(FENCES_SQL, {"n": n, "expired": expired, "tag": tag})  # type: ignore[arg-type]
    if rebuild:
        for _, create in FENCE_INDEXES:
            conn.execute(create)  # type: ignore[arg-type]


#: one day partition's share of the live week, inserted straight into the partition (no tuple
#: routing; the key index built after): ``g`` over the whole seed, only the rows of the day kept
DAY_FENCES_SQL = """
INSERT INTO core.{part} (consumer, job_id, processed_at, expires_at)
SELECT (ARRAY['orders', 'invoices', 'emails', 'webhooks'])[1 + g %% 4], md5(%(tag)s || g),
       e - interval '7 days', e
FROM (SELECT g, %(t0)s::timestamptz + interval '7 days' * g / (%(n)s + 1) AS e
      FROM generate_series(%(g_lo)s::bigint, %(g_hi)s::bigint) AS g) AS s
WHERE e >= %(lo)s AND e < %(hi)s
"""
#: bytes of disk a fence takes with its share of the key index (docs/benchmarks.md: 171 B
#: measured), with room for the WAL and the index build's sort
FENCE_DISK = 400


def fences_the_disk_allows(conn: psycopg.Connection[Any], wanted: int) -> int:
    """``wanted``, or fewer: as many fences as the free space of the database's disk holds
    (:data:`FENCE_DISK` bytes each), leaving 10 GB free."""
    import shutil

    row = conn.execute("SHOW data_directory").fetchone()
    free = shutil.disk_usage(row[0]).free if row else 0
    return max(0, min(wanted, (free - 10 * 2**30) // FENCE_DISK))


def seed_live_fences_by_day(url: str, n: int, *, workers: int = 2) -> None:
    """``n`` live fences expiring evenly over the next 7 days, each day's rows inserted
    straight into its partition by ``workers`` connections at once (the days created first),
    then the key index built on all of them by one sort each."""
    from concurrent.futures import ThreadPoolExecutor

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FENCE_DAYS_SQL)  # type: ignore[arg-type]
        for drop, _ in FENCE_INDEXES:
            conn.execute(drop)  # type: ignore[arg-type]
        t0 = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        parts = conn.execute(
            "SELECT name, lower_bound, upper_bound FROM core.fence_partitions() "
            "WHERE NOT is_default AND upper_bound > %s AND lower_bound <= %s "
            "ORDER BY lower_bound",
            (t0, t0 + timedelta(days=7)),
        ).fetchall()
    week = timedelta(days=7).total_seconds()

    def one(part: tuple[str, datetime, datetime]) -> None:
        name, lo, hi = part
        g_lo = max(1, math.floor((lo - t0).total_seconds() / week * (n + 1)) - 1)
        g_hi = min(n, math.ceil((hi - t0).total_seconds() / week * (n + 1)) + 1)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(
                DAY_FENCES_SQL.format(part=name),  # type: ignore[arg-type]
                {"tag": "", "t0": t0, "n": n, "g_lo": g_lo, "g_hi": g_hi, "lo": lo, "hi": hi},
            )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, parts))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for _, create in FENCE_INDEXES:
            conn.execute(create)  # type: ignore[arg-type]
        conn.execute("ANALYZE core.processed_jobs")


#: queues by share (per mille) of the letters: one common, one rare
QUEUES = [("orders", 400), ("invoices", 200), ("emails", 150), ("webhooks", 100),
          ("credits", 80), ("exports", 50), ("sync", 19), ("audit", 1)]  # fmt: skip
COMMON_QUEUE, RARE_QUEUE = "orders", "audit"
COMMON_ERROR, RARE_ERROR = "503", "VAT number"  # ~30 % and 0.1 % of the letters
SPAN_DAYS, PENDING_DAYS = 90, 7

LETTERS_SQL = f"""
INSERT INTO core.dead_letters (queue, consumer, job_id, payload, payload_size, attempts,
    error_category, error_code, last_error, status, enqueued_at, failed_at, reviewed_at,
    reviewed_by, review_reason)
SELECT q, q, 'job-' || g, p, octet_length(p), 1 + g %% 6, c, e_code, e,
       st, f - interval '10 minutes', f,
       CASE WHEN st <> 'pending_review' THEN f + interval '1 day' END,
       CASE WHEN st <> 'pending_review' THEN 'ops-bench' END,
       CASE WHEN st = 'discarded' THEN 'order cancelled, ticket OPS-' || g END
FROM (
    SELECT g, p, f,
           CASE {
    " ".join(
        f"WHEN b < {sum(s for _, s in QUEUES[: i + 1])} THEN '{q}'"
        for i, (q, _) in enumerate(QUEUES)
    )
} END AS q,
           (ARRAY['TEMPORARY_ERROR', 'INTEGRATION_ERROR', 'VALIDATION_ERROR',
                  'TECHNICAL_ERROR'])[1 + g %% 4] AS c,
           CASE WHEN e < 300 THEN 'PartnerError'
                WHEN e < 600 THEN 'TimeoutError'
                WHEN e < 999 THEN 'ValidationError' ELSE 'ErpRejected' END AS e_code,
           CASE WHEN e < 300 THEN 'TemporaryError: partner API answered 503 (order o-' || g || ')'
                WHEN e < 600 THEN 'TimeoutError: ERP timed out after 30 s (try ' || g %% 6 || ')'
                WHEN e < 999 THEN 'ValidationError: field amount must be positive, got -' || g
                ELSE 'ERP rejected the invoice: VAT number unknown (inv-' || g || ')' END AS e,
           CASE WHEN f > now() - interval '{PENDING_DAYS} days' OR g %% 100 = 0
                THEN 'pending_review'
                WHEN g %% 10 = 0 THEN 'discarded' ELSE 'replayed' END AS st
    FROM (
        SELECT g, (g * 7919) %% 1000 AS b, (g * 31) %% 1000 AS e,
               now() - (%(n)s - g) * (interval '{SPAN_DAYS} days' / %(n)s) AS f,
               convert_to('{{"order_id": "o-' || g || '", "amount": 12.5}}', 'UTF8') AS p
        FROM generate_series(1, %(n)s::bigint) AS g
    ) AS base
) AS s
ORDER BY g
"""


def seed_letters(conn: psycopg.Connection[Any], n: int) -> None:
    """``n`` dead letters in one INSERT, failed over the last 90 days (ids in that order): 8
    queues from 40 % to 0.1 %, 4 categories, 4 errors (one in 1 000 rare), pending review
    the last week's plus 1 % of the older ones, the rest replayed (90 %) or discarded."""
    conn.execute(LETTERS_SQL, {"n": n})  # type: ignore[arg-type]


def seeded(url: str, seed: Callable[[psycopg.Connection[Any]], None]) -> float:
    """Run ``seed`` on ``url``, then VACUUM ANALYZE (a table autovacuum has seen); seconds."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        seed(conn)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


# -- the suite's side (bench/.venv-peers) -----------------------------------------------------


def _child(kind: str, *args: str) -> dict[str, Any]:
    from measure import fresh_database, python_for, run_json

    with fresh_database() as small, fresh_database() as big:
        cmd = [python_for("jobfence"), str(HERE / "growth_tables.py"), kind, small, big, *args]
        return run_json(cmd, timeout=3600)


def letters_workload(args: argparse.Namespace, results: Any, step: Callable[[str], None]) -> None:
    """Dead letters at 1 000 000 (× scale) vs 1 000: p50/p99 of each listing and search."""
    small, big = 1000, max(20_000, int(1_000_000 * args.scale))
    started = time.perf_counter()
    out = _child("letters", "--small", str(small), "--big", str(big), "--rounds", str(args.repeat))
    for name, sizes in out["queries"].items():
        for n, label in ((small, "small"), (big, "big")):
            for stat in ("p50", "p99"):
                row = results.row(
                    f"dead letters: first page {stat}",
                    f"{name} · {n:,} letters",
                    "ms",
                    higher_is_better=False,
                    baseline=None if label == "small" else f"{name} · {small:,} letters",
                )
                row.values.extend(sizes[label][stat])
                if stat == "p50" and label == "big" and sizes[label].get("plan"):
                    row.note = sizes[label]["plan"]
    for n, label in ((small, "small"), (big, "big")):
        cli = out["cli"][label]
        results.row(
            "dead letters: CLI process",
            f"jobfence dead-letters list · {n:,} letters",
            "ms",
            higher_is_better=False,
            baseline=None
            if label == "small"
            else f"jobfence dead-letters list · {small:,} letters",
        ).values.append(cli)
    worst = max(
        out["queries"].items(),
        key=lambda kv: (
            statistics.median(kv[1]["big"]["p50"]) / statistics.median(kv[1]["small"]["p50"])
        ),
    )
    step(
        f"letters: {small:,} vs {big:,} seeded in {out['seed_s']['big']:.0f}s; "
        f"worst p50 ratio {worst[0]}; {time.perf_counter() - started:.0f}s in all"
    )


def fences_workload(args: argparse.Namespace, results: Any, step: Callable[[str], None]) -> None:
    """Fences at 10 000 000 (× scale) vs an empty table: insert latency, drain, cleanup."""
    big = max(100_000, int(10_000_000 * args.scale))
    started = time.perf_counter()
    out = _child(
        "fences", "--big", str(big), "--rounds", str(args.repeat),
        "--drain", str(max(2000, int(20_000 * args.scale))),
    )  # fmt: skip
    empty, full = "empty table", f"{big:,} live + {big:,} expired"
    for key, title in (("p50", "fence insert p50"), ("p99", "fence insert p99")):
        for label in (empty, full):
            results.row(
                title,
                label,
                "ms",
                higher_is_better=False,
                baseline=None if label == empty else empty,
            ).values.extend(out["insert"][label][key])
    for label in (empty, full):
        row = results.row(
            "fence table: durable drain",
            label,
            "jobs/s",
            baseline=None if label == empty else empty,
        )
        row.values.extend(out["drain"][label])
        row.note = f"{out['drain_jobs']:,} jobs"
    for size in ("small", "big"):
        c = out["cleanup"][size]
        total = out["small_rows"] if size == "small" else 2 * big
        row = results.row(
            "fence cleanup",
            f"{c['rows']:,} of {total:,} expired",
            "ms",
            higher_is_better=False,
        )
        row.values.append(c["seconds"] * 1000)
        row.note = (
            f"{c['days']} days dropped, {c['batches']} batches of the default partition, "
            f"the fence table held at most {c['longest_ms']:.0f} ms (detach, batches); "
            f"the detached days' drop (their files removed) {c['dropping_ms']:.0f} ms"
        )
        held = results.row(
            "fence cleanup: fence table held",
            f"{c['rows']:,} of {total:,} expired",
            "ms",
            higher_is_better=False,
        )
        held.values.append(c["longest_ms"])
        held.note = "the longest transaction holding a lock a fence insert waits for"
    huge = int(args.fences_huge * args.scale)
    if huge > big:
        fences_huge(args, results, step, huge)
    step(
        f"fences: {2 * big:,} rows seeded in {out['seed_s']:.0f}s; cleanup of "
        f"{out['cleanup']['big']['rows']:,} in {out['cleanup']['big']['seconds']:.2f} s; "
        f"{time.perf_counter() - started:.0f}s in all"
    )


def fences_huge(
    args: argparse.Namespace, results: Any, step: Callable[[str], None], huge: int
) -> None:
    """Fences at 100 000 000 (``--fences-huge``, × scale) live, or as many as the disk holds,
    against an empty table: the insert latency only (seeded straight into the days)."""
    started = time.perf_counter()
    out = _child("fences", "--big", str(huge), "--rounds", str(args.repeat), "--insert-only")
    empty, full = out["labels"]["small"], out["labels"]["big"]
    for key, title in (("p50", "fence insert p50"), ("p99", "fence insert p99")):
        for label in (empty, full):
            row = results.row(
                title,
                label,
                "ms",
                higher_is_better=False,
                baseline=None if label == empty else empty,
            )
            row.values.extend(out["insert"][label][key])
            if label == full:
                gb = out["sizes"]["bytes"] / 2**30
                row.note = (
                    f"{out['sizes']['fences']:,} fences, {gb:.1f} GB, "
                    f"{out['sizes']['partitions']} partitions"
                    + (f"; the disk held no more of {out['wanted']:,}" if out["wanted"] > huge
                       else "")
                )  # fmt: skip
    step(
        f"fences: {out['sizes']['fences']:,} live seeded in {out['seed_s']:.0f}s, "
        f"{time.perf_counter() - started:.0f}s in all"
    )


def growth_targets(results: Any, verdict: Callable[[bool], str]) -> list[tuple[str, str, str]]:
    """The targets of the table workloads: (target, measured, verdict)."""
    out: list[tuple[str, str, str]] = []

    def ratio(workload: str, big_prefix: str) -> tuple[float, str] | None:
        for (w, label), r in results.rows.items():
            if w == workload and label.startswith(big_prefix) and r.baseline:
                base = results.get(w, r.baseline)
                if base is not None and base.values and r.values:
                    return r.median / base.median, label
        return None

    for name, stat, limit, unit in LETTER_TARGETS:
        got = ratio(f"dead letters: first page {stat}", f"{name} · ")
        if got is None:
            continue
        big = results.get(f"dead letters: first page {stat}", got[1])
        n = got[1].split(" · ")[1]
        if unit == "×":
            # below a millisecond the machine's scheduling decides: within NOISE_MS is met too
            base = results.get(f"dead letters: first page {stat}", big.baseline)
            more = big.median - base.median
            target = (
                f"letters: {name}, {stat} at {n} ≤ {limit:g}× 1 000 letters "
                f"(or ≤ {NOISE_MS:g} ms more)"
            )
            ok = got[0] <= limit or more <= NOISE_MS
            out.append((target, f"{got[0]:.2f}× ({more:+.1f} ms)", verdict(ok)))
        elif unit == "ms":
            target = f"letters: {name}, {stat} at {n} ≤ {limit:g} ms"
            out.append((target, f"{big.median:.1f} ms", verdict(big.median <= limit)))
        else:
            out.append((f"letters: {name}, {stat} at {n} ÷ 1 000 letters", f"{got[0]:.2f}×", unit))
    for workload, big_label, limit, higher in (
        ("fence insert p50", "live", 1.2, False),
        ("fence insert p99", "live", 1.5, False),
        ("fence table: durable drain", "live", 0.8, True),
    ):
        rows = [r for (w, _), r in results.rows.items() if w == workload and r.baseline]
        for row in rows:  # 10M live + 10M expired, and 100M live (--fences-huge)
            if big_label not in row.label:
                continue
            base = results.get(workload, row.baseline)
            if base and base.values and row.values:
                x = row.median / base.median
                sign = "≥" if higher else "≤"
                ok = x >= limit if higher else x <= limit
                target = f"{workload}: {row.label} {sign} {limit:g}× the small case"
                out.append((target, f"{x:.2f}×", verdict(ok)))
    fence_rows = [r for (w, _), r in results.rows.items() if w == "fence insert p50" and r.baseline]
    if len(fence_rows) == 1:  # issue 27 asks for both: 10M (× scale) and 100M (--fences-huge)
        for stat, limit in (("p50", 1.2), ("p99", 1.5)):
            target = f"fence insert {stat}: 100M live (--fences-huge) ≤ {limit:g}× the small case"
            out.append((target, "—", "not measured in this run (--fences-huge × --scale ≤ 10M)"))
    cleanups = [r for (w, _), r in results.rows.items() if w == "fence cleanup" and r.values]
    if cleanups:  # the target is for the big table's (10M); the small one is shown only
        r = max(cleanups, key=lambda c: int(c.label.split(" of ")[0].replace(",", "")))
        target = f"fence cleanup: {r.label} < 1 s of database time"
        out.append((target, f"{r.median / 1000:.2f} s", verdict(r.median < 1000)))
    return out


#: (listing, statistic, limit, unit): "×" the 1 000-letter case in the same run, "ms" at 1M,
#: anything else a ratio shown for information with that word (docs/benchmarks.md, Method)
NOISE_MS = 1.0
LETTER_TARGETS: list[tuple[str, str, float, str]] = [
    ("list pending (CLI default)", "p99", 2.0, "×"),
    ("API: no filter", "p99", 2.0, "×"),
    *[
        (name, "p50", 1.5, "×")
        for name in (
            "list pending (CLI default)",
            "list, any status",
            "queue, common",
            "queue, rare",
            "category",
            "job_id",
            "error text, common",
            "queue + pending",
            "API: no filter",
            "API: queue + pending",
        )
    ],
    ("error text, rare", "p50", 250.0, "ms"),
    # a window's page is the newest 50 by id among the window's letters: no B-tree orders by
    # id and bounds failed_at, so the least a plan reads is the window's index entries (one
    # day at 1M over 90 days: ~11 000, ~1 ms of index-only scan); 5 ms leaves the margin
    ("failed in one day a week ago", "p50", 5.0, "ms"),
    ("failed in one day 60 days ago", "p50", 5.0, "ms"),
]


# -- the child (the project's interpreter, jobfence importable) -------------------------------


def pct(values: list[float], q: float) -> float:
    """The nearest-rank percentile (p99 of 100 calls: the second slowest, not the slowest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def ordered(sizes: dict[str, Any], r: int) -> list[tuple[str, Any]]:
    """The small and the big case, small first in even rounds and big first in odd ones."""
    items = list(sizes.items())
    return items if r % 2 == 0 else items[::-1]


async def timed_calls(call: Callable[[], Awaitable[Any]], calls: int, budget: float) -> list[float]:
    """Up to ``calls`` timings (ms) of ``call``, stopping after ``budget`` seconds."""
    await call()  # warm: plans, caches
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < calls and time.perf_counter() < deadline:
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def letter_queries(now: datetime) -> dict[str, tuple[dict[str, Any], str]]:
    """Each search: (Filter keyword arguments, the same criterion in SQL for the check)."""
    week, day = now - timedelta(days=8), timedelta(days=1)
    old = now - timedelta(days=61)
    return {
        "list, any status": ({}, "true"),
        "queue, common": ({"queue": COMMON_QUEUE}, f"queue = '{COMMON_QUEUE}'"),
        "queue, rare": ({"queue": RARE_QUEUE}, f"queue = '{RARE_QUEUE}'"),
        "category": ({"category": "VALIDATION_ERROR"}, "error_category = 'VALIDATION_ERROR'"),
        "job_id": ({"job_id": "job-500"}, "job_id = 'job-500'"),
        "error text, common": ({"error": COMMON_ERROR}, f"last_error ILIKE '%{COMMON_ERROR}%'"),
        "error text, rare": ({"error": RARE_ERROR}, f"last_error ILIKE '%{RARE_ERROR}%'"),
        "failed in one day a week ago": (
            {"since": week, "until": week + day},
            f"failed_at >= '{week.isoformat()}' AND failed_at < '{(week + day).isoformat()}'",
        ),
        "failed in one day 60 days ago": (
            {"since": old, "until": old + day},
            f"failed_at >= '{old.isoformat()}' AND failed_at < '{(old + day).isoformat()}'",
        ),
        "queue + pending": (
            {"queue": COMMON_QUEUE, "status": "pending_review"},
            f"queue = '{COMMON_QUEUE}' AND status = 'pending_review'",
        ),
    }


def plan_summary(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    """The plan's nodes (scan kinds, sorts) and the rows its scans read, from EXPLAIN ANALYZE."""
    row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    nodes: list[str] = []
    read = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal read
        kind = node["Node Type"]
        if "Index Name" in node:
            kind += f" {node['Index Name']}"
        if kind != "Limit":
            nodes.append(kind)
        if "Scan" in node["Node Type"] and node["Node Type"] != "CTE Scan":
            per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            read += round(per_loop * node.get("Actual Loops", 1))  # parallel workers: loops
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return f"{' > '.join(nodes)}, {read:,} rows read"


async def letters_child(a: argparse.Namespace) -> dict[str, Any]:
    import httpx
    import uvicorn

    from jobfence import App
    from jobfence.http import tcp_listen_socket
    from jobfence.ops.app import create_app
    from jobfence.ops.auth import create_token
    from jobfence.review import deadletters as dl

    seed_s: dict[str, float] = {}
    apps: dict[str, App] = {}
    for label, url, n in (("small", a.small_url, a.small), ("big", a.big_url, a.big)):
        app = App(url, auto_migrate=True)
        await app.open()
        apps[label] = app
        seed_s[label] = seeded(url, lambda conn, n=n: seed_letters(conn, n))  # type: ignore[misc]
    now = datetime.now(UTC)
    queries = letter_queries(now)
    actor = dl.Actor("bench")
    calls: dict[str, Callable[[App], Callable[[], Awaitable[Any]]]] = {
        "list pending (CLI default)": lambda app: (
            lambda: dl.letters(app.db, status="pending_review")
        ),
    }
    for name, (kw, _) in queries.items():
        calls[name] = lambda app, kw=kw: lambda: dl.search(app.db, dl.Filter(**kw), actor=actor)  # type: ignore[misc]

    # the first page of each, against an independent query: ids, order, count
    check = {
        **{k: v[1] for k, v in queries.items()},
        "list pending (CLI default)": "status = 'pending_review'",
    }
    urls = {"small": a.small_url, "big": a.big_url}
    for label, app in apps.items():
        with psycopg.connect(urls[label]) as conn:
            for name, where in check.items():
                got = await calls[name](app)()
                ids = [x.id for x in (got if isinstance(got, list) else got.items)]
                sql = f"SELECT id FROM core.dead_letters WHERE {where} ORDER BY id DESC LIMIT 50"
                want = [r[0] for r in conn.execute(sql)]  # type: ignore[call-overload]
                if ids != want:
                    raise SystemExit(f"{label} {name}: first page {ids[:5]}… ≠ {want[:5]}…")

    # the ops API, served by uvicorn on a loopback socket, one viewer token per database
    servers: dict[str, tuple[uvicorn.Server, asyncio.Task[None], str, str]] = {}
    for label, app in apps.items():
        token = await create_token(app.db, name=f"bench-{uuid.uuid4().hex[:6]}", role="viewer")
        sock = tcp_listen_socket()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(jobfence_app=app, console=False), log_level="warning", lifespan="on"
            )
        )
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        servers[label] = (server, task, f"http://127.0.0.1:{sock.getsockname()[1]}", token)
    api = {
        "API: no filter": {},
        "API: queue + pending": {"queue": COMMON_QUEUE, "status": "pending_review"},
        "API: error text, rare": {"error": RARE_ERROR},
    }
    out: dict[str, dict[str, dict[str, Any]]] = {}
    async with httpx.AsyncClient() as client:

        def get(label: str, params: dict[str, str]) -> Callable[[], Awaitable[Any]]:
            _, _, base, token = servers[label]

            async def call() -> None:
                r = await client.get(f"{base}/v1/dead-letters", params=params,
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
                r.raise_for_status()
                assert len(r.json()["items"]) <= 50

            return call

        for label in apps:
            items = (
                await client.get(
                    f"{servers[label][2]}/v1/dead-letters",
                    headers={"Authorization": f"Bearer {servers[label][3]}"},
                )
            ).json()["items"]
            page = await dl.search(apps[label].db, dl.Filter(), actor=actor)
            if [x["id"] for x in items] != [x.id for x in page.items]:
                raise SystemExit(f"{label}: the API's first page differs from search()")
        for r in range(a.rounds):  # interleaved, the order alternating from round to round
            for name in [*calls, *api]:
                for label, app in ordered(apps, r):
                    call = calls[name](app) if name in calls else get(label, api[name])
                    times = await timed_calls(call, a.calls, a.budget)
                    data = out.setdefault(name, {}).setdefault(
                        label, {"p50": [], "p99": [], "calls": 0}
                    )
                    data["p50"].append(pct(times, 0.5))
                    data["p99"].append(pct(times, 0.99))
                    data["calls"] += len(times)
    for server, task, _, _ in servers.values():
        server.should_exit = True
        await task
    # the big database's plans (custom plans: the parameters as given)
    with psycopg.connect(a.big_url) as conn:
        for name, (kw, _) in {
            "list pending (CLI default)": ({"status": "pending_review"}, ""),
            **queries,
        }.items():
            flt = dl.Filter(**kw).check()
            params = {**flt.params(apps["big"].db, None), "before": None, "limit": 50}
            sql = apps["big"].db.sql[flt.search_query("postgresql")]  # type: ignore[attr-defined]
            out[name]["big"]["plan"] = plan_summary(conn, sql, params)
    cli: dict[str, float] = {}
    for label, url in (("small", a.small_url), ("big", a.big_url)):
        exe = str(Path(sys.executable).with_name("jobfence"))
        started = time.perf_counter()
        await asyncio.to_thread(
            subprocess.run,
            [exe, "dead-letters", "list", "--database-url", url, "--json"],
            check=True,
            capture_output=True,
        )
        cli[label] = (time.perf_counter() - started) * 1000
    for app in apps.values():
        await app.close()
    return {"seed_s": seed_s, "queries": out, "cli": cli}


async def fences_child(a: argparse.Namespace) -> dict[str, Any]:
    from deadletters import Phase, fencer
    from jobfence import App, Job, Observer, Tx
    from jobfence.runtime.cleanup import cleanup_fences
    from jobfence.runtime.maintenance import Maintenance

    class Count(Observer):
        def __init__(self) -> None:
            self.n = 0

        def job_processed(self, job: Job[Any], duration: float) -> None:
            self.n += 1

    labels = {"small": "empty table", "big": f"{a.big:,} live + {a.big:,} expired"}
    apps: dict[str, tuple[App, Count]] = {}
    for size, url in (("small", a.small_url), ("big", a.big_url)):
        counter = Count()
        app = App(url, auto_migrate=True, observers=[counter],
                  maintenance=Maintenance(cleanup=False, alerts=False))  # fmt: skip

        @app.consumer("work")
        async def handle(job: Job[Any], tx: Tx) -> None:
            await tx.execute("INSERT INTO effects (job_id) VALUES (%s)", (job.job_id,))

        await app.open()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
            conn.execute(FENCE_DAYS_SQL)  # type: ignore[arg-type]
        apps[size] = (app, counter)
    wanted = a.big
    if a.insert_only:  # a.big live fences, straight into their days, as many as the disk holds
        with psycopg.connect(a.big_url) as conn:
            a.big = fences_the_disk_allows(conn, a.big)
        labels["big"] = f"{a.big:,} live"
        labels["small"] = "empty table (interleaved with the live-only table)"
        started = time.perf_counter()
        seed_live_fences_by_day(a.big_url, a.big)
        seed_s = time.perf_counter() - started
    else:  # a.big live fences (a week of them) and as many expired ones (the week before last)
        expired = a.big
        seed_s = seeded(a.big_url, lambda conn: seed_fences(conn, a.big + expired, expired=expired))
    sizes = {}
    with psycopg.connect(a.big_url) as conn:
        for key, sql in (
            ("fences", "SELECT count(*) FROM core.processed_jobs"),
            ("bytes", "SELECT sum(pg_total_relation_size(relid)) FROM "
                      "pg_partition_tree('core.processed_jobs')"),
            ("partitions", "SELECT count(*) FROM core.fence_partitions()"),
        ):  # fmt: skip
            sizes[key] = int(conn.execute(sql).fetchone()[0])  # type: ignore[index, call-overload]
    insert: dict[str, dict[str, list[float]]] = {v: {"p50": [], "p99": []} for v in labels.values()}
    drain: dict[str, list[float]] = {v: [] for v in labels.values()}
    for r in range(a.rounds):  # interleaved, the order alternating from round to round
        for size, (app, _) in ordered(apps, r):
            phase, stop = Phase(), asyncio.Event()
            writers = [asyncio.create_task(fencer(app, phase, stop, f"r{r}-{k}")) for k in range(4)]
            await asyncio.sleep(a.seconds)
            stop.set()
            await asyncio.gather(*writers)
            insert[labels[size]]["p50"].append(phase.pct(0.5))
            insert[labels[size]]["p99"].append(phase.pct(0.99))
        for size, (app, counter) in ordered(apps, r) if not a.insert_only else []:
            await app.enqueue_many(
                [app.job("work", {}, job_id=str(uuid.uuid4())) for _ in range(a.drain)]
            )
            worker = app.worker()
            start_n, started = counter.n, time.perf_counter()
            running = asyncio.create_task(worker.run())
            while counter.n - start_n < a.drain:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            drain[labels[size]].append(a.drain / (time.perf_counter() - started))
            worker.request_stop()
            await running
    if a.insert_only:
        for app, _ in apps.values():
            await app.close()
        return {"seed_s": seed_s, "insert": insert, "sizes": sizes, "labels": labels,
                "wanted": wanted}  # fmt: skip
    # cleanup: the expired half of a small table, then of the big one (whole days dropped)
    small_rows = min(200_000, a.big // 5)
    seeded(
        a.small_url, lambda conn: seed_fences(conn, small_rows, expired=small_rows // 2, tag="s")
    )
    cleanup: dict[str, dict[str, Any]] = {}
    for size, (app, _) in apps.items():
        # a day dropped in production expired a week ago: its pages were written out long
        # since; here the seeding's are written out first, so that the drop does not wait
        # for the kernel's writeback of the rows just seeded
        with psycopg.connect(a.small_url if size == "small" else a.big_url) as conn:
            conn.execute("CHECKPOINT")
        res = await cleanup_fences(app.db, min_age=timedelta(minutes=18, seconds=30))
        with psycopg.connect(a.small_url if size == "small" else a.big_url) as conn:
            left = conn.execute(
                "SELECT count(*) FROM core.processed_jobs "
                "WHERE expires_at < now() - interval '22 days'"
            ).fetchone()
        cleanup[size] = {
            "rows": res.deleted,
            "days": res.days,
            "batches": res.batches,
            "seconds": res.seconds,
            "rows_per_s": res.deleted / res.seconds if res.seconds else 0.0,
            "longest_ms": res.longest_batch * 1000,
            "dropping_ms": res.dropping * 1000,
        }
        if left and left[0]:
            raise SystemExit(f"cleanup of the {size} table left {left[0]} expired fences")
    for app, _ in apps.values():
        await app.close()
    return {"seed_s": seed_s, "insert": insert, "drain": drain, "drain_jobs": a.drain,
            "cleanup": cleanup, "small_rows": small_rows, "sizes": sizes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["letters", "fences"])
    parser.add_argument("small_url")
    parser.add_argument("big_url")
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100, help="letters: timings per round")
    parser.add_argument("--budget", type=float, default=3.0, help="letters: seconds per round")
    parser.add_argument("--seconds", type=float, default=3.0, help="fences: insert phase")
    parser.add_argument("--drain", type=int, default=20_000, help="fences: jobs per drain")
    parser.add_argument(
        "--insert-only", action="store_true", help="fences: --big live fences, insert only"
    )
    a = parser.parse_args()
    sys.path.insert(0, str(HERE))
    out = asyncio.run(letters_child(a) if a.kind == "letters" else fences_child(a))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
