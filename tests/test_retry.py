"""Retry math (SPEC R1, R2) as pure functions: bounds of every attempt, growth, the cap."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from jobfence import Category, ConfigurationError, RetryPolicy
from jobfence.core.retry import DEFAULT_POLICY


def test_default_policy_is_five_retries_base_30s_cap_1h() -> None:
    assert (DEFAULT_POLICY.max_retries, DEFAULT_POLICY.base, DEFAULT_POLICY.cap) == (
        5,
        timedelta(seconds=30),
        timedelta(hours=1),
    )
    assert DEFAULT_POLICY.max_attempts == 6
    assert DEFAULT_POLICY.max_window() == timedelta(seconds=30 + 60 + 120 + 240 + 480)


@pytest.mark.parametrize(("retry", "ceiling"), [(1, 30), (2, 60), (3, 120), (4, 240), (5, 480)])
def test_every_default_delay_lies_in_half_ceiling_to_ceiling(retry: int, ceiling: int) -> None:
    policy = DEFAULT_POLICY
    assert policy.ceiling(retry) == timedelta(seconds=ceiling)
    assert policy.delay(retry, rng=lambda: 0.0) == timedelta(seconds=ceiling / 2)
    assert policy.delay(retry, rng=lambda: 1.0) == timedelta(seconds=ceiling)
    rng = random.Random(retry)
    for _ in range(2000):
        delay = policy.delay(retry, rng=rng.random)
        assert timedelta(seconds=ceiling / 2) <= delay <= timedelta(seconds=ceiling)


def test_intervals_never_shrink_below_the_cap() -> None:
    """The largest possible delay of retry k equals the smallest of retry k+1."""
    for k in range(1, 7):
        assert DEFAULT_POLICY.delay(k, rng=lambda: 1.0) <= DEFAULT_POLICY.delay(
            k + 1, rng=lambda: 0.0
        )
    rng = random.Random(42)
    for _ in range(500):
        delays = [DEFAULT_POLICY.delay(k, rng=rng.random) for k in range(1, 6)]
        assert delays == sorted(delays)


def test_the_cap_bounds_every_delay() -> None:
    assert DEFAULT_POLICY.ceiling(8) == timedelta(hours=1)  # 30 s * 2**7 = 3840 s > 1 h
    assert DEFAULT_POLICY.ceiling(10_000) == timedelta(hours=1)
    assert DEFAULT_POLICY.delay(50, rng=lambda: 1.0) == timedelta(hours=1)
    assert DEFAULT_POLICY.delay(50, rng=lambda: 0.0) == timedelta(minutes=30)


@pytest.mark.parametrize(
    ("category", "retries"),
    [
        (Category.TEMPORARY_ERROR, 5),
        (Category.TECHNICAL_ERROR, 2),
        (Category.AUTHENTICATION_ERROR, 1),
        (Category.VALIDATION_ERROR, 0),
        (Category.BUSINESS_ERROR, 0),
        (Category.INTEGRATION_ERROR, 0),
        (Category.AUTHORIZATION_ERROR, 0),
        (Category.NON_RETRYABLE_ERROR, 0),
    ],
)
def test_decisions_follow_the_taxonomy(category: Category, retries: int) -> None:
    decisions = [DEFAULT_POLICY.decide(category, attempt).retry for attempt in range(1, 8)]
    assert decisions == [True] * retries + [False] * (7 - retries)


def test_requested_delay_is_honoured_up_to_the_cap() -> None:
    decision = DEFAULT_POLICY.decide(
        Category.TEMPORARY_ERROR, 1, requested_delay=timedelta(seconds=5)
    )
    assert (decision.retry, decision.delay) == (True, timedelta(seconds=5))
    capped = DEFAULT_POLICY.decide(Category.TEMPORARY_ERROR, 1, requested_delay=timedelta(days=2))
    assert capped.delay == timedelta(hours=1)


def test_override_without_justification_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs a written reason"):
        RetryPolicy(max_retries=10)
    with pytest.raises(ConfigurationError, match="needs a written reason"):
        RetryPolicy(base=timedelta(seconds=1), justification="   ")


def test_override_with_justification_shows_it() -> None:
    policy = RetryPolicy(max_retries=8, justification="ERP maintenance windows last 2 hours")
    assert policy.is_override
    assert "override: ERP maintenance windows last 2 hours" in policy.describe()
    assert "8 retries" in policy.describe()


def test_default_values_need_no_justification() -> None:
    assert RetryPolicy() == DEFAULT_POLICY
    assert not RetryPolicy().is_override


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_retries": -1, "justification": "x"}, "must be >= 0"),
        ({"base": timedelta(0), "justification": "x"}, "positive"),
        ({"cap": timedelta(seconds=1), "justification": "x"}, "at least the base"),
    ],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
