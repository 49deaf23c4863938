"""job.call beyond the happy path: an operator's settlement is honoured by the replayed job,
the intent is durable (and visible to others) before the request leaves, group commit, the
key, bad input, and what a handler gets back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jobfence import Actor, App, ConfigurationError, Job, NonRetryableError, Tx
from jobfence.calls import UNKNOWN_OUTCOME, default_key
from jobfence.review import deadletters as dl

from ..helpers import RunningWorker, eventually, query, table
from .test_ledger import FAST, Downstream, app_with, calls, ledger_of, letters, run_until

OPERATOR = Actor("olga")


async def settle(url: str, job_id: str, state: str, reference: str | None) -> None:
    """What the operators' settle service writes (its own tests are the operators' surfaces')."""
    now = "now()" if url.startswith("postgresql") else "(julianday('now') - 2440587.5) * 86400.0"
    p = "%s" if url.startswith("postgresql") else "?"
    await query(
        ledger_of(url),
        f"UPDATE {table(url, 'calls')} SET state = {p}, reference = {p}, settled_by = 'olga', "
        f"settled_reason = 'checked the ERP', settled_at = {now} WHERE job_id = {p} "
        "RETURNING id",
        (state, reference, job_id),
    )


@pytest.mark.parametrize("decision", ["applied", "not_applied"])
async def test_a_parked_call_settled_by_an_operator_is_honoured_by_the_replay(
    database_url: str, decision: str
) -> None:
    downstream = Downstream()
    downstream.script = ["lost"]
    done: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(await job.call("erp.create", downstream.send, retry=FAST))

    app = app_with(database_url, handle)
    key = default_key("order-1", "erp.create")
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: letters(database_url), "the parked job")
        [(letter_id,)] = await query(
            database_url, f"SELECT id FROM {table(database_url, 'dead_letters')}"
        )
        await settle(database_url, "order-1", decision, "PO-77" if decision == "applied" else None)
        await dl.replay(app.db, app.transport, letter_id, actor=OPERATOR, reason="settled")

        async def finished() -> bool:
            return bool(done)

        await run_until(app, finished, "the replayed job")
    [row] = await calls(database_url)
    if decision == "applied":
        # the job goes on as if the call had answered: the operator's reference, no call
        assert done == [{"reference": "PO-77"}]
        assert downstream.sends == 1
        assert row[3] == "applied"
    else:
        # called again, with the same key
        assert downstream.sends == 2
        assert downstream.effects == {key: 2}  # this downstream ignores keys; the ERP would not
        assert row[2:5] == (key, "succeeded", 2)


async def test_the_intent_is_committed_before_the_request_leaves(ledger: str) -> None:
    """While ``send`` runs — inside the job's open transaction, which on SQLite holds the
    store's write lock — another connection already reads the committed intent."""
    seen: list[Any] = []

    async def send(key: str) -> dict[str, str]:
        rows = await asyncio.wait_for(
            query(
                ledger_of(ledger),
                f"SELECT state, idem_key FROM {table(ledger, 'calls')}",
            ),
            timeout=10,
        )
        seen.append(rows)
        return {"reference": "PO-1"}

    async def handle(job: Job[Any], tx: Tx) -> None:
        p = "%s" if tx.dialect == "postgresql" else "?"
        await tx.execute(f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, 'm', 1)",
                         (job.job_id,))  # fmt: skip
        await job.call("erp.create", send, retry=FAST)

    app = app_with(ledger, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: query(ledger, "SELECT 1 FROM ledger"), "the job")
    assert seen == [[("pending", default_key("order-1", "erp.create"))]]


FENCES_OF_MY_TX = (
    "SELECT count(*) FROM core.processed_jobs "
    "WHERE xmin::text::bigint = txid_current() % 4294967296"
)


async def test_a_consumer_that_calls_leaves_group_commit(pg_ledger: str) -> None:
    """Once a consumer made a call, its jobs run in transactions of their own (a batch's
    transaction would stay open for each call's round trip); every call is made once. A
    consumer that makes no call keeps sharing transactions (the measure can see both)."""
    downstream = Downstream()
    shared: dict[str, list[int]] = {"orders": [], "plain": []}

    async def fences(tx: Tx) -> int:
        row = await tx.fetchone(FENCES_OF_MY_TX)
        return int(row[0]) if row else 0

    async def calling(job: Job[Any], tx: Tx) -> None:
        shared["orders"].append(await fences(tx))
        await job.call("erp.create", downstream.send, retry=FAST)

    async def plain(job: Job[Any], tx: Tx) -> None:
        shared["plain"].append(await fences(tx))

    app = App(pg_ledger)
    app.consumer("orders")(calling)
    app.consumer("plain")(plain)
    async with app, RunningWorker(app, poll_interval=0.05, concurrency=4, batch_size=20):
        await app.enqueue("orders", {"n": 0}, job_id="o-first")
        await eventually(lambda: len(downstream.effects) == 1, timeout=30, what="one call")
        await app.enqueue_many(
            [app.job("orders", {"n": i}, job_id=f"o-{i}") for i in range(30)]
            + [app.job("plain", {"n": i}, job_id=f"p-{i}") for i in range(30)]
        )
        await eventually(
            lambda: len(downstream.effects) == 31 and len(shared["plain"]) == 30,
            timeout=60,
            what="31 calls and 30 plain jobs",
        )
    assert sorted(downstream.effects.values()) == [1] * 31
    assert shared["orders"][1:] == [1] * 30
    assert max(shared["plain"]) > 1


