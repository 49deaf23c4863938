"""The application the deployment example runs: replace it with yours.

``jobfence worker myapp:app`` imports this module (the image puts /app on PYTHONPATH). The
database comes from ``JOBFENCE_DATABASE_URL`` (a Kubernetes Secret, or compose's .env); the
queue from ``JOBFENCE_TRANSPORT`` when it is not the database.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from jobfence import App, Job, Tx

log = logging.getLogger("myapp")

app = App(os.environ["JOBFENCE_DATABASE_URL"], transport=os.environ.get("JOBFENCE_TRANSPORT"))


@app.consumer("points.credit")
async def credit(job: Job[dict[str, Any]], tx: Tx) -> None:
    """The effect goes in ``tx``, with the job's fence row: it commits once per job_id."""
    await tx.execute("SELECT 1")  # your INSERT/UPDATE here
    log.info("credited", extra={"job_id": job.job_id, "payload": job.payload})
