"""Review of dead letters (SPEC D2, D3): states enforced by the database, discard needs a
reason, racing decisions, replay with the same job_id, replay chains, scopes. Both stores."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest

from jobfence import App, Job, NonRetryableError, RetryPolicy, ReviewConflict, Tx
from jobfence.review import deadletters as dl
from jobfence.review import stats as counts
from jobfence.review.validation import MAX_PAGE
from jobfence.runtime.harness import Outcome

from ..helpers import RunningWorker, credit, eventually, query, scalar, table
from .conftest import letter_params, opened, seed_letters

ALICE = dl.Actor("alice", "library")
BOB = dl.Actor("bob", "cli")
NO_RETRY = RetryPolicy(
    max_retries=0, justification="tests: fail straight to a dead letter to test replays"
)
DB_ERRORS = (psycopg.Error, sqlite3.Error)


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def ph(url: str) -> str:
    return "%s" if url.startswith("postgresql") else "?"


async def statuses(url: str) -> list[tuple[Any, ...]]:
    return await query(url, f"SELECT id, status FROM {table(url, 'dead_letters')} ORDER BY id")


async def audit_rows(url: str) -> list[tuple[Any, ...]]:
    return await query(
        url,
        f"SELECT dead_letter_id, actor, via, action, reason FROM {table(url, 'audit_log')} "
        "ORDER BY id",
    )


async def test_review_states_are_enforced_by_the_database(database_url: str) -> None:
    """Even raw SQL cannot discard without a reason, decide without who/when, undo a
    decision, or edit the audit log."""
    url = database_url
    first, second = await seed_letters(url, [letter_params(dialect(url), j) for j in ("a", "b")])
    letters, audit, p = table(url, "dead_letters"), table(url, "audit_log"), ph(url)
    now = "now()" if url.startswith("postgresql") else "1.0"
    for reason in ("NULL", "''", "' \t\n '"):
        with pytest.raises(DB_ERRORS):
            await query(
                url,
                f"UPDATE {letters} SET status = 'discarded', reviewed_at = {now}, "
                f"reviewed_by = 'x', review_reason = {reason} WHERE id = {p}",
                (first,),
            )
    with pytest.raises(DB_ERRORS):  # a decision needs who and when
        await query(url, f"UPDATE {letters} SET status = 'replayed' WHERE id = {p}", (first,))
    with pytest.raises(DB_ERRORS):  # an unknown state
        await query(url, f"UPDATE {letters} SET status = 'ignored' WHERE id = {p}", (first,))

    async with opened(url) as db:
        await dl.discard(db, first, actor=ALICE, reason="duplicate of order 7")
    with pytest.raises(DB_ERRORS):  # final: never back to pending
        await query(
            url,
            f"UPDATE {letters} SET status = 'pending_review', reviewed_at = NULL, "
            f"reviewed_by = NULL, review_reason = NULL WHERE id = {p}",
            (first,),
        )
    with pytest.raises(DB_ERRORS):  # nor rewritten
        await query(url, f"UPDATE {letters} SET review_reason = 'other' WHERE id = {p}", (first,))
    with pytest.raises(DB_ERRORS):
        await query(url, f"UPDATE {audit} SET reason = 'rewritten'")
    with pytest.raises(DB_ERRORS):
        await query(url, f"DELETE FROM {audit}")
    assert await statuses(url) == [(first, "discarded"), (second, "pending_review")]
    assert await audit_rows(url) == [
        (first, "alice", "library", "dead_letter.discard", "duplicate of order 7")
    ]


@pytest.mark.parametrize("reason", [None, "", "   ", " \t\n "])
async def test_discard_without_a_reason_is_refused_and_changes_nothing(
    database_url: str, reason: str | None
) -> None:
    """No reason, an empty one or whitespace only: refused, the letter stays pending, no audit."""
    [letter] = await seed_letters(database_url, [letter_params(dialect(database_url), "j1")])
    async with opened(database_url) as db:
        with pytest.raises(dl.InvalidRequest, match="a discard needs a reason"):
            await dl.discard(db, letter, actor=ALICE, reason=reason)  # type: ignore[arg-type]
    assert await statuses(database_url) == [(letter, "pending_review")]
    assert await audit_rows(database_url) == []


async def test_discard_records_who_when_and_why(database_url: str) -> None:
    """The letter keeps the decision (who, when, the reason trimmed) and the audit log too."""
    [letter] = await seed_letters(database_url, [letter_params(dialect(database_url), "j1")])
    async with opened(database_url) as db:
        done = await dl.discard(db, letter, actor=BOB, reason="  order cancelled, OPS-12 \n")
        with pytest.raises(ReviewConflict, match=f"dead letter {letter} was already discarded"):
            await dl.discard(db, letter, actor=ALICE, reason="again")
        with pytest.raises(dl.NotFound):
            await dl.discard(db, 999_999, actor=ALICE, reason="nothing")
    assert (done.status, done.reviewed_by, done.review_reason) == (
        "discarded",
        "bob",
        "order cancelled, OPS-12",
    )
    assert done.reviewed_at is not None
    assert await audit_rows(database_url) == [
        (letter, "bob", "cli", "dead_letter.discard", "order cancelled, OPS-12")
    ]


async def test_a_replay_and_a_discard_racing_on_one_letter_exactly_one_wins(
    database_url: str,
) -> None:
    """30 letters, each replayed and discarded at the same moment from two connections: for
    each exactly one action succeeds, the other gets ReviewConflict, one audit row each."""
    url = database_url
    ids = await seed_letters(url, [letter_params(dialect(url), f"race-{i}") for i in range(30)])
    app = App(url, auto_migrate=True)
    async with app:
        outcomes: dict[int, tuple[str, str]] = {}
        for letter in ids:
            replayed, discarded = await asyncio.gather(
                dl.replay(app.db, app.transport, letter, actor=ALICE),
                dl.discard(app.db, letter, actor=BOB, reason="not needed"),
                return_exceptions=True,
            )
            winners = [r for r in (replayed, discarded) if not isinstance(r, BaseException)]
            losers = [r for r in (replayed, discarded) if isinstance(r, BaseException)]
            assert len(winners) == 1, (replayed, discarded)
            assert len(losers) == 1, losers
            assert isinstance(losers[0], ReviewConflict), losers
            won = "replayed" if isinstance(replayed, dl.ItemResult) else "discarded"
            outcomes[letter] = (won, str(losers[0]))
    rows = dict(await statuses(url))
    assert {letter: rows[letter] for letter in ids} == {k: v[0] for k, v in outcomes.items()}
    for letter, (won, message) in outcomes.items():
        assert f"dead letter {letter} was already {won}" in message
    audit = await audit_rows(url)
    assert sorted(row[0] for row in audit) == sorted(ids)  # one audit row per letter
    replayed_jobs = [v for v in outcomes.values() if v[0] == "replayed"]
    jobs = await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}")
    assert jobs == len(replayed_jobs)  # discarded ones republished nothing


async def test_replay_republishes_the_same_job_id_payload_and_correlation_id(
    database_url: str,
) -> None:
    """The queued job is byte-for-byte the dead letter's, even a payload that is not UTF-8."""
    raw = b"\xff\xfe not utf-8 \x00 nul"
    [letter] = await seed_letters(
        database_url,
        [letter_params(dialect(database_url), "po-77", payload=raw, correlation_id="req-9")],
    )
    app = App(database_url, auto_migrate=True)
    async with app:
        result = await dl.replay(app.db, app.transport, letter, actor=ALICE, reason="ERP fixed")
    assert result == dl.ItemResult(letter, "published", None)
    jobs = table(database_url, "jobs")
    rows = await query(
        database_url, f"SELECT queue, job_id, correlation_id, payload, attempts FROM {jobs}"
    )
    assert [(q, j, c, bytes(p), a) for q, j, c, p, a in rows] == [
        ("points.credit", "po-77", "req-9", raw, 0)
    ]
    assert await audit_rows(database_url) == [
        (letter, "alice", "library", "dead_letter.replay", "ERP fixed")
    ]


