"""Where jobfence's worker spends its CPU on the durable (or no-op) workload: py-spy (from
bench/.venv-peers) samples the worker subprocess while it drains the queue, and the samples
are summed per function, inclusive (the function and what it calls) and self (on top of
the stack), without line numbers. Idle time (waiting on the network) is not sampled."""

from __future__ import annotations

import collections
import re
import subprocess
import time

if __name__ == "__main__":  # run with the project's virtualenv; re-runs itself with the peers'
    from run import _bootstrap

    _bootstrap(__file__)

from measure import BENCH, ROOT, BenchError, Worker, command, fresh_database, run_json
from suite import JOBFENCE_DEFAULT

FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def _frame(text: str) -> str:
    m = FRAME.match(text.strip())
    if not m:
        return text.strip()
    file = m["file"].split("site-packages/")[-1]
    return f"{m['func']} ({file})"


def summarize(raw: str, top: int = 25) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    if not total:
        return "(no samples)"
    lines = [f"{total} samples of the worker on CPU", "", "inclusive  function (module)"]
    skip = ("<module>", "run (asyncio", "Runner.run", "BaseEventLoop.run", "Handle._run",
            "main (", "BaseEventLoop._run_once")  # fmt: skip
    for f, n in inclusive.most_common(top + len(skip)):
        if f.startswith(skip):
            continue
        lines.append(f"{n / total:8.1%}  {f}")
    lines += ["", "self       function (module)"]
    for f, n in own.most_common(top):
        lines.append(f"{n / total:8.1%}  {f}")
    return "\n".join(lines)


def profile_jobfence(jobs: int, seconds: float = 15.0, mode: str = "durable") -> str:
    """Profile the jobfence worker at its defaults (no flag: the path most users run)
    draining ``jobs`` jobs of the ``durable`` or ``noop`` workload."""
    spy = BENCH / ".venv-peers" / "bin" / "py-spy"
    out = ROOT / "bench" / "results" / f"profile-{time.strftime('%Y%m%dT%H%M%S')}.raw"
    out.parent.mkdir(exist_ok=True)
    with fresh_database() as url:
        run_json(command("jobfence", "setup", url))
        run_json(command("jobfence", "enqueue", url, str(jobs)))
        worker = Worker(command("jobfence", "worker", url, "--mode", mode, *JOBFENCE_DEFAULT.args))
        try:
            worker.wait_ready()
            proc = subprocess.run(
                [str(spy), "record", "--pid", str(worker.proc.pid), "--duration", str(int(seconds)),
                 "--rate", "250", "--format", "raw", "--nonblocking", "-o", str(out)],
                capture_output=True, text=True,
            )  # fmt: skip
            if proc.returncode != 0:
                raise BenchError(f"py-spy failed: {proc.stderr[-2000:]}")
        finally:
            worker.stop()
    summary = summarize(out.read_text())
    out.with_suffix(".txt").write_text(summary + "\n")
    return summary


if __name__ == "__main__":
    import sys

    # python bench/profile.py [JOBS] [durable|noop] [SECONDS]
    args = sys.argv[1:]
    print(
        profile_jobfence(
            int(args[0]) if args else 20000,
            float(args[2]) if len(args) > 2 else 15.0,
            args[1] if len(args) > 1 else "durable",
        )
    )
