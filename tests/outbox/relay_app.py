"""An app for `jobfence relay tests.outbox.relay_app:app --with-worker` (the relay embedded
in a worker's process): its consumer records each event in the ``ledger`` table."""

from __future__ import annotations

from typing import Any

from jobfence import App, Job, Tx

app = App()


@app.consumer("ledger.credit")
async def credit(job: Job[Any], tx: Tx) -> None:
    await tx.execute(
        "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, %s, %s)",
        (job.job_id, job.payload["member"], job.payload["points"]),
    )
