"""Periodic jobs: a cron schedule whose every tick is a job with the id ``<name>:<slot>``.

A *slot* is the instant a tick is due, in UTC (``2026-12-04T03:00:00Z``): the same on every
host and in every time zone, so any number of schedulers that enqueue the same tick enqueue
the same job_id, and the fence runs it once. The scheduler (:mod:`jobfence.runtime.scheduler`)
also records the last slot it enqueued per schedule, in the transaction of the enqueue, so on
the database queue a tick is even enqueued once.

Everything here is a pure function of the schedule and a ``now`` (no clock is read), so the
slots of any day — a daylight-saving change included — can be computed and tested without
waiting for it:

- the cron expression is croniter's: five fields, or six with **seconds first**
  (``*/10 * * * * *``: every ten seconds);
- it is read in the schedule's time zone (an IANA name, default UTC);
- **spring forward** (a local time that does not exist that day): the tick runs once, at the
  first instant after the gap (a 02:30 job on the day 02:00 jumps to 03:00 runs at 03:00);
- **fall back** (a local time that happens twice): a schedule whose hour field is ``*`` runs
  by real time, so each of the two 02:30s is a tick (an hourly job stays hourly); any other
  schedule runs once, at the first of the two (a nightly 02:30 job runs once, not twice);
- **missed ticks** — slots older than ``grace`` when a scheduler gets to them (every scheduler
  was down): ``missed="last"`` (the default) runs the latest of them once, unless a tick on
  time follows (that run covers them); ``"skip"`` runs none; ``"all"`` runs each, at most the
  latest :data:`MAX_CATCH_UP`. Ticks within ``grace`` always run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..errors import ConfigurationError
from .jobs import check_queue

Missed = Literal["last", "skip", "all"]
#: what a schedule does with ticks every scheduler missed (see the module's docstring)
MISSED_POLICIES: tuple[Missed, ...] = ("last", "skip", "all")
#: ``missed="all"`` enqueues at most this many missed ticks (the latest), however long the
#: schedulers were down; the older ones are dropped, and the scheduler logs how many
MAX_CATCH_UP = 1000
#: a tick this late or less is on time, and always runs (whatever the policy for missed ones)
DEFAULT_GRACE = timedelta(seconds=60)
#: a running scheduler declares its app's schedules this often (the row's ``defined_at``) ...
DECLARE_EVERY = timedelta(hours=1)
#: ... so a schedule not declared for this long is one no running app declares any more
#: (removed from the code, or its app stopped): listed as "not declared since", and removed
#: by ``jobfence schedules prune`` (which keeps rows younger than this whatever it is told)
UNDECLARED_AFTER = 3 * DECLARE_EVERY
#: what ``jobfence schedules prune`` removes by default: rows not declared for a week
PRUNE_AFTER = timedelta(days=7)
#: a periodic job's name: it starts its ticks' job_ids, so it is short and plain
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
#: the slot's text in a job_id: the tick's instant in UTC, to the second
SLOT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_SLOT = re.compile(r":(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")

Payload = Any | Callable[[datetime], Any]


def slot_text(slot: datetime) -> str:
    """A slot as it appears in job_ids: ``2026-12-04T03:00:00Z``."""
    return slot.astimezone(UTC).strftime(SLOT_FORMAT)


def tick_job_id(name: str, slot: datetime) -> str:
    """The job_id of ``name``'s tick at ``slot``: ``<name>:<slot in UTC>``."""
    return f"{name}:{slot_text(slot)}"


def slot_of(job_id: str) -> datetime | None:
    """The slot a periodic job's job_id names (an aware UTC datetime), else None."""
    match = _SLOT.search(job_id)
    if match is None:
        return None
    return datetime.strptime(match.group(1), SLOT_FORMAT).replace(tzinfo=UTC)


