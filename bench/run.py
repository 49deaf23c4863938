"""jobfence benchmark suite: jobfence against its Python peers on the same PostgreSQL.

    .venv/bin/python bench/run.py                   # everything, full sizes (~45 min)
    .venv/bin/python bench/run.py --quick           # smoke: sizes / 20, one run each
    .venv/bin/python bench/run.py --only durable,noop --repeat 5
    .venv/bin/python bench/run.py --list            # the workloads

Run it with the project's virtualenv (jobfence importable). It creates bench/.venv-peers from
bench/requirements-peers.txt (Procrastinate, PGQueuer, Celery, psutil, py-spy) — the peers are
never dependencies of jobfence — then re-runs itself there; jobfence's workers still run under
the project's interpreter. Every run uses a fresh database on $JOBFENCE_BENCH_PG (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped afterwards; Celery uses
$JOBFENCE_BENCH_REDIS (default redis://127.0.0.1:6379/13). Each run verifies its result (the
effect count, distinct effects, an empty queue) and the suite stops on a wrong one.

Prints one table: each figure with the median of ``--repeat`` runs, their spread, and its
baseline measured in the same invocation, as a ratio; then the issue's targets, met or not.
Results also go to bench/results/ (JSON and a Markdown table).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".venv-peers"
REQUIREMENTS = HERE / "requirements-peers.txt"


def _ensure_peers() -> Path:
    """Create or refresh bench/.venv-peers when the requirements changed; return its python."""
    python = PEERS / "bin" / "python"
    stamp = PEERS / ".requirements.sha256"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return python
    print(f"setting up {PEERS.relative_to(HERE.parent)} (the peers, for the benchmark only)…")
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(PEERS)
    (PEERS / ".gitignore").write_text("*\n")  # never tracked (as Python 3.13's venv does)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(digest)
    return python


def _bootstrap(script: str | None = None) -> None:
    """Re-run ``script`` (this file by default) with the peers' virtualenv."""
    if os.environ.get("BENCH_IN_PEERS") == "1":
        return
    try:
        import jobfence  # noqa: F401
    except ImportError:
        sys.exit(
            "bench/run.py runs with the project's virtualenv, where jobfence is installed: "
            ".venv/bin/python bench/run.py (after pip install -e '.[dev]')"
        )
    python = _ensure_peers()
    env = {**os.environ, "BENCH_IN_PEERS": "1", "BENCH_PROJECT_PYTHON": sys.executable}
    target = Path(script or __file__).resolve()
    os.execve(str(python), [str(python), str(target), *sys.argv[1:]], env)


if __name__ == "__main__":
    _bootstrap()
    sys.path.insert(0, str(HERE))
    from suite import main

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    main(parser)