async def test_replaying_a_dead_letter_with_the_same_job_id_produces_no_second_effect(
    ledger: str,
) -> None:
    """Seed acceptance: a job fails and is dead-lettered; a later delivery of the same job_id
    applies it; replaying the letter then applies nothing twice — whether the replay sees the
    fence (already_applied) or republishes and the consumer's fence skips it."""
    app = App(ledger, auto_migrate=True)
    broken = {"on": True}

    @app.consumer("points.credit", retry=NO_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        if broken["on"]:
            raise NonRetryableError("partner API refused the credit")
        await credit(tx, job.job_id, job.payload["member_id"], job.payload["points"])

    async with app:
        await app.enqueue("points.credit", {"member_id": "m1", "points": 5}, job_id="credit-1")
        await app.enqueue("points.credit", {"member_id": "m2", "points": 7}, job_id="credit-2")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.outcomes[Outcome.DEAD] == 2, what="2 dead letters")
        letters = {x.job_id: x.id for x in await dl.letters(app.db)}
        broken["on"] = False
        # another delivery of credit-1 arrives and is applied
        await app.enqueue("points.credit", {"member_id": "m1", "points": 5}, job_id="credit-1")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.outcomes[Outcome.PROCESSED] == 1, what="applied")
        first = await dl.replay(app.db, app.transport, letters["credit-1"], actor=ALICE)
        second = await dl.replay(app.db, app.transport, letters["credit-2"], actor=ALICE)
        # and a replayed copy enqueued by hand again (what a duplicate publish would do)
        await app.enqueue("points.credit", {"member_id": "m2", "points": 7}, job_id="credit-2")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled == 2, what="both copies handled")
        assert w.stats.outcomes[Outcome.PROCESSED] == 1
        assert w.stats.outcomes[Outcome.DUPLICATE] == 1
    assert first.outcome == "already_applied"
    assert second.outcome == "published"
    rows = await query(ledger, "SELECT job_id, member_id, points FROM ledger ORDER BY job_id")
    assert rows == [("credit-1", "m1", 5), ("credit-2", "m2", 7)]
    assert await statuses(ledger) == sorted(
        [(letters["credit-1"], "replayed"), (letters["credit-2"], "replayed")]
    )


