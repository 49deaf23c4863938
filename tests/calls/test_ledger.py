"""job.call: the recorded step (SPEC E1–E3) on both stores, with a worker in the test's loop.

The downstream here is a plain object that counts its effects per key and does not
deduplicate (the process-level fault suite uses an HTTP stub in a subprocess)."""

from __future__ import annotations

import collections
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from jobfence import (
    App,
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallRetry,
    CallUnauthorized,
    Job,
    RetryPolicy,
    TemporaryError,
    Tx,
)
from jobfence.calls import UNKNOWN_OUTCOME, default_key, ledger_url
from jobfence.config import parse_database_url

from ..helpers import RunningWorker, eventually, query, table

FAST = CallRetry(attempts=3, initial=0.01, multiplier=2.0, maximum=0.05)
QUICK_RETRIES = RetryPolicy(
    max_retries=4,
    base=timedelta(milliseconds=50),
    cap=timedelta(milliseconds=200),
    justification="tests: retries within a second",
)


class Downstream:
    """Applies every request it gets (no deduplication); ``fail`` scripts what the next
    sends do: "ok", "reject", "not_sent", "lost" (applied, answer lost), "401"."""

    def __init__(self) -> None:
        self.effects: collections.Counter[str] = collections.Counter()
        self.sends = 0
        self.script: list[str] = []

    async def send(self, key: str) -> dict[str, Any]:
        self.sends += 1
        what = self.script.pop(0) if self.script else "ok"
        if what == "reject":
            raise CallRejected("order refused: unknown supplier", status=422)
        if what == "not_sent":
            raise CallNotSent("connection refused")
        if what == "401":
            raise CallUnauthorized("token expired")
        self.effects[key] += 1
        if what == "lost":
            raise CallInDoubt("read timeout after the request was sent")
        return {"reference": f"PO-{len(self.effects)}", "key": key}

    async def lookup(self, key: str) -> dict[str, Any] | None:
        if self.effects[key]:
            return {"reference": "found", "key": key}
        return None


def ledger_of(url: str) -> str:
    """The URL of the database that holds the call ledger of the store at ``url``."""
    target = ledger_url(parse_database_url(url))
    return url if target.dialect == "postgresql" else f"sqlite:///{target.target}"


async def calls(url: str) -> list[tuple[Any, ...]]:
    """The call ledger's rows (none while the ledger is not made yet: no call so far)."""
    where = ledger_url(parse_database_url(url))
    if where.dialect == "sqlite" and not where.path.exists():
        return []
    return await query(
        ledger_of(url),
        f"SELECT job_id, step, idem_key, state, attempts, outcome, reference, last_error "
        f"FROM {table(url, 'calls')} ORDER BY id",
    )


async def letters(url: str) -> list[tuple[Any, ...]]:
    return await query(
        url,
        f"SELECT job_id, error_category, error_code, last_error FROM "
        f"{table(url, 'dead_letters')} ORDER BY id",
    )


def app_with(url: str, handler: Callable[[Job[Any], Tx], Awaitable[None]], **consumer: Any) -> App:
    app = App(url)
    app.consumer("orders", retry=QUICK_RETRIES, **consumer)(handler)
    return app


async def run_until(app: App, check: Callable[[], Awaitable[Any]], what: str) -> None:
    async with RunningWorker(app, poll_interval=0.05, concurrency=2):
        await eventually(check, timeout=30, what=what)


async def test_a_call_is_recorded_and_a_redelivery_gets_its_answer_without_calling(
    database_url: str,
) -> None:
    downstream = Downstream()
    seen: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append(await job.call("erp.create", downstream.send, retry=FAST))
        if job.attempt == 1:
            raise TemporaryError("the job's own work failed after the call")

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(seen, 2), "two deliveries")
    key = default_key("order-1", "erp.create")
    assert downstream.effects == {key: 1}
    assert seen[0] == seen[1] == {"reference": "PO-1", "key": key}
    [row] = await calls(database_url)
    assert row[:5] == ("order-1", "erp.create", key, "succeeded", 1)
    outcome = row[5] if not isinstance(row[5], str) else json.loads(row[5])
    assert outcome == {"reference": "PO-1", "key": key}
    assert row[6] == "PO-1"


async def _n(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def test_the_key_is_the_handlers_when_given(database_url: str) -> None:
    downstream = Downstream()
    done: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(await job.call("erp.create", downstream.send, key="REQ-42", retry=FAST))

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(done, 1), "the call")
    assert downstream.effects == {"REQ-42": 1}


