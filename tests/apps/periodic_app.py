"""An app with one periodic job, for scheduler processes started by the tests.

Configured by environment: JF_DB (database URL), JF_TRANSPORT (optional queue URL), JF_CRON
(default every second), JF_MISSED (default "all"). The consumer of the ``beat`` queue writes
one ledger row per run: the tick's job_id, the process, the attempt.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from jobfence import App, Job, Tx
from jobfence.core.periodic import slot_text

app = App(
    os.environ["JF_DB"],
    transport=os.environ.get("JF_TRANSPORT") or None,
    lease=timedelta(seconds=5),
)


def payload(slot: datetime) -> dict[str, Any]:
    return {"slot": slot_text(slot)}


app.periodic(
    "beat",
    cron=os.environ.get("JF_CRON", "* * * * * *"),
    queue="beat",
    payload=payload,
    missed=os.environ.get("JF_MISSED", "all"),  # type: ignore[arg-type]
)


@app.consumer("beat")
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    p = "%s" if tx.dialect == "postgresql" else "?"
    await tx.execute(
        f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})",
        (job.job_id, str(os.getpid()), job.attempt),
    )
