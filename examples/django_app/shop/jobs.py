"""The shop's jobs: a plain ``def`` handler writes with the ORM; jobfence runs it inside
``transaction.atomic()`` with the job's fence, so the credit and the fence commit together.

``then`` in a payload makes the handler misbehave on purpose after its write: the test suite
(tests/integrations/test_django.py) uses it to show what jobfence does then.
"""

import contextlib
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import DatabaseError, transaction

from jobfence import BusinessError, Job, RetryPolicy, TemporaryError
from jobfence.integrations.django import DjangoApp, DjangoTx

from .models import Credit

app = DjangoApp(lease=timedelta(seconds=float(os.environ.get("SHOP_LEASE", "30"))))

FAST = RetryPolicy(
    max_retries=2,
    base=timedelta(milliseconds=100),
    cap=timedelta(seconds=1),
    limited_retries=2,
    justification="example shop: a failing credit is dead-lettered within a second",
)


@app.consumer("points.credit", retry=FAST)
def credit_points(job: Job[dict[str, Any]], tx: DjangoTx) -> None:
    Credit.objects.create(
        job_id=job.job_id, member_id=job.payload["member_id"], points=job.payload["points"]
    )
    misbehave(job, tx, job.payload.get("then"))


def misbehave(job: Job[dict[str, Any]], tx: DjangoTx, then: str | None) -> None:
    """What the tests make a handler do after its write."""
    if then == "hang" and job.attempt == 1:  # the test SIGKILLs the worker now
        Path(os.environ["SHOP_MARKS"], f"{job.job_id}.in-tx").write_text(str(os.getpid()))
        time.sleep(3600)
    elif then == "raise":
        raise BusinessError("member is closed")
    elif then == "transient":
        raise TemporaryError("loyalty service is down")
    elif then == "commit":
        transaction.commit()
    elif then == "commit-caught":
        # refused, and nothing happened: the job commits normally
        with contextlib.suppress(transaction.TransactionManagementError):
            transaction.commit()
    elif then == "rollback":
        transaction.rollback()
    elif then == "set-autocommit":
        transaction.set_autocommit(True)
    elif then == "close":
        tx.connection.close()
    elif then == "durable":
        with transaction.atomic(durable=True):
            pass
    elif then == "connection-commit":
        tx.connection.commit()
    elif then == "raw-commit":
        tx.connection.connection.commit()
    elif then == "raw-rollback":
        tx.connection.connection.rollback()
    elif then == "sql-commit":
        tx.execute("COMMIT")
    elif then == "set-rollback":
        transaction.set_rollback(True)
    elif then == "caught-sql-error":
        with contextlib.suppress(DatabaseError):  # NOT NULL: the statement fails
            tx.execute("INSERT INTO shop_credit (job_id) VALUES (%s)", [job.job_id])
    elif then == "caught-orm-error":
        with contextlib.suppress(DatabaseError):
            Credit.objects.create(job_id=job.job_id, member_id=None, points=0)
    elif then == "savepoint":
        try:
            with transaction.atomic():  # a savepoint inside the job's transaction
                Credit.objects.create(job_id=job.job_id, member_id="undone", points=0)
                raise BusinessError("undo this part only")
        except BusinessError:
            pass
    elif then == "second-alias":  # a write through another alias of the same database
        Credit.objects.using("again").create(job_id=f"{job.job_id}-again", member_id="m", points=0)
    elif then == "follow-up":
        app.enqueue_sync("points.audit", {"of": job.job_id}, job_id=f"audit-{job.job_id}")


@app.consumer("points.audit")
def audit(job: Job[dict[str, Any]], tx: DjangoTx) -> None:
    Credit.objects.create(job_id=job.job_id, member_id="audit", points=0, note=job.payload["of"])