async def test_in_doubt_without_reconcile_or_repeat_is_parked_and_never_sent_twice(
    database_url: str,
) -> None:
    downstream = Downstream()
    downstream.script = ["lost"]

    async def handle(job: Job[Any], tx: Tx) -> None:
        await job.call("erp.create", downstream.send, retry=FAST)

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: letters(database_url), "the parked job")
    assert downstream.sends == 1
    [(job_id, category, code, error)] = await letters(database_url)
    assert (job_id, category, code) == ("order-1", "NON_RETRYABLE_ERROR", UNKNOWN_OUTCOME)
    key = default_key("order-1", "erp.create")
    assert "'erp.create'" in error
    assert key in error
    assert "read timeout" in error
    [row] = await calls(database_url)
    assert row[3] == "in_doubt"


@pytest.mark.parametrize("how", ["reconcile", "repeatable"])
async def test_in_doubt_is_resolved_with_reconcile_or_by_repeating_the_key(
    database_url: str, how: str
) -> None:
    downstream = Downstream()
    downstream.script = ["lost"]
    done: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        if how == "reconcile":
            result = await job.call(
                "erp.create", downstream.send, reconcile=downstream.lookup, retry=FAST
            )
        else:
            result = await job.call("erp.create", downstream.send, repeatable=True, retry=FAST)
        done.append(result)

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(done, 1), "the call resolved")
    key = default_key("order-1", "erp.create")
    [row] = await calls(database_url)
    if how == "reconcile":
        # found downstream: recorded, never sent again
        assert downstream.effects == {key: 1}
        assert downstream.sends == 1
        assert done == [{"reference": "found", "key": key}]
        assert row[3:5] == ("succeeded", 1)
    else:
        # the downstream honours the key (this stub does not: it counts both)
        assert downstream.sends == 2
        assert row[3:5] == ("succeeded", 2)


async def test_a_rejection_fails_the_step_and_the_job_without_a_retry(database_url: str) -> None:
    downstream = Downstream()
    downstream.script = ["reject"]

    async def handle(job: Job[Any], tx: Tx) -> None:
        await job.call("erp.create", downstream.send, retry=FAST)

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: letters(database_url), "the dead letter")
    assert downstream.sends == 1
    [(_, category, code, _error)] = await letters(database_url)
    assert (category, code) == ("INTEGRATION_ERROR", "HTTP_422")
    [row] = await calls(database_url)
    assert row[3] == "failed"
    assert "unknown supplier" in row[7]


async def test_not_sent_is_retried_in_process_then_by_the_job(database_url: str) -> None:
    downstream = Downstream()
    downstream.script = ["not_sent"] * 4  # 3 in the first delivery, 1 in the second
    done: list[Any] = []

    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(await job.call("erp.create", downstream.send, retry=FAST))

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(done, 1), "the call")
    assert downstream.sends == 5
    assert sum(downstream.effects.values()) == 1
    [row] = await calls(database_url)
    assert row[3:5] == ("succeeded", 5)


async def test_a_401_refreshes_once_and_sends_again(database_url: str) -> None:
    downstream = Downstream()
    downstream.script = ["401"]
    refreshed: list[int] = []
    done: list[Any] = []

    async def refresh() -> None:
        refreshed.append(1)

    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(await job.call("erp.create", downstream.send, refresh=refresh, retry=FAST))

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(done, 1), "the call")
    assert refreshed == [1]
    assert downstream.sends == 2


async def test_reconcile_failing_retries_the_job_which_resolves_it_first(
    database_url: str,
) -> None:
    downstream = Downstream()
    downstream.script = ["lost"]
    broken = [4]  # the first delivery's 3 in-process lookups and the next one fail
    done: list[Any] = []

    async def lookup(key: str) -> Any:
        if broken[0]:
            broken[0] -= 1
            raise ConnectionError("the ERP's search is down")
        return await downstream.lookup(key)

    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(await job.call("erp.create", downstream.send, reconcile=lookup, retry=FAST))

    app = app_with(database_url, handle)
    async with app:
        await app.enqueue("orders", {"n": 1}, job_id="order-1")
        await run_until(app, lambda: _n(done, 1), "the call resolved")
    assert downstream.sends == 1
    assert done[0]["reference"] == "found"
