"""Retry policy (SPEC R1, R2): pure functions of (policy, attempt, random source).

Attempts are numbered from 1. After failed attempt ``n`` the ``n``-th retry waits a delay
drawn uniformly from ``[d/2, d]`` with ``d = min(cap, base * 2**(n-1))``. Because the next
interval's lower bound ``d`` is the previous one's upper bound, intervals never shrink while
below the cap ("full jitter", drawn from ``[0, d]``, would let them shrink).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ..errors import Category, ConfigurationError, RetryMode

DEFAULT_BASE = timedelta(seconds=30)
DEFAULT_CAP = timedelta(hours=1)
DEFAULT_MAX_RETRIES = 5
DEFAULT_LIMITED_RETRIES = 2


@dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt."""

    retry: bool
    delay: timedelta = timedelta(0)


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often a failed job is retried.

    The default is the first attempt plus 5 retries, base 30 s, cap 1 h. Anything else is an
    override and must say why (``justification=``), so the reason travels with the policy.
    ``limited_retries`` bounds TECHNICAL_ERROR (unknown failures), which the taxonomy retries
    only a little.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    base: timedelta = DEFAULT_BASE
    cap: timedelta = DEFAULT_CAP
    limited_retries: int = DEFAULT_LIMITED_RETRIES
    justification: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.limited_retries < 0:
            raise ConfigurationError("retry counts must be >= 0")
        if self.base <= timedelta(0):
            raise ConfigurationError("retry base must be a positive duration")
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry cap ({self.cap}) must be at least the base ({self.base})"
            )
        if self.is_override and not (self.justification and self.justification.strip()):
            raise ConfigurationError(
                "a retry policy that differs from the default (5 retries, base 30s, cap 1h, "
                f"2 limited retries) needs a written reason: RetryPolicy(..., justification='…'); "
                f"got {self.describe()}"
            )

    @property
    def is_override(self) -> bool:
        return (self.max_retries, self.base, self.cap, self.limited_retries) != (
            DEFAULT_MAX_RETRIES,
            DEFAULT_BASE,
            DEFAULT_CAP,
            DEFAULT_LIMITED_RETRIES,
        )

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    def retries_for(self, category: Category) -> int:
        mode = category.info.retry
        if mode is RetryMode.POLICY:
            return self.max_retries
        if mode is RetryMode.LIMITED:
            return min(self.limited_retries, self.max_retries)
        if mode is RetryMode.TOKEN_REFRESH:
            return min(1, self.max_retries)
        return 0

    def ceiling(self, retry_number: int) -> timedelta:
        """Upper bound ``d`` of the delay before retry ``retry_number`` (1-based)."""
        if retry_number < 1:
            raise ValueError("retry numbers start at 1")
        # compare in float seconds: base * 2**n overflows timedelta long before it overflows
        # a float, and the cap is reached long before either
        grown = self.base.total_seconds() * 2.0 ** min(retry_number - 1, 1000)
        if grown >= self.cap.total_seconds():
            return self.cap
        return self.base * (1 << (retry_number - 1))

    def delay(self, retry_number: int, rng: Callable[[], float] = random.random) -> timedelta:
        """The delay before retry ``retry_number``: uniform in ``[d/2, d]``."""
        d = self.ceiling(retry_number)
        return d / 2 + (d / 2) * rng()

    def decide(
        self,
        category: Category,
        attempt: int,
        *,
        requested_delay: timedelta | None = None,
        rng: Callable[[], float] = random.random,
    ) -> Decision:
        """Retry or give up after failed attempt ``attempt`` (1-based) of this category."""
        if attempt > self.retries_for(category):
            return Decision(retry=False)
        if requested_delay is not None:
            return Decision(retry=True, delay=min(requested_delay, self.cap))
        return Decision(retry=True, delay=self.delay(attempt, rng))

    def max_window(self) -> timedelta:
        """Longest possible time from the first failure to the dead letter (sum of ceilings)."""
        total = timedelta(0)
        for n in range(1, self.max_retries + 1):
            total += self.ceiling(n)
        return total

    def describe(self) -> str:
        text = (
            f"{self.max_retries} retries, base {_fmt(self.base)}, cap {_fmt(self.cap)}, "
            f"{self.limited_retries} limited retries, window ≤ {_fmt(self.max_window())}"
        )
        if self.justification:
            text += f" — override: {self.justification}"
        return text


def _fmt(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


DEFAULT_POLICY = RetryPolicy()
