"""Each transport on the durable workload, through bench/transports.py (its method: the
worker in-process, timed from its start to the last commit; CPU of that process)."""

from __future__ import annotations

from measure import BENCH, Drain, python_for, run_json

KINDS = ["postgresql", "sqlite", "rabbitmq", "nats", "redis"]


def transports(jobs: int, concurrency: int = 32) -> list[tuple[str, Drain]]:
    out = run_json(
        [python_for("jobfence"), str(BENCH / "systems" / "transports_sys.py"), str(jobs),
         str(concurrency), ",".join(KINDS)],
        timeout=3600,
    )  # fmt: skip
    return [
        (
            f"{r['transport']} transport · {jobs:,} jobs",
            Drain(
                r["process"],
                r["cpu"],
                float("nan"),
                0.0,
                0.0,
                jobs / r["process"],
                extra={"publish": r["publish"]},
            ),
        )
        for r in out["results"]
    ]
