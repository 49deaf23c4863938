"""What tracing costs: the durable workload with OpenTelemetry absent, present without an SDK,
and on with the SDK (a span processor whose exporter drops everything), in the same run.

    python bench/tracing.py [--jobs 5000] [--concurrency 8] [--batch-size 1] [--repeat 3]

Each run is a subprocess on a fresh PostgreSQL database: N jobs enqueued in bulk (inside a
``send`` span when tracing), then one in-process worker drains them; every job's effect is
one INSERT committed with its fence. The three modes:

- **absent**: ``opentelemetry`` cannot be imported (an import hook raises
  ModuleNotFoundError for it, exactly what Python raises when the package is not
  installed), so ``jobfence.tracing.AVAILABLE`` is False and nothing traces;
- **API, no SDK**: the ``otel`` extra installed, no tracer provider configured (the API's
  no-op spans; the trace context is still read and written);
- **SDK, dropping exporter**: ``TracerProvider`` with a ``BatchSpanProcessor`` over an
  exporter that discards the spans (every span is built, recorded and handed over).

Modes are interleaved run by run so that drift on a shared machine hits them alike; the table
shows medians of ``--repeat`` runs with their spread, jobs/s and the worker process's CPU
seconds per 1 000 jobs (all threads: the SDK's export thread included), as ratios against
"absent", and the CPU microseconds per job of the tracing calls alone (a send span and a
process span per job, 20 000 times, no database: free of the round trips' noise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MODES = {
    "absent": "absent (not installed)",
    "api": "API, no SDK",
    "sdk": "SDK, dropping exporter",
}

BLOCK = """
import sys
class _NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoOpenTelemetry())
"""


def _url(name: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + name


def _sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


async def child(mode: str, jobs: int, concurrency: int, batch_size: int) -> dict[str, Any]:
    """One run in this process (the mode's import state is already set up)."""
    import psycopg

    from jobfence import App, Job, Observer, Tx
    from jobfence import tracing as jobfence_tracing

    if mode == "sdk":
        _sdk()
    if (mode == "absent") == jobfence_tracing.AVAILABLE:
        raise RuntimeError(f"mode {mode}: tracing available is {jobfence_tracing.AVAILABLE}")

    class Counter(Observer):
        def __init__(self) -> None:
            self.left = jobs
            self.done = asyncio.Event()

        def job_processed(self, job: Job[Any], duration: float) -> None:
            self.left -= 1
            if self.left == 0:
                self.done.set()

    name = f"jf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        counter = Counter()
        app = App(_url(name), auto_migrate=True, observers=[counter])

        @app.consumer("bench")
        async def effect(job: Job[Any], tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
            )

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id text NOT NULL, amount int NOT NULL)")
            batch = [app.job("bench", {"n": i}, job_id=f"job-{i}") for i in range(jobs)]
            for start in range(0, jobs, 1000):
                await app.enqueue_many(batch[start : start + 1000])
            traced = await _traced_jobs(app)
            worker = app.worker(concurrency=concurrency, poll_interval=0.2, batch_size=batch_size)
            cpu0, t0 = time.process_time(), time.perf_counter()
            task = asyncio.create_task(worker.run())
            await counter.done.wait()
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                row = await tx.fetchone("SELECT count(*) FROM effects")
            if row is None or row[0] != jobs:
                raise RuntimeError(f"expected {jobs} effects, found {row}")
        return {
            "jobs_per_s": jobs / elapsed,
            "cpu_per_1000": cpu / jobs * 1000,
            "traced_jobs": traced,
            "micro_us": micro(),
            "bare_span_us": bare_span() if mode == "sdk" else 0.0,
        }
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def micro(n: int = 20_000) -> float:
    """CPU microseconds per job of what tracing adds to a job's path, without a database:
    the enqueue's ``send`` span and context, the delivery's ``process`` span and outcome
    (absent: the harness's one ``is None`` test). Isolates tracing from the noise of a
    shared machine's database round trips."""
    from jobfence import tracing as jobfence_tracing
    from jobfence.core.jobs import Delivery, OutgoingJob

    traces = jobfence_tracing.get()
    job = OutgoingJob("bench", "job-1", b"{}")
    delivery = Delivery(queue="bench", job_id="job-1", payload=b"{}", attempt=1)
    for warm_up in (True, False):  # the first span loads OpenTelemetry's context runtime
        started = time.process_time()
        for _ in range(100 if warm_up else n):
            _one_job(traces, job, delivery)
    return (time.process_time() - started) / n * 1e6


