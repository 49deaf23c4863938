"""What one fence row costs PostgreSQL, part by part (the `fence` workload of bench/run.py).

    .venv/bin/python bench/fence_parts.py [--rounds 5] [--transactions 2000]

pgbench (one client, prepared statements, ``synchronous_commit = off`` so that a commit's
flush wait is not counted: the fence shares its job's commit and adds none) runs
transactions of 50 fence rows, the group-commit batch of the defaults, in four variants,
interleaved round after round on one fresh database:

- ``fence``: the rows as the worker writes them, in a transaction lent to a handler
  (``core.fence_begin`` … ``core.fence_commit``): heap tuple, primary key entry,
  ``expires_at`` index entry, and the deferred guard trigger's event (SPEC H5);
- ``no guard``: the same, with the lent transaction's name hidden while the rows go in, so
  the guard trigger queues nothing (two more cheap statements per 50 rows);
- ``no expires index``: into a copy of the table that has only its primary key;
- ``base``: the same transaction (names, 50 random uuids sorted) writing nothing.

The server CPU of the backend (from /proc, as bench/measure.py's ServerCPU) per row, minus
the base's, is each variant's cost per fence row; the parts are the differences. CPU time
of one backend doing one thing at a time is what moves least when the machine is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run with the project's virtualenv; re-runs itself with the peers'
    from run import _bootstrap

    _bootstrap(__file__)

import psycopg
from measure import BenchError, ServerCPU, command, fresh_database, median, run_json

ROWS = 50  # the defaults' group-commit batch

_ROWS = (
    "SELECT 'bench', gen_random_uuid()::text, now() + interval '7 days' "
    f"FROM generate_series(1, {ROWS}) ORDER BY 2"
)
SCRIPTS = {
    "fence": (
        "BEGIN;\nSELECT core.fence_begin('bench');\n"
        f"INSERT INTO core.processed_jobs (consumer, job_id, expires_at) {_ROWS} "
        "ON CONFLICT DO NOTHING;\nSELECT core.fence_commit('bench');\nCOMMIT;\n"
    ),
    "no guard": (  # the same named transaction, its name hidden while the rows go in
        "BEGIN;\nSELECT core.fence_begin('bench');\nSELECT set_config('jobfence.tx', '', true);\n"
        f"INSERT INTO core.processed_jobs (consumer, job_id, expires_at) {_ROWS} "
        "ON CONFLICT DO NOTHING;\nSELECT set_config('jobfence.tx', 'bench', true);\n"
        "SELECT core.fence_commit('bench');\nCOMMIT;\n"
    ),
    "no expires index": (
        f"BEGIN;\nINSERT INTO bench_fences_pk_only (consumer, job_id, expires_at) {_ROWS} "
        "ON CONFLICT DO NOTHING;\nCOMMIT;\n"
    ),
    "base": (
        "BEGIN;\nSELECT core.fence_begin('bench');\n"
        f"SELECT count(*) FROM ({_ROWS}) AS r;\nSELECT core.fence_commit('bench');\nCOMMIT;\n"
    ),
}
PK_ONLY = (
    "CREATE TABLE bench_fences_pk_only (LIKE core.processed_jobs INCLUDING DEFAULTS "
    "INCLUDING CONSTRAINTS); ALTER TABLE bench_fences_pk_only ADD PRIMARY KEY (consumer, job_id)"
)


def _server_cpu_us_per_row(url: str, script: Path, transactions: int) -> float:
    name = url.rsplit("/", 1)[1]
    server = ServerCPU(url)
    try:
        proc = subprocess.Popen(
            ["pgbench", "-n", "-M", "prepared", "-c", "1", "-t", str(transactions),
             "-f", str(script), "-h", "127.0.0.1", "-U", "postgres", name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PGOPTIONS": "-c synchronous_commit=off", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        server.start()
        while proc.poll() is None:
            server.sample()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
        out, err = proc.communicate()
        if proc.returncode != 0 or not re.search(r"tps = ", out):
            raise BenchError(f"pgbench failed:\n{err[-2000:]}\n{out[-2000:]}")
        return server.spent() / (transactions * ROWS) * 1e6
    finally:
        server.close()


def fence_parts(rounds: int = 5, transactions: int = 2000) -> dict[str, float]:
    """Median server CPU µs per fence row of each variant, less the base's; and the parts:
    ``guard trigger``, ``expires index``, ``heap + primary key``."""
    samples: dict[str, list[float]] = {k: [] for k in SCRIPTS}
    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        run_json(command("jobfence", "setup", url))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(PK_ONLY)
        paths = {}
        for k, text in SCRIPTS.items():
            paths[k] = Path(tmp) / f"{k.replace(' ', '_')}.sql"
            paths[k].write_text(text)
        _server_cpu_us_per_row(url, paths["fence"], transactions // 4)  # warm-up
        for _ in range(rounds):
            for k, path in paths.items():
                samples[k].append(_server_cpu_us_per_row(url, path, transactions))
    m = {k: median(v) for k, v in samples.items()}
    return {
        "fence row": m["fence"] - m["base"],
        "guard trigger": m["fence"] - m["no guard"],
        "expires index": m["no guard"] - m["no expires index"],
        "heap + primary key": m["no expires index"] - m["base"],
        "base (per row of the batch)": m["base"],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transactions", type=int, default=2000)
    a = parser.parse_args()
    for part, us in fence_parts(a.rounds, a.transactions).items():
        print(f"{part:32} {us:7.1f} µs server CPU per row")
