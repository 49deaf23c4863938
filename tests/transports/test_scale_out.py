"""Several worker processes share one queue: each job has exactly one effect (SPEC Q1)."""

from __future__ import annotations

import collections
from pathlib import Path

from jobfence import App

from ..contract.support import Target, start_worker, stop_workers, wait_started
from ..helpers import eventually, query

JOBS = 200


async def test_four_worker_processes_share_one_queue(broker: Target, tmp_path: Path) -> None:
    """4 `jobfence worker` processes on one broker queue, 200 jobs: 200 effects, one per
    job, and the work was spread over more than one process. (The database queue's
    multi-process claims are tested in tests/test_worker.py.)"""
    target = broker
    env = target.env(tmp_path, lease=5.0)
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    # 4 × (4 + 4) connections at most: the suite shares PostgreSQL's max_connections
    workers = [start_worker(env, log, "--concurrency", "4") for log in logs]
    try:
        for log in logs:
            await wait_started(log)
        app: App = target.app()
        async with app:
            await app.enqueue_many(
                [
                    app.job(target.queue, {"mode": "sleep", "seconds": 0.01}, job_id=f"s-{i:03d}")
                    for i in range(JOBS)
                ]
            )

        async def all_done() -> bool:
            rows = await query(target.database_url, "SELECT count(*) FROM effects")
            return int(rows[0][0]) >= JOBS

        await eventually(all_done, timeout=240, interval=0.1, what="200 effects")
    finally:
        codes = stop_workers(workers)
    assert codes == [0, 0, 0, 0]
    rows = await query(target.database_url, "SELECT job_id, pid FROM effects")
    per_job = collections.Counter(job_id for job_id, _ in rows)
    assert sorted(per_job) == [f"s-{i:03d}" for i in range(JOBS)]
    assert set(per_job.values()) == {1}
    assert len({pid for _, pid in rows}) >= 2
