"""A consumer's Limit is checked when it is registered, each mistake in one clear line."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import jobfence
from jobfence import BackOff, ConfigurationError, Limit, Rate


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Limit(), "Limit needs concurrency=N"),
        (lambda: Limit(concurrency=0), "Limit(concurrency) must be between 1"),
        (lambda: Limit(concurrency=2.5), "Limit(concurrency) must be a whole number"),
        (lambda: Limit(concurrency=True), "Limit(concurrency) must be a whole number"),
        (lambda: Limit(rate=60), "Limit(rate=...) must be a jobfence.Rate"),
        (lambda: Limit(concurrency=1, key="partner_id"), "key=lambda p: p['partner_id']"),
        (lambda: Limit(concurrency=1, key=42), 'must be None, "partner" or a callable'),
        (lambda: Rate(0, per=1), "Rate(count) must be between 1"),
        (lambda: Rate(5, per=timedelta(0)), "Rate(per=...) must be between 10 ms"),
        (lambda: Rate(5, per=timedelta(days=2)), "Rate(per=...) must be between 10 ms"),
        (lambda: Rate(5, per="1m"), "Rate(per=...) must be a timedelta or seconds"),
    ],
)
def test_a_bad_limit_is_refused_in_one_line(make: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make()
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_consumer_takes_a_limit_and_refuses_anything_else() -> None:
    app = jobfence.App("sqlite:///unused.db")
    limit = Limit(concurrency=5, rate=Rate(60, per=timedelta(minutes=1)), key="partner")

    @app.consumer("orders", limit=limit)
    async def handle(job: Any, tx: Any) -> None:
        pass

    assert app.consumers["orders"].limit is limit
    assert limit.describe() == "5 at once, 60 per 0:01:00, per partner"
    with pytest.raises(ConfigurationError, match=r"limit must be a jobfence\.Limit"):
        app.consumer("other", limit={"concurrency": 5})  # type: ignore[arg-type]


def test_the_key_of_a_job() -> None:
    decode = __import__("json").loads
    assert Limit(concurrency=1).key_of(b'{"partner_id": "acme"}', decode) == ""
    assert Limit(concurrency=1, key="partner").key_of(b'{"partner_id": "acme"}', decode) == "acme"
    assert Limit(concurrency=1, key="partner").key_of(b"{}", decode) == ""
    by_region = Limit(concurrency=1, key=lambda p: p["region"])
    assert by_region.key_of(b'{"region": "eu"}', decode) == "eu"
    # a key that cannot be read: the queue-wide key (logged), never a failure of the job
    assert by_region.key_of(b"{}", decode) == ""
    assert Limit(concurrency=1, key=lambda p: 7).key_of(b"{}", decode) == ""


def test_back_off_takes_seconds_or_a_retry_after() -> None:
    assert BackOff(30, reason="partner 429").delay == timedelta(seconds=30)
    assert BackOff(timedelta(minutes=1)).delay == timedelta(minutes=1)
    assert BackOff.from_retry_after("12").delay == timedelta(seconds=12)
    assert BackOff.from_retry_after(None, default=5).delay == timedelta(seconds=5)
    assert BackOff.from_retry_after("not a date", default=7).delay == timedelta(seconds=7)
    assert BackOff.from_retry_after("Wed, 21 Oct 2015 07:28:00 GMT").delay.total_seconds() < 0.01
    with pytest.raises(ValueError, match="must be above 0"):
        BackOff(0)
    with pytest.raises(ValueError, match="must be a number or a timedelta"):
        BackOff("30")  # type: ignore[arg-type]
