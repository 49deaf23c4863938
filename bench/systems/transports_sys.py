"""Shim: runs bench/transports.py's per-transport run (jobfence's durable workload through
each transport, fence on PostgreSQL) and prints the results as one JSON line, for
bench/run.py. Runs in the project's virtualenv.

    python bench/systems/transports_sys.py JOBS CONCURRENCY postgresql,sqlite,rabbitmq,nats,redis
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import transports


async def main(jobs: int, concurrency: int, kinds: list[str]) -> None:
    out = []
    with transports.redis_server() as redis_url:
        for kind in kinds:
            r = await transports.one_run(kind, jobs, concurrency, redis_url)
            out.append(
                {
                    "transport": r.transport,
                    "publish": r.publish_per_s,
                    "process": r.process_per_s,
                    "cpu": r.cpu_per_1000,
                }
            )
    print(json.dumps({"results": out}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")))
