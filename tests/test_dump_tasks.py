"""``kill -USR1`` of a running jobfence command logs its tasks and where each waits, and the
command carries on (the operator's "what is it stuck on?", docs/runbook.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .helpers import REPO


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{content}"
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not logged within {timeout:g}s:\n{content}")


def test_sigusr1_logs_the_workers_tasks_and_it_carries_on(
    sqlite_database: str, tmp_path: Path
) -> None:
    (tmp_path / "dumpapp.py").write_text(
        "import jobfence\n"
        f"app = jobfence.App({sqlite_database!r})\n"
        "@app.consumer('q')\n"
        "async def handle(job, tx):\n"
        "    pass\n"
    )
    log_path = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobfence.cli", "worker", "dumpapp:app", "--log-format",
             "json"],
            cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO / "src")},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(log_path, "worker started", proc)
        proc.send_signal(signal.SIGUSR1)
        content = _wait_for(log_path, "task(s) dumped", proc)
        # the fetch loop and the health ticker are there, each with the line it waits on
        assert '"task": "jobfence-health"' in content
        assert "in watch" in content
        assert "worker.py" in content
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "worker stopped" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
