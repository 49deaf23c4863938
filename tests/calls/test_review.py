"""Calls for operators (SPEC E4) through the service layer, on both stores: jobs parked on
an in-doubt call are listed (job, step, key, age, last error; filters, keyset pages, partner
scope), settled as applied (the job goes on with the reference, the downstream is not called
again) or not applied (the job calls again with the same key), each settlement audited with
the replay of the parked letter; and every refusal says what to fix."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from jobfence.calls import default_key, review
from jobfence.calls.review import CallFilter
from jobfence.errors import InvalidRequest, NotFound, ReviewConflict
from jobfence.review.deadletters import Actor

from ..helpers import query, table
from .support import QUEUE, STEP, Orders

OTTO = Actor("otto", "cli")
ACME = Actor("acme-ops", "api", "acme")


async def _letters(url: str) -> list[tuple[object, ...]]:
    return await query(
        url,
        f"SELECT job_id, status, error_code, reviewed_by FROM {table(url, 'dead_letters')} "
        "ORDER BY id",
    )


async def test_in_doubt_calls_are_listed_with_job_step_key_age_and_error(
    database_url: str,
) -> None:
    orders = Orders(database_url)
    async with orders.app:
        await orders.park({"po-1": "acme", "po-2": "globex", "po-3": None})
        calls = await review.ledger_db(orders.app.ledger, orders.app.db)
        page = await review.list_calls(calls, actor=OTTO)
        acme = await review.list_calls(calls, actor=ACME)
        first = await review.list_calls(calls, actor=OTTO, limit=2)
        rest = await review.list_calls(calls, actor=OTTO, limit=2, after=first.next_cursor)
        by_job = await review.list_calls(calls, CallFilter(job_id="po-2"), actor=OTTO)
        other_step = await review.list_calls(calls, CallFilter(step="mail.send"), actor=OTTO)
        by_queue = await review.list_calls(calls, CallFilter(queue=QUEUE), actor=OTTO)
        old = await review.list_calls(calls, CallFilter(older_than=timedelta(hours=1)), actor=OTTO)
        succeeded = await review.list_calls(calls, CallFilter(state="succeeded"), actor=OTTO)
        with pytest.raises(InvalidRequest, match="unknown call state 'doubtful'"):
            await review.list_calls(calls, CallFilter(state="doubtful"), actor=OTTO)
    # oldest first (by id: the jobs ran two at a time, in either order)
    assert sorted(c.job_id for c in page.items) == ["po-1", "po-2", "po-3"]
    assert [c.id for c in page.items] == sorted(c.id for c in page.items)
    [call] = [c for c in page.items if c.job_id == "po-1"]
    assert (call.step, call.key, call.state, call.queue, call.consumer) == (
        STEP,
        default_key("po-1", STEP),
        "in_doubt",
        QUEUE,
        QUEUE,  # the consumer is named after its queue
    )
    assert call.last_error is not None
    assert "read timeout" in call.last_error
    assert 0 <= call.age_seconds < 60
    assert call.partner == "acme"
    assert [c.job_id for c in acme.items] == ["po-1"]
    assert [c.id for c in first.items + rest.items] == [c.id for c in page.items]
    assert rest.next_cursor is None
    assert [c.job_id for c in by_job.items] == ["po-2"]
    assert other_step.items == []
    assert len(by_queue.items) == 3
    assert old.items == []
    assert succeeded.items == []


async def test_settled_as_applied_the_job_goes_on_with_the_reference_and_no_second_call(
    database_url: str,
) -> None:
    orders = Orders(database_url)
    key = default_key("po-1", STEP)
    async with orders.app:
        await orders.park({"po-1": "acme"})
        calls = await review.ledger_db(orders.app.ledger, orders.app.db)
        [call] = (await review.list_calls(calls, actor=OTTO)).items
        view = await review.show_call(orders.app.db, calls, call.id, actor=OTTO)
        done = await review.settle_call(
            orders.app.db,
            calls,
            orders.app.transport,
            call.id,
            actor=ACME,
            outcome="applied",
            reference="PO-1",
            reason="order PO-1 found in the ERP by its key, OPS-7",
        )
        await orders.run(lambda: "po-1" in orders.results, "the job going on")
        after = await review.show_call(orders.app.db, calls, call.id, actor=OTTO)
        with pytest.raises(ReviewConflict, match="already settled as applied by acme-ops"):
            await review.settle_call(
                orders.app.db,
                calls,
                orders.app.transport,
                call.id,
                actor=OTTO,
                outcome="not_applied",
                reason="second thoughts",
            )
    assert view.dead_letter_id is not None
    assert view.call.state == "in_doubt"
    assert done.call.state == "applied"
    assert (done.call.reference, done.call.settled_by) == ("PO-1", "acme-ops")
    assert done.call.settled_reason == "order PO-1 found in the ERP by its key, OPS-7"
    assert done.replay is not None
    assert (done.replay.dead_letter_id, done.replay.outcome) == (view.dead_letter_id, "published")
    # the step answered from the settlement; the downstream got one request, ever
    assert orders.results["po-1"] == {"settled": "applied", "reference": "PO-1"}
    assert orders.downstream.sends[key] == 1
    assert orders.downstream.effects[key] == 1
    assert after.dead_letter_id is None
    assert await _letters(database_url) == [("po-1", "replayed", "UNKNOWN_OUTCOME", "acme-ops")]
    audit = await query(
        database_url,
        f"SELECT action, actor, via, partner, dead_letter_id, reason, details, old_state, "
        f"new_state FROM {table(database_url, 'audit_log')} ORDER BY id",
    )
    assert [(a[0], a[1], a[2], a[3], a[4]) for a in audit] == [
        ("dead_letter.replay", "acme-ops", "api", "acme", view.dead_letter_id),
        ("call.settle", "acme-ops", "api", "acme", view.dead_letter_id),
    ]
    settle = audit[1]
    details = settle[6] if isinstance(settle[6], dict) else json.loads(settle[6])
    assert details == {
        "call": call.id,
        "job_id": "po-1",
        "consumer": QUEUE,
        "queue": QUEUE,
        "step": STEP,
        "key": key,
        "reference": "PO-1",
        "replay": "published",
    }
    assert (settle[5], settle[7], settle[8]) == (
        "order PO-1 found in the ERP by its key, OPS-7",
        "in_doubt",
        "applied",
    )


async def test_settled_as_not_applied_the_job_calls_again_with_the_same_key(
    database_url: str,
) -> None:
    orders = Orders(database_url)
    key = default_key("po-1", STEP)
    async with orders.app:
        await orders.park({"po-1": None}, lost=False)  # the request never reached it
        calls = await review.ledger_db(orders.app.ledger, orders.app.db)
        [call] = (await review.list_calls(calls, actor=OTTO)).items
        done = await review.settle_call(
            orders.app.db,
            calls,
            orders.app.transport,
            call.id,
            actor=OTTO,
            outcome="not_applied",
            reason="no order with this key in the ERP",
        )
        await orders.run(lambda: "po-1" in orders.results, "the job calling again")
        after = await review.show_call(orders.app.db, calls, call.id, actor=OTTO)
    assert done.call.state == "not_applied"
    assert done.call.reference is None
    assert orders.downstream.sends[key] == 2  # once lost, once again with the same key
    assert orders.downstream.effects == {key: 1}
    assert orders.results["po-1"] == {"reference": "PO-1"}
    assert (after.call.state, after.call.attempts) == ("succeeded", 2)
    assert after.outcome == {"reference": "PO-1"}


async def test_refusals_say_what_to_fix(database_url: str) -> None:
    orders = Orders(database_url)
    async with orders.app:
        await orders.park({"po-1": "globex"})
        db, transport = orders.app.db, orders.app.transport
        calls = await review.ledger_db(orders.app.ledger, db)
        [call] = (await review.list_calls(calls, actor=OTTO)).items

        async def settle(actor: Actor = OTTO, **kwargs: object) -> object:
            args: dict[str, object] = {"outcome": "applied", "reference": "X", "reason": "r"}
            args.update(kwargs)
            return await review.settle_call(
                db, calls, transport, call.id if "id" not in args else args.pop("id"),  # type: ignore[arg-type]
                actor=actor, **args,  # type: ignore[arg-type]
            )  # fmt: skip

        with pytest.raises(InvalidRequest, match="needs a reason"):
            await settle(reason="   ")
        with pytest.raises(InvalidRequest, match="needs the downstream's reference"):
            await settle(reference=None)
        with pytest.raises(InvalidRequest, match="has no downstream reference"):
            await settle(outcome="not_applied")
        with pytest.raises(InvalidRequest, match="settle a call as applied or not_applied"):
            await settle(outcome="maybe")
        with pytest.raises(NotFound, match=f"no call {call.id}"):
            await settle(actor=ACME)  # another partner's call
        with pytest.raises(NotFound, match=f"no call {call.id}"):
            await review.show_call(db, calls, call.id, actor=ACME)
        with pytest.raises(NotFound, match="no call 999999"):
            await settle(id=999999)
        with pytest.raises(InvalidRequest, match="the call id must be a whole number"):
            await settle(id=0)
        # nothing of it changed anything: still in doubt, still parked, nothing audited
        view = await review.show_call(db, calls, call.id, actor=OTTO)
        assert view.call.state == "in_doubt"
        assert view.dead_letter_id is not None
        assert await query(database_url, f"SELECT * FROM {table(database_url, 'audit_log')}") == []
        # a call with an outcome is not settled
        await settle(reason="found it")
        await orders.run(lambda: "po-1" in orders.results, "the job going on")
        await orders.app.enqueue(QUEUE, {"order": "po-2"}, job_id="po-2")
        await orders.run(lambda: "po-2" in orders.results, "a call that answers")
        [fine] = (await review.list_calls(calls, CallFilter(state="succeeded"), actor=OTTO)).items
        with pytest.raises(ReviewConflict, match=r"has a recorded outcome \(succeeded\)"):
            await review.settle_call(
                db, calls, transport, fine.id, actor=OTTO, outcome="not_applied", reason="r"
            )