def bare_span(n: int = 20_000) -> float:
    """For scale: CPU microseconds of one empty SDK span with two attributes, here."""
    from opentelemetry import trace

    tracer = trace.get_tracer("bench")
    for warm_up in (True, False):
        started = time.process_time()
        for _ in range(100 if warm_up else n):
            with tracer.start_as_current_span("bare", attributes={"a": 1, "b": "c"}):
                pass
    return (time.process_time() - started) / n * 1e6


def _one_job(traces: Any, job: Any, delivery: Any) -> None:
    if traces is None:  # the harness's test
        return
    with traces.send([job], "postgresql") as sent:
        pass
    delivery.trace_context = sent[0].trace_context
    with traces.process(delivery, "postgresql", "bench") as span:
        traces.outcome(span, "processed")


async def _traced_jobs(app: Any) -> int:
    """Queued jobs carrying a trace context (the SDK mode's: all of them; else none)."""
    async with app.db.transaction() as tx:
        row = await tx.fetchone("SELECT count(trace_context) FROM core.jobs")
    return int(row[0]) if row else 0


def run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        __file__,
        "--child",
        mode,
        "--jobs",
        str(args.jobs),
        "--concurrency",
        str(args.concurrency),
        "--batch-size",
        str(args.batch_size),
    ]
    if mode == "absent":
        run = (
            f"import runpy; sys.argv = {argv!r}; runpy.run_path({__file__!r}, run_name='__main__')"
        )
        code = BLOCK + run
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, *argv]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{result.stderr}")
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def _spread(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}–{format(max(values), fmt)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1, help="group commit (1 = off)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(child(args.child, args.jobs, args.concurrency, args.batch_size))
        print(json.dumps(result))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_ in range(args.repeat):
        for mode in MODES:  # interleaved: drift on a shared machine hits every mode alike
            runs[mode].append(run_child(mode, args))
            last = runs[mode][-1]
            console.print(
                f"  round {round_ + 1} {mode}: {last['jobs_per_s']:,.0f} jobs/s, "
                f"{last['cpu_per_1000']:.3f} CPU s / 1000 jobs",
                style="dim",
            )
    base_rate = statistics.median(r["jobs_per_s"] for r in runs["absent"])
    base_cpu = statistics.median(r["cpu_per_1000"] for r in runs["absent"])
    table = Table(
        title=(
            f"tracing cost: durable workload, {args.jobs:,} jobs, PostgreSQL, concurrency "
            f"{args.concurrency}, batch {args.batch_size} (median of {args.repeat})"
        )
    )
    for column in (
        "OpenTelemetry",
        "jobs/s",
        "spread",
        "× absent",
        "worker CPU s / 1000 jobs",
        "spread",
        "× absent",
        "jobs with a trace context",
        "tracing alone, CPU µs / job",
    ):
        table.add_column(column, justify="right")
    for mode, label in MODES.items():
        rates = [r["jobs_per_s"] for r in runs[mode]]
        cpus = [r["cpu_per_1000"] for r in runs[mode]]
        table.add_row(
            label,
            f"{statistics.median(rates):,.0f}",
            _spread(rates, ",.0f"),
            f"{statistics.median(rates) / base_rate:.3f}",
            f"{statistics.median(cpus):.3f}",
            _spread(cpus, ".3f"),
            f"{statistics.median(cpus) / base_cpu:.3f}",
            f"{runs[mode][-1]['traced_jobs']:,}",
            f"{statistics.median(r['micro_us'] for r in runs[mode]):.1f}",
        )
    console.print(table)
    bare = statistics.median(r["bare_span_us"] for r in runs["sdk"])
    console.print(
        f"For scale: one empty SDK span with two attributes takes {bare:.1f} CPU µs on this "
        "machine now (tracing a job makes a send and a process span, with their attributes "
        "and the context's injection and extraction)."
    )
    load = os.getloadavg()
    console.print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} / {load[1]:.2f} (1 / 5 min) at the end: other work shares the machine"
    )


if __name__ == "__main__":
    main()