async def test_a_replayed_job_that_fails_again_is_a_new_pending_letter_linked_to_the_last(
    database_url: str,
) -> None:
    """Replay → fails again → a new pending letter whose previous_id is the replayed one; the
    replayed letter lists it as its follower."""
    app = App(database_url, auto_migrate=True)

    @app.consumer("erp.send", retry=NO_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        raise NonRetryableError("ERP rejected the order: supplier blocked")

    async with app:
        await app.enqueue("erp.send", {"po": 1}, job_id="po-1", correlation_id="req-1")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.outcomes[Outcome.DEAD] == 1, what="first letter")
            [first] = await dl.letters(app.db, status="pending_review")
            await dl.replay(app.db, app.transport, first.id, actor=ALICE)
            await eventually(lambda: w.stats.outcomes[Outcome.DEAD] == 2, what="second letter")
            [second] = await dl.letters(app.db, status="pending_review")
            await dl.replay(app.db, app.transport, second.id, actor=BOB)
            await eventually(lambda: w.stats.outcomes[Outcome.DEAD] == 3, what="third letter")
        [third] = await dl.letters(app.db, status="pending_review")
        view = await dl.show(app.db, first.id, actor=ALICE)
        view2 = await dl.show(app.db, second.id, actor=ALICE)
    assert (second.previous_id, second.job_id, second.correlation_id) == (first.id, "po-1", "req-1")
    assert (third.previous_id, third.status) == (second.id, "pending_review")
    assert first.previous_id is None
    assert view.followers == [second.id]
    assert view2.followers == [third.id]
    assert [(e.actor, e.action) for e in view.audit] == [("alice", "dead_letter.replay")]
    assert await statuses(database_url) == [
        (first.id, "replayed"),
        (second.id, "replayed"),
        (third.id, "pending_review"),
    ]


async def test_a_letter_with_a_truncated_payload_cannot_be_replayed(database_url: str) -> None:
    """Replaying half a payload would be wrong: refused with a conflict; discard still works."""
    [letter] = await seed_letters(
        database_url, [letter_params(dialect(database_url), "big", truncated=True)]
    )
    app = App(database_url, auto_migrate=True)
    async with app:
        with pytest.raises(ReviewConflict, match="payload was truncated"):
            await dl.replay(app.db, app.transport, letter, actor=ALICE)
        await dl.discard(app.db, letter, actor=ALICE, reason="recovered from the ERP export")
    assert await scalar(database_url, f"SELECT count(*) FROM {table(database_url, 'jobs')}") == 0
    assert await statuses(database_url) == [(letter, "discarded")]


