"""Round trips and transactions per job on the durable workload, one job per transaction
against the defaults (group commit).

The worker subprocess runs under ``strace -f -e trace=sendto`` with the bytes it sends; a
round trip is a send that ends in a message the server answers with ReadyForQuery and the
client then waits for — a ``Sync`` (extended protocol, and the end of a pipeline's batch of
statements) or a simple ``Query`` — so sends that only push statements into a pipeline do
not count. The LISTEN and lease connections' few are included. The server's
``pg_stat_database.xact_commit`` gives the commits.

    .venv/bin/python bench/roundtrips.py [JOBS]

Not timed: strace slows the worker several-fold, which also shrinks its batches (a batch
holds about two seconds of recent handler time); this counts, bench/run.py times.
"""

from __future__ import annotations

if __name__ == "__main__":  # run with the project's virtualenv; re-runs itself with the peers'
    from run import _bootstrap

    _bootstrap(__file__)

import re
import shutil
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "one job per transaction (--batch-size 1)": ("--batch-size", "1"),
    "defaults (no flags: group commit)": (),
}
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def count(jobs: int, args: tuple[str, ...]) -> dict[str, float]:
    # measure needs the peers' virtualenv (psutil); round_trips() below does not (bench/calls.py)
    from measure import BenchError, Worker, command, fresh_database, run_json, scalar

    strace = shutil.which("strace")
    if strace is None:
        raise BenchError("strace is needed: apt-get install -y strace")
    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        run_json(command("jobfence", "setup", url))
        run_json(command("jobfence", "enqueue", url, str(jobs)))
        time.sleep(1.0)  # let the statistics of the enqueue settle
        before = int(scalar(url, COMMITS))
        trace = Path(tmp) / "trace"
        cmd = command("jobfence", "worker", url, "--mode", "durable", *args)
        strace_args = ["-f", "-qq", "-xx", "-s", "1000000", "-e", "trace=sendto", "-o", str(trace)]
        worker = Worker([strace, *strace_args, *cmd])
        try:
            worker.wait_ready(timeout=120)
            deadline = time.monotonic() + 600
            while scalar(url, "SELECT count(*) FROM core.jobs") != 0:
                worker.check_alive()
                if time.monotonic() > deadline:
                    raise BenchError("the worker did not drain the queue in 10 minutes")
                time.sleep(0.2)
        finally:
            worker.stop()
        time.sleep(1.0)
        commits = int(scalar(url, COMMITS)) - before
        effects = int(scalar(url, "SELECT count(*) FROM bench_effects"))
        if effects != jobs:
            raise BenchError(f"{effects} effects, expected {jobs}")
        trips = round_trips(trace.read_text())
    return {"round trips / job": trips / jobs, "commits / job": commits / jobs}


SENDTO = re.compile(r'^(?P<pid>\d+)\s+sendto\((?P<fd>\d+), "(?P<data>[^"]*)"')


def round_trips(trace: str) -> int:
    """Sends whose messages include a Sync ('S') or a simple Query ('Q'): the requests the
    client waits on. Messages are walked per connection (type byte, int32 length), carrying
    a message split over two sends."""
    carry: dict[tuple[str, str], bytes] = {}
    trips = 0
    for line in trace.splitlines():
        m = SENDTO.match(line)
        if m is None:
            continue
        key = (m["pid"], m["fd"])
        data = carry.pop(key, b"") + bytes.fromhex(m["data"].replace("\\x", ""))
        waits = False
        at = 0
        while at + 5 <= len(data):
            kind = data[at : at + 1]
            size = int.from_bytes(data[at + 1 : at + 5], "big")
            if size < 4 or kind not in KINDS:  # the startup packet, SSL request: no type byte
                at = len(data)
                break
            if at + 1 + size > len(data):
                break
            waits = waits or kind in (b"S", b"Q")
            at += 1 + size
        if at < len(data):
            carry[key] = data[at:]
        trips += waits
    return trips


#: frontend message types (PostgreSQL protocol 3)
KINDS = {bytes([c]) for c in b"BCcdDEFfHPpQSX"}


def main(jobs: int) -> None:
    print(f"{jobs:,} durable jobs (one INSERT each), fence on")
    print(f"{'setting':45} {'round trips / job':>18} {'commits / job':>14}")
    for label, args in SETTINGS.items():
        got = count(jobs, args)
        print(f"{label:45} {got['round trips / job']:18.2f} {got['commits / job']:14.3f}")


if __name__ == "__main__":
    import sys

    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
