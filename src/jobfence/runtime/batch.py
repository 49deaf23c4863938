"""Group commit (the worker's default on a PostgreSQL queue in the fence's database): the
jobs of one batch in one transaction, each in its own savepoint; see
:meth:`jobfence.runtime.harness.Harness.handle_batch`, which forms the batch and calls
:func:`run_batch`. Per job, the guarantees of the single path hold: a failing job rolls back
alone (its fence removed, its retry or dead letter written in the same transaction), and a
job that ends the transaction or takes transaction-wide state costs the batch a re-run, one
job per transaction.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core import fence
from ..core.jobs import Delivery, Job
from ..db import BatchLost, Tx
from ..errors import error_code
from ..review import letters

if TYPE_CHECKING:
    from .harness import Consumer, Harness

log = logging.getLogger("jobfence.harness")


class Outcome(enum.Enum):
    """What became of one delivery (re-exported by :mod:`jobfence.runtime.harness`)."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    RETRY = "retry"
    DEAD = "dead"
    LOST = "lost"
    FAILED_TO_RECORD = "failed_to_record"  # the store was unreachable; the lease will redeliver


async def run_batch(
    harness: Harness,
    screened: list[tuple[int, Delivery, Consumer, Job[Any]]],
    outcomes: dict[int, Outcome],
) -> None:
    """Run ``screened`` (index, delivery, consumer, job) in one transaction and write each
    one's outcome into ``outcomes`` at its index."""
    params = {
        "ids": [d.ref for _, d, _, _ in screened],
        "tokens": [d.token for _, d, _, _ in screened],
        "consumers": [c.name for _, _, c, _ in screened],
        "job_ids": [d.job_id for _, d, _, _ in screened],
        "ttl": harness.fence_ttl.total_seconds(),
    }
    step = "batch_fence_and_ack" if harness.fence_enabled else "batch_ack"
    notes: list[Callable[[], None]] = []
    committed: list[tuple[Job[Any], float]] = []
    started = False
    running: Consumer | None = None
    try:
        async with harness.db.batch(step, params) as (batch, rows):
            by_id = {row["id"]: row for row in rows}
            fenced_keys: set[tuple[str, str]] = set()
            for index, delivery, consumer, job in screened:
                row = by_id[delivery.ref]
                key = (consumer.name, delivery.job_id)
                if not row["acked"]:
                    outcomes[index] = Outcome.LOST
                    notes.append(partial(harness.observers.job_lost, delivery, consumer.name))
                    continue
                if not row["fenced"] or key in fenced_keys:
                    outcomes[index] = Outcome.DUPLICATE
                    notes.append(partial(harness.observers.job_duplicate, delivery, consumer.name))
                    continue
                fenced_keys.add(key)
                started = True
                running = consumer
                with (
                    nullcontext()
                    if harness.tracing is None
                    else harness.tracing.process(delivery, harness.transport.name, consumer.name)
                ) as span:
                    harness.observers.job_started(job)
                    began = time.perf_counter()
                    try:
                        async with batch.job() as tx:
                            await harness._call(consumer, job, tx)
                    except BatchLost:
                        raise
                    except Exception as exc:
                        outcomes[index] = await _failed_in_batch(
                            harness, batch.tx, delivery, consumer, exc, notes
                        )
                    else:
                        outcomes[index] = Outcome.PROCESSED
                        committed.append((job, time.perf_counter() - began))
                    if harness.tracing is not None:
                        harness.tracing.outcome(span, outcomes[index].value)
    except asyncio.CancelledError:
        for _, delivery, _, _ in screened:
            await asyncio.shield(harness._release(delivery))
        raise
    except BatchLost as lost:
        # a handler ended the batch's transaction (SPEC H5), or took transaction-wide
        # state that would outlive its job (SET LOCAL, an advisory xact lock, COPY):
        # nothing of the batch committed and every delivery is still ours; each job runs
        # again on its own, so the culprit fails (or, isolated, succeeds) alone and the
        # others commit
        if lost.isolate is not None and running is not None:
            harness.learned_isolated.add(running.name)
            log.warning(
                "a handler took transaction-wide state inside a group-commit transaction; "
                "its consumer's jobs now run one per transaction (declare the consumer "
                "isolated=True to skip this re-run)",
                extra={"consumer": running.name, "statement": lost.isolate},
            )
        else:
            log.warning(
                "a handler ended its group-commit transaction; running the batch's jobs one by one",
                extra={"error": str(lost.problem)},
            )
        for index, delivery, _, _ in screened:
            outcomes[index] = await harness.handle(delivery)
        return
    except Exception:
        if not started:
            # nothing ran: let each delivery take the single path (and its error handling)
            for index, delivery, _, _ in screened:
                outcomes[index] = await harness.handle(delivery)
            return
        log.exception("group commit failed; its jobs go back to the queue")
        for index, delivery, _, _ in screened:
            await harness._release(delivery)
            outcomes[index] = Outcome.FAILED_TO_RECORD
        return
    after_commit = harness.observers.wants_after_commit
    for job, duration in committed:
        if after_commit:
            await harness.observers.after_commit(job)
        harness.observers.job_processed(job, duration)
    for note in notes:
        note()


async def _failed_in_batch(
    harness: Harness,
    tx: Tx,
    delivery: Delivery,
    consumer: Consumer,
    exc: Exception,
    notes: list[Callable[[], None]],
) -> Outcome:
    """A job of a batch failed; its savepoint is rolled back. Undo its fence and ack, and
    write its retry or dead letter, all in the batch's transaction."""
    failure = harness._decide(delivery, consumer, exc)
    category, decision, error = failure.category, failure.decision, failure.error
    if harness.fence_enabled:
        await fence.unclaim_tx(tx, consumer.name, delivery.job_id)
    if decision.retry:
        await harness.transport.requeue_tx(
            tx, delivery, decision.delay, category, error, trace=failure.trace
        )
        notes.append(
            partial(
                harness.observers.job_retry,
                delivery,
                consumer.name,
                category,
                decision.delay,
                error,
                trace=failure.log_trace,
            )
        )
        return Outcome.RETRY
    letter_id, created = await letters.write(
        harness.db,
        delivery,
        consumer.name,
        category,
        error,
        error_code(exc),
        ack=False,
        payload_limit=harness.payload_limit,
        tx=tx,
        trace=failure.trace,
    )
    notes.append(
        partial(
            harness.observers.job_dead,
            delivery,
            consumer.name,
            category,
            error,
            letter_id,
            created=created,
            trace=failure.log_trace,
        )
    )
    return Outcome.DEAD