async def test_a_partner_scope_sees_and_acts_on_its_own_letters_only(database_url: str) -> None:
    """The partner comes from the payload's partner_id; another partner's letter is "not
    found" for reading, replaying and discarding; lists and stats are filtered."""
    d = dialect(database_url)
    acme, globex, nobody = await seed_letters(
        database_url,
        [
            letter_params(d, "a", payload=b'{"partner_id": "acme", "po": 1}'),
            letter_params(d, "g", payload=b'{"partner_id": "globex", "po": 2}'),
            letter_params(d, "n", payload=b'{"po": 3}'),
        ],
    )
    acme_ops = dl.Actor("acme-ops", "api", partner="acme")
    app = App(database_url, auto_migrate=True)
    async with app:
        page = await dl.search(app.db, dl.Filter(), actor=acme_ops)
        everyone = await dl.search(app.db, dl.Filter(), actor=ALICE)
        for letter in (globex, nobody):
            with pytest.raises(dl.NotFound):
                await dl.show(app.db, letter, actor=acme_ops)
            with pytest.raises(dl.NotFound):
                await dl.replay(app.db, app.transport, letter, actor=acme_ops)
            with pytest.raises(dl.NotFound):
                await dl.discard(app.db, letter, actor=acme_ops, reason="not mine")
        shown = await dl.show(app.db, acme, actor=acme_ops)
        found = await counts.stats(app.db, actor=acme_ops)
    assert [x.id for x in page.items] == [acme]
    assert [x.partner for x in everyone.items] == [None, "globex", "acme"]
    assert shown.letter.partner == "acme"
    assert found.letters == [
        {
            "queue": "points.credit",
            "category": "TEMPORARY_ERROR",
            "status": "pending_review",
            "letters": 1,
        }
    ]
    assert found.queue_depth is None
    assert await statuses(database_url) == [
        (acme, "pending_review"),
        (globex, "pending_review"),
        (nobody, "pending_review"),
    ]


async def test_search_filters_and_pages_without_payloads(database_url: str) -> None:
    """Filters combine; pages follow the cursor to the end; summaries carry no payload."""
    d = dialect(database_url)
    ids = await seed_letters(
        database_url,
        [letter_params(d, f"t-{i}", error="TemporaryError: ERP 503 50%_off") for i in range(5)]
        + [letter_params(d, "v-1", category="VALIDATION_ERROR", error="bad schema", queue="q2")],
    )
    async with opened(database_url) as db:
        by_error = await dl.search(db, dl.Filter(error="503 50%_OFF"), actor=ALICE)
        by_queue = await dl.search(db, dl.Filter(queue="q2"), actor=ALICE)
        none = await dl.search(db, dl.Filter(error="50%x"), actor=ALICE)
        pages, cursor = [], None
        while True:
            page = await dl.search(
                db, dl.Filter(queue="points.credit"), actor=ALICE, limit=2, before=cursor
            )
            pages.append([x.id for x in page.items])
            cursor = page.next_cursor
            if cursor is None:
                break
        with pytest.raises(dl.InvalidRequest):
            await dl.search(db, dl.Filter(), actor=ALICE, limit=MAX_PAGE + 1)
        with pytest.raises(dl.InvalidRequest):
            await dl.search(db, dl.Filter(category="NOPE"), actor=ALICE)
    assert [x.id for x in by_error.items] == list(reversed(ids[:5]))
    assert [x.id for x in by_queue.items] == [ids[5]]
    assert none.items == []
    assert pages == [[ids[4], ids[3]], [ids[2], ids[1]], [ids[0]]]
    assert all(x.payload is None for x in by_error.items)
    assert "payload" not in by_error.items[0].summary()


async def test_a_rare_queues_first_page_is_an_index_range_read(pg_database: str) -> None:
    """Issue 16 §3: the first page of a queue holding 0.1 % of 100 000 letters reads its 50
    newest through ``dead_letters_queue_id_idx`` (in id order), not the primary key over
    ~50 000 letters nor every letter of the queue and a sort."""
    url = pg_database
    await query(
        url,
        "INSERT INTO core.dead_letters (queue, consumer, job_id, payload, payload_size, "
        "attempts, error_category, last_error, status, reviewed_at, reviewed_by) "
        "SELECT CASE WHEN mod(g, 1000) = 0 THEN 'rare' ELSE 'common' END, 'c', 'j-' || g, "
        "'\\x7b7d', 2, 1, 'TEMPORARY_ERROR', 'boom', 'replayed', now(), 'ops' "
        "FROM generate_series(1, 100000) AS g",
    )
    await query(url, "ANALYZE core.dead_letters")
    async with opened(url) as db:
        sql = db.sql["dl_search"]  # type: ignore[attr-defined]
        flt = dl.Filter(queue="rare").check()
        params = {**flt.params(db, None), "before": None, "limit": 50}
        page = await dl.search(db, dl.Filter(queue="rare"), actor=ALICE)
    plan = "\n".join(r[0] for r in await query(url, f"EXPLAIN {sql}", params))
    assert "dead_letters_queue_id_idx" in plan, plan
    assert "Sort" not in plan, plan
    assert [x.job_id for x in page.items] == [f"j-{g}" for g in range(100000, 50000, -1000)]