async def test_the_key_is_per_job_and_step_and_ascii() -> None:
    keys = {default_key(j, s) for j in ("a:b", "a", "ü 1", "x" * 255) for s in ("c", "b:c", "é")}
    assert len(keys) == 12
    assert all(k.isascii() and len(k) == 35 and k.startswith("jf-") for k in keys)
    assert default_key("order-1", "erp.create") == default_key("order-1", "erp.create")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": ""}, "the step must be a non-empty string"),
        ({"step": "x" * 201}, "at most 200 characters"),
        ({"key": ""}, "key must be a string of 1 to 255 characters"),
        ({"key": "k" * 256}, "key must be a string of 1 to 255 characters"),
        ({"retry": 3}, "retry must be a CallRetry"),
    ],
)
async def test_bad_input_fails_the_job_with_one_line(
    sqlite_database: str, kwargs: dict[str, Any], message: str
) -> None:
    downstream = Downstream()

    async def handle(job: Job[Any], tx: Tx) -> None:
        args = {"step": "erp.create", **kwargs}
        step = args.pop("step")
        await job.call(step, downstream.send, **args)

    app = app_with(sqlite_database, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: letters(sqlite_database), "the dead letter")
    [(_, _category, _code, error)] = await letters(sqlite_database)
    assert message in error
    assert "\n" not in error
    assert downstream.sends == 0


async def test_an_answer_that_cannot_be_recorded_is_recorded_as_succeeded_without_it(
    sqlite_database: str,
) -> None:
    sent: list[str] = []

    async def send(key: str) -> Any:
        sent.append(key)
        return {"blob": "x" * 9000}

    async def handle(job: Job[Any], tx: Tx) -> None:
        await job.call("erp.create", send, retry=FAST)

    app = app_with(sqlite_database, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: letters(sqlite_database), "the dead letter")
    [(_, category, code, error)] = await letters(sqlite_database)
    assert (category, code) == ("NON_RETRYABLE_ERROR", "CALL_ANSWER_UNRECORDABLE")
    assert "at most 8192" in error
    [row] = await calls(sqlite_database)
    assert row[3] == "succeeded"  # the request took effect: never sent again
    assert len(sent) == 1


async def test_a_job_made_by_hand_cannot_call() -> None:
    job: Job[Any] = Job("q", "j", {}, b"{}", 1, None, None)
    with pytest.raises(ConfigurationError, match="needs a job run by a jobfence worker"):
        await job.call("erp.create", Downstream().send)


def test_parking_is_a_non_retryable_error_with_its_own_code() -> None:
    from jobfence import UnknownOutcome

    parked = UnknownOutcome("unknown", step="erp.create", key="jf-1")
    assert isinstance(parked, NonRetryableError)
    assert parked.code == UNKNOWN_OUTCOME


async def test_calls_are_counted_by_step_and_outcome_and_the_doubt_is_a_gauge(
    database_url: str,
) -> None:
    from prometheus_client import REGISTRY

    from jobfence.review.stats import refresh_gauges

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    step = f"erp.{database_url[:4]}"  # a series of this test's own
    calls_of = {"queue": "orders", "consumer": "orders", "step": step}
    downstream = Downstream()
    downstream.script = ["ok", "lost", "lost"]

    async def lookup(key: str) -> None:
        return None  # never found: the third job is sent again

    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.job_id == "o-3":
            await job.call(step, downstream.send, reconcile=lookup, retry=FAST)
        else:
            await job.call(step, downstream.send, retry=FAST)

    app = app_with(database_url, handle, name="orders")
    async with app:
        for n in (1, 2, 3):
            await app.enqueue("orders", {"n": n}, job_id=f"o-{n}")

        async def settled() -> bool:
            states = [r[3] for r in await calls(database_url)]
            return states.count("succeeded") == 2 and len(await letters(database_url)) == 1

        async with RunningWorker(app, poll_interval=0.05, concurrency=1):
            await eventually(settled, timeout=30, what="two calls made, one parked")
        ledger_db = app.ledger.opened
        assert ledger_db is not None
        await refresh_gauges(app.db, None, ledger_db)
    assert sample("jobfence_calls_total", **calls_of, outcome="succeeded") == 2
    assert sample("jobfence_calls_total", **calls_of, outcome="parked") == 1
    assert sample("jobfence_call_reconciles_total", **calls_of, result="not_found") == 1
    assert sample("jobfence_calls_open", state="in_doubt") == 1
    assert sample("jobfence_calls_oldest_open_age_seconds", state="in_doubt") > 0


async def test_one_step_called_twice_at_once_is_refused_and_called_in_turn_is_recorded(
    sqlite_database: str,
) -> None:
    downstream = Downstream()
    results: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        first, second = await asyncio.gather(
            job.call("erp.create", downstream.send, retry=FAST),
            job.call("erp.create", downstream.send, retry=FAST),
            return_exceptions=True,
        )
        results.extend([first, second])
        results.append(await job.call("erp.create", downstream.send, retry=FAST))

    app = app_with(sqlite_database, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")

        async def ran() -> bool:
            return len(results) == 3

        await run_until(app, ran, "the handler")
    refused = [r for r in results[:2] if isinstance(r, ConfigurationError)]
    assert len(refused) == 1
    assert "is already being called" in str(refused[0])
    assert downstream.sends == 1
    assert results[2] == next(r for r in results[:2] if not isinstance(r, Exception))
