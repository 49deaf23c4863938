"""The poison corpus (SPEC R3, D1b): each bad payload becomes exactly one dead letter with its
exact bytes, and the worker keeps running."""

from __future__ import annotations

import pydantic

from jobfence import App, Job, Tx
from jobfence.review import deadletters
from jobfence.review.letters import DEFAULT_PAYLOAD_LIMIT, get_letter

from .helpers import RunningWorker, credit, eventually, query

TEN_MB = DEFAULT_PAYLOAD_LIMIT
SQL_METACHARACTERS = "'; DROP TABLE core.processed_jobs; -- \" \\ % _ $1 ? :x /* */ \x7f"


def _big(size: int) -> bytes:
    head, tail = b'{"member_id": "', b'", "points": "many"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


CORPUS: dict[str, bytes] = {
    "invalid-json": b'{"member_id": "m-1", "points": ',
    "invalid-utf8": b'{"member_id": "\xff\xfe\xfd", "points": 1}',
    "nul-bytes": b'{"member_id": "m\x00-1", "points": 1}\x00\x00',
    "nul-escaped": b'{"member_id": "m\\u0000", "points": "1x"}',
    "ten-mb": _big(TEN_MB),
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "empty": b"",
    "not-an-object": b"[1, 2, 3]",
    SQL_METACHARACTERS: b"definitely not json",
}


class Credit(pydantic.BaseModel):
    member_id: str
    points: int


async def test_poison_corpus_each_becomes_one_dead_letter_with_exact_bytes(ledger: str) -> None:
    app = App(ledger, auto_migrate=True)
    called: list[str] = []

    @app.consumer("points.credit", schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        called.append(job.job_id)
        await credit(tx, job.job_id, job.payload.member_id, job.payload.points)

    async with app:
        for job_id, raw in CORPUS.items():
            await app.enqueue("points.credit", raw, job_id=job_id)
        async with RunningWorker(app, concurrency=4) as w:
            await eventually(lambda: w.stats.handled == len(CORPUS), timeout=60, what="corpus")
            # the worker is still alive and working
            await app.enqueue("points.credit", {"member_id": "ok", "points": 3}, job_id="after")
            await eventually(lambda: w.stats.handled == len(CORPUS) + 1, what="valid job")
        letters = await deadletters.letters(app.db, limit=100)
        assert sorted(dl.job_id for dl in letters) == sorted(CORPUS)
        for summary in letters:
            letter = await get_letter(app.db, summary.id)
            assert letter is not None
            assert letter.payload == CORPUS[letter.job_id], letter.job_id
            assert (letter.attempts, letter.error_category, letter.payload_size) == (
                1,
                "VALIDATION_ERROR",
                len(CORPUS[letter.job_id]),
            )
            assert letter.payload_truncated is False
    assert called == ["after"]
    assert await query(ledger, "SELECT job_id FROM ledger") == [("after",)]


async def test_payload_over_the_limit_is_kept_truncated_and_says_so(database_url: str) -> None:
    """A payload larger than the limit is still dead-lettered: its first `limit` bytes, its
    real size, and the truncated flag."""
    app = App(database_url, auto_migrate=True, payload_limit=64 * 1024)

    @app.consumer("q", schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        raise AssertionError("never called")

    raw = _big(64 * 1024 + 1)
    async with app:
        await app.enqueue("q", raw, job_id="huge")
        async with RunningWorker(app):
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
        letter = await get_letter(app.db, letters[0].id)
    assert letter is not None
    assert letter.payload == raw[: 64 * 1024]
    assert (letter.payload_size, letter.payload_truncated) == (len(raw), True)


async def test_same_delivery_dead_lettered_twice_keeps_one_letter(database_url: str) -> None:
    """Writing a dead letter is idempotent: a second write for the same pending job is absorbed."""
    from jobfence.core.jobs import Delivery
    from jobfence.errors import Category
    from jobfence.review.letters import write as write_letter

    app = App(database_url, auto_migrate=True)
    async with app:
        delivery = Delivery(queue="q", job_id="j-1", payload=b"\x00raw", attempt=3)
        first, created = await write_letter(
            app.db, delivery, "q", Category.TECHNICAL_ERROR, "boom", None, ack=False
        )
        second, again = await write_letter(
            app.db, delivery, "q", Category.TECHNICAL_ERROR, "boom", None, ack=False
        )
        letters = await deadletters.letters(app.db)
    assert first is not None
    assert (created, second, again) == (True, first, False)
    assert [(dl.id, dl.job_id, dl.attempts) for dl in letters] == [(first, "j-1", 3)]
