"""Flow control's values: a consumer's :class:`Limit` (concurrency and :class:`Rate` per key).

``app.consumer("orders", limit=Limit(concurrency=5, rate=Rate(60, per=timedelta(minutes=1)),
key="partner"))``: at most 5 jobs of one key run at once and at most 60 start in any minute,
across every worker of every host (docs/flow-control.md). The state lives in the database
(:mod:`jobfence.runtime.flow`, the database queue's claim); these are only the settings,
checked once, each mistake said in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from .jobs import partner_of

log = logging.getLogger("jobfence.flow")

#: the key of a limit without ``key`` (the whole queue is one key), and of a job whose key
#: cannot be read (the key callable raised, or returned no usable string)
QUEUE_KEY = ""
#: the longest key kept (the columns' CHECK); a longer one is refused like an unreadable one
MAX_KEY_LENGTH = 200
#: the longest ``per`` of a rate: its starts are kept that long
MAX_PER = timedelta(days=1)
#: the largest concurrency or rate count (a bigger one is no limit at all)
MAX_COUNT = 1_000_000

KeyFunction = Callable[[Any], str]


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"{name} must be a whole number of jobs, got {type(value).__name__} {value!r}"
        )
    if not 1 <= value <= MAX_COUNT:
        raise ConfigurationError(f"{name} must be between 1 and {MAX_COUNT}, got {value}")
    return value


@dataclass(frozen=True)
class Rate:
    """At most ``count`` job starts per key in any window of ``per`` (a sliding window: no
    window of that length ever holds more, wherever it starts)."""

    count: int
    per: timedelta

    def __init__(self, count: int, per: timedelta | float) -> None:
        _count("Rate(count)", count)
        if isinstance(per, bool) or not isinstance(per, timedelta | int | float):
            raise ConfigurationError(
                f"Rate(per=...) must be a timedelta or seconds, got {type(per).__name__}"
            )
        if not isinstance(per, timedelta):
            per = timedelta(seconds=per)
        if not timedelta(milliseconds=10) <= per <= MAX_PER:
            raise ConfigurationError(
                f"Rate(per=...) must be between 10 ms and {MAX_PER}, got {per}"
            )
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "per", per)

    @property
    def seconds(self) -> float:
        return self.per.total_seconds()


@dataclass(frozen=True)
class Limit:
    """A consumer's flow limit: ``concurrency`` jobs running at once and/or ``rate`` starts,
    per key. ``key``: None (the whole queue is one key), ``"partner"`` (the job's partner,
    ``payload["partner_id"]``) or a callable taking the decoded payload (what the handler's
    ``job.payload`` is) and returning the key as a str."""

    concurrency: int | None = None
    rate: Rate | None = None
    key: KeyFunction | str | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ConfigurationError(
                "Limit needs concurrency=N, rate=jobfence.Rate(N, per=...) or both"
            )
        if self.concurrency is not None:
            _count("Limit(concurrency)", self.concurrency)
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise ConfigurationError(
                f"Limit(rate=...) must be a jobfence.Rate(N, per=...), got "
                f"{type(self.rate).__name__}"
            )
        key = self.key
        if isinstance(key, str):
            if key != "partner":
                raise ConfigurationError(
                    f'Limit(key=...) must be None, "partner" or a callable taking the payload, '
                    f"got the string {key!r} (for a field, use key=lambda p: p[{key!r}])"
                )
        elif key is not None and not callable(key):
            raise ConfigurationError(
                f'Limit(key=...) must be None, "partner" or a callable taking the payload, '
                f"got {type(key).__name__}"
            )

    @property
    def needs_payload(self) -> bool:
        """Whether the key is read from the decoded payload (a callable)."""
        return callable(self.key)

    def key_of(self, raw: bytes, decode: Callable[[bytes], Any]) -> str:
        """The key of the job whose payload is ``raw`` (``decode`` gives the handler's
        payload): :data:`QUEUE_KEY` without a key, or when it cannot be read."""
        key = self.key
        if key is None:
            return QUEUE_KEY
        if key == "partner":
            return partner_of(raw) or QUEUE_KEY
        assert callable(key)
        try:
            value = key(decode(raw))
        except Exception as exc:
            log.warning(
                "the limit's key could not be read from a payload; the job shares the "
                "queue-wide key",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            return QUEUE_KEY
        if not isinstance(value, str) or len(value) > MAX_KEY_LENGTH or "\x00" in value:
            log.warning(
                "the limit's key must be a str of at most %d characters; the job shares the "
                "queue-wide key",
                MAX_KEY_LENGTH,
                extra={"key_type": type(value).__name__},
            )
            return QUEUE_KEY
        return value

    def describe(self) -> str:
        """One line for people: ``5 at once, 60 per 0:01:00, per partner``."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        if self.rate is not None:
            parts.append(f"{self.rate.count} per {self.rate.per}")
        key = self.key
        parts.append(
            "whole queue"
            if key is None
            else "per partner"
            if key == "partner"
            else f"per {getattr(key, '__name__', 'key')}"
        )
        return ", ".join(parts)


def check_limit(limit: object) -> Limit | None:
    """``limit`` if it is a :class:`Limit` or None; else one clear line."""
    if limit is None or isinstance(limit, Limit):
        return limit
    raise ConfigurationError(
        f"limit must be a jobfence.Limit(concurrency=..., rate=..., key=...), got "
        f"{type(limit).__name__}"
    )