def parse_cron(cron: object, what: str = "cron") -> croniter:
    """A croniter for ``cron`` (five fields, or six with seconds first), or a
    :class:`ConfigurationError` in one line naming what is wrong."""
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(f"{what} must be a cron expression such as '0 3 * * *'")
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise ConfigurationError(
            f"{what} {cron!r} has {len(fields)} fields: give five (minute hour day month "
            "weekday) or six with seconds first ('*/10 * * * * *')"
        )
    try:
        return croniter(cron, datetime(2000, 1, 1, tzinfo=UTC), second_at_beginning=True)
    except (ValueError, KeyError, TypeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(
            f"{what} {cron!r} is not a valid cron expression: {detail}"
        ) from None


def parse_tz(tz: object, what: str = "tz") -> ZoneInfo:
    """The time zone named ``tz`` (an IANA name), or a :class:`ConfigurationError`."""
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz.strip():
        raise ConfigurationError(f"{what} must be an IANA time zone name such as 'Europe/Madrid'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"{what} {tz!r} is not a known time zone: use an IANA name such as "
            "'Europe/Madrid' or 'UTC'"
        ) from None


@dataclass(frozen=True)
class Due:
    """What a scheduler does at ``now`` for the ticks after the last one enqueued."""

    #: the slots to enqueue, oldest first
    enqueue: list[datetime]
    #: missed slots not enqueued by the policy (at least: see :attr:`more`)
    dropped: int
    #: the slot the schedule is at afterwards (None: no tick was due)
    last: datetime | None
    #: more missed slots were not even counted (beyond :data:`MAX_CATCH_UP`, or beyond the
    #: one a "last" or "skip" policy looks at)
    more: bool = False


@dataclass(frozen=True)
class Periodic:
    """A periodic job (``app.periodic(...)``): every tick of ``cron`` in ``tz`` is a job on
    ``queue`` whose job_id is ``<name>:<slot>`` and whose payload is ``payload`` (or
    ``payload(slot)`` when it is callable: the slot is an aware UTC datetime)."""

    name: str
    cron: str
    queue: str
    payload: Payload = None
    tz: str = "UTC"
    missed: Missed = "last"
    grace: timedelta = DEFAULT_GRACE
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _every_hour: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        label = f"periodic job {self.name!r}"
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ConfigurationError(
                f"periodic job name {self.name!r}: use 1-100 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (it starts every tick's job_id)"
            )
        try:
            check_queue(self.queue)
        except ValueError as exc:
            raise ConfigurationError(f"{label}: {exc}") from None
        parsed = parse_cron(self.cron, f"{label}: cron")
        zone = parse_tz(self.tz, f"{label}: tz")
        if self.missed not in MISSED_POLICIES:
            raise ConfigurationError(
                f"{label}: missed={self.missed!r} is not a policy; use one of "
                f"{', '.join(repr(p) for p in MISSED_POLICIES)}"
            )
        if not isinstance(self.grace, timedelta) or self.grace < timedelta(0):
            raise ConfigurationError(f"{label}: grace must be a timedelta of zero or more")
        hours = parsed.expanded[1]
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_every_hour", hours == ["*"] or len(hours) == 24)

    @property
    def zone(self) -> ZoneInfo:
        return self._zone

    def job_id(self, slot: datetime) -> str:
        return tick_job_id(self.name, slot)

    def payload_for(self, slot: datetime) -> Any:
        """The payload of the tick at ``slot``."""
        return self.payload(slot) if callable(self.payload) else self.payload

    # -- slots ----------------------------------------------------------------------------

    def _iter(self, start: datetime) -> croniter:
        return croniter(self.cron, start.astimezone(self._zone), second_at_beginning=True)

    def _repeat(self, slot: datetime) -> bool:
        """Whether ``slot`` is the second of a local time that happens twice (fall back) and
        the schedule runs once per local time."""
        if self._every_hour:
            return False
        wall = slot.astimezone(self._zone).replace(tzinfo=None, fold=0)
        # compared in UTC: two times of one zone compare by wall clock, blind to the fold
        first = wall.replace(tzinfo=self._zone).astimezone(UTC)
        second = wall.replace(tzinfo=self._zone, fold=1).astimezone(UTC)
        return first < second and second == slot.astimezone(UTC)

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after`` (aware, UTC)."""
        it = self._iter(after)
        while True:
            slot = it.get_next(datetime).astimezone(UTC)
            if slot > after and not self._repeat(slot):
                return slot

    def last_slot(self, until: datetime) -> datetime:
        """The latest slot at or before ``until`` (aware, UTC)."""
        it = self._iter(until + timedelta(microseconds=1))
        while True:
            slot = it.get_prev(datetime).astimezone(UTC)
            if slot <= until and not self._repeat(slot):
                return slot

    def slots(self, after: datetime, until: datetime) -> list[datetime]:
        """Every slot in (``after``, ``until``], oldest first (mind the span: a per-second
        schedule has 86 400 a day)."""
        found: list[datetime] = []
        slot = self.next_slot(after)
        it = self._iter(slot)
        while slot <= until:
            found.append(slot)
            slot = it.get_next(datetime).astimezone(UTC)
            while self._repeat(slot):
                slot = it.get_next(datetime).astimezone(UTC)
        return found

    def due(self, last: datetime | None, since: datetime, now: datetime) -> Due:
        """The ticks to enqueue at ``now``, the last one enqueued being ``last`` (None:
        none yet, and the schedule counts from ``since``, when it was first stored).

        It walks back from ``now``: the ticks within ``grace`` and, of the missed ones, only
        as many as the policy may enqueue (so a long outage costs no long walk)."""
        after = last if last is not None else since
        room = MAX_CATCH_UP if self.missed == "all" else 1
        on_time: list[datetime] = []
        missed: list[datetime] = []
        more = False
        it = self._iter(now + timedelta(microseconds=1))
        while True:
            slot = it.get_prev(datetime).astimezone(UTC)
            if slot <= after:
                break
            if slot > now or self._repeat(slot):
                continue
            if now - slot <= self.grace:
                on_time.append(slot)
            elif len(missed) == room:
                more = True
                break
            else:
                missed.append(slot)
        on_time.reverse()
        missed.reverse()
        if not on_time and not missed:
            return Due([], 0, None, False)
        latest = on_time[-1] if on_time else missed[-1]
        if self.missed == "all":
            chosen = missed + on_time
        elif self.missed == "last":
            chosen = on_time or missed
        else:
            chosen = on_time
        dropped = len(missed) + len(on_time) - len(chosen) + (1 if more else 0)
        return Due(chosen, dropped, latest, more)


def describe(periodic: Mapping[str, Periodic]) -> list[dict[str, Any]]:
    """The definitions as plain values (for logs)."""
    return [
        {"name": p.name, "cron": p.cron, "tz": p.tz, "queue": p.queue, "missed": p.missed}
        for p in periodic.values()
    ]
