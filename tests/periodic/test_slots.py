"""The slots of a cron schedule, computed for any ``now`` (no clock, no sleep): the UTC slot
in the job_id, both daylight-saving changes, the missed-tick policies, the validation."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from jobfence import App, ConfigurationError
from jobfence.core.periodic import MAX_CATCH_UP, Periodic, slot_of, tick_job_id

MADRID = "Europe/Madrid"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def iso(slots: list[datetime]) -> list[str]:
    return [s.strftime("%Y-%m-%dT%H:%M:%SZ") for s in slots]


def test_the_job_id_is_the_name_and_the_ticks_utc_instant() -> None:
    """03:00 in Madrid is 02:00 UTC in winter: the job_id names the UTC instant, so hosts in
    any time zone name the same tick the same way; slot_of reads it back."""
    nightly = Periodic("nightly-reconcile", "0 3 * * *", "reconcile", tz=MADRID)
    slot = nightly.next_slot(utc(2026, 12, 4, 12))
    assert slot == utc(2026, 12, 5, 2)
    assert nightly.job_id(slot) == "nightly-reconcile:2026-12-05T02:00:00Z"
    assert slot_of(nightly.job_id(slot)) == slot
    assert slot_of("no-slot-here") is None
    # summer: 03:00 in Madrid is 01:00 UTC
    assert nightly.next_slot(utc(2026, 7, 1)) == utc(2026, 7, 1, 1)
    assert tick_job_id("x", slot.astimezone(nightly.zone)) == "x:2026-12-05T02:00:00Z"


def test_spring_forward_a_0230_job_runs_once_when_the_clock_jumps() -> None:
    """2026-03-29 in Madrid: 02:00 jumps to 03:00, so 02:30 does not exist; the nightly job
    runs once that day, at 03:00 local (01:00 UTC), and at 02:30 on the days around it."""
    job = Periodic("night", "30 2 * * *", "q", tz=MADRID)
    assert iso(job.slots(utc(2026, 3, 27), utc(2026, 3, 31))) == [
        "2026-03-27T01:30:00Z",
        "2026-03-28T01:30:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-30T00:30:00Z",
    ]
    # the same day walked back from a later now (what the scheduler does) agrees
    due = job.due(utc(2026, 3, 28, 1, 30), utc(2026, 1, 1), utc(2026, 3, 29, 1, 0, 30))
    assert iso(due.enqueue) == ["2026-03-29T01:00:00Z"]
    # an hourly job simply has no 02:30 that day: still one run per real hour
    hourly = Periodic("hourly", "30 * * * *", "q", tz=MADRID)
    assert iso(hourly.slots(utc(2026, 3, 28, 23), utc(2026, 3, 29, 3))) == [
        "2026-03-28T23:30:00Z",
        "2026-03-29T00:30:00Z",
        "2026-03-29T01:30:00Z",
        "2026-03-29T02:30:00Z",
    ]


def test_fall_back_a_nightly_job_runs_once_an_hourly_job_every_hour() -> None:
    """2026-10-25 in Madrid: 03:00 goes back to 02:00, so 02:30 happens twice (00:30 and
    01:30 UTC). A job at a named hour runs once, at the first; a job whose hour is '*' runs
    by real time, at both."""
    nightly = Periodic("night", "30 2 * * *", "q", tz=MADRID)
    assert iso(nightly.slots(utc(2026, 10, 23), utc(2026, 10, 27))) == [
        "2026-10-23T00:30:00Z",
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",
        "2026-10-26T01:30:00Z",
    ]
    due = nightly.due(utc(2026, 10, 25, 0, 30), utc(2026, 1, 1), utc(2026, 10, 25, 1, 30, 5))
    assert due.enqueue == []
    assert due.last is None
    assert nightly.next_slot(utc(2026, 10, 25, 0, 30)) == utc(2026, 10, 26, 1, 30)
    hourly = Periodic("hourly", "30 * * * *", "q", tz=MADRID)
    assert iso(hourly.slots(utc(2026, 10, 24, 23), utc(2026, 10, 25, 3))) == [
        "2026-10-24T23:30:00Z",
        "2026-10-25T00:30:00Z",
        "2026-10-25T01:30:00Z",
        "2026-10-25T02:30:00Z",
    ]


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30)),
        (utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_a_per_second_schedule_ticks_every_second_across_the_change(
    start: datetime, end: datetime
) -> None:
    """Seconds first: '* * * * * *' in Madrid gives 3 600 ticks an hour of real time, even in
    the hour the clocks change."""
    job = Periodic("beat", "* * * * * *", "q", tz=MADRID)
    slots = job.slots(start, end)
    assert len(slots) == 3600
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(slots))
    every_ten = Periodic("ten", "*/10 * * * * *", "q", tz=MADRID)
    assert len(every_ten.slots(start, end)) == 360


NOW = utc(2026, 12, 4, 12, 0, 0)


@pytest.mark.parametrize(
    ("missed", "enqueued", "dropped"),
    [
        ("last", ["2026-12-04T03:00:00Z"], True),
        ("skip", [], True),
        ("all", ["2026-12-02T03:00:00Z", "2026-12-03T03:00:00Z", "2026-12-04T03:00:00Z"], False),
    ],
)
def test_missed_nightly_ticks_after_three_days_down(
    missed: str, enqueued: list[str], dropped: bool
) -> None:
    """Last run 12-01 03:00, now 12-04 12:00: three ticks were missed. last: the latest runs
    once; skip: none; all: each. The schedule moves to 12-04 03:00 either way."""
    job = Periodic("n", "0 3 * * *", "q", missed=missed)  # type: ignore[arg-type]
    due = job.due(utc(2026, 12, 1, 3), utc(2026, 1, 1), NOW)
    assert iso(due.enqueue) == enqueued
    assert (due.dropped > 0) is dropped  # counted "at least": the walk back stops early
    assert due.last == utc(2026, 12, 4, 3)


def test_ticks_within_grace_always_run_and_all_is_bounded() -> None:
    """A per-second schedule, last run an hour ago: the 61 ticks of the grace window (60 s,
    both ends in) run under every policy; 'all' adds at most MAX_CATCH_UP missed ones (the
    latest)."""
    kwargs = {"name": "s", "cron": "* * * * * *", "queue": "q"}
    last = NOW - timedelta(hours=1)
    for missed in ("last", "skip"):
        due = Periodic(**kwargs, missed=missed).due(last, last, NOW)  # type: ignore[arg-type]
        assert len(due.enqueue) == 61
        assert due.enqueue[0] == NOW - timedelta(seconds=60)
        assert due.dropped > 0
        assert due.more
    due = Periodic(**kwargs, missed="all").due(last, last, NOW)  # type: ignore[arg-type]
    assert len(due.enqueue) == MAX_CATCH_UP + 61
    assert due.enqueue[0] == NOW - timedelta(seconds=60 + MAX_CATCH_UP)
    assert due.more
    # within grace, a scheduler that woke late still enqueues every tick it slept through
    due = Periodic(**kwargs, missed="last").due(NOW - timedelta(seconds=5), last, NOW)
    assert iso(due.enqueue) == iso([NOW - timedelta(seconds=n) for n in (4, 3, 2, 1, 0)])
    assert due.dropped == 0
    # a new schedule counts from when it was stored, never from the epoch
    due = Periodic(**kwargs).due(None, NOW - timedelta(seconds=2), NOW)
    assert len(due.enqueue) == 2


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"cron": "61 * * * *"}, "cron '61 * * * *' is not a valid cron expression"),
        ({"cron": "* * *"}, "has 3 fields: give five"),
        ({"tz": "Europe/Madird"}, "tz 'Europe/Madird' is not a known time zone"),
        ({"missed": "sometimes"}, "missed='sometimes' is not a policy; use one of 'last'"),
        ({"name": "a b"}, "periodic job name 'a b': use 1-100 letters"),
        ({"queue": ""}, "queue must be a non-empty string"),
    ],
)
def test_a_bad_definition_is_one_clear_line(kwargs: dict[str, str], says: str) -> None:
    app = App("sqlite:///never-opened.db")
    args: dict[str, str] = {"cron": "0 3 * * *", "queue": "q", **kwargs}
    name = args.pop("name", "nightly")
    with pytest.raises(ConfigurationError) as caught:
        app.periodic(name, **args)  # type: ignore[arg-type]
    message = str(caught.value)
    assert says in message
    assert "\n" not in message


def test_a_name_is_defined_once_and_a_payload_is_checked_when_defined() -> None:
    app = App("sqlite:///never-opened.db")
    app.periodic("nightly", cron="0 3 * * *", queue="q", payload={"a": 1})
    with pytest.raises(ConfigurationError, match="'nightly' is already defined"):
        app.periodic("nightly", cron="0 4 * * *", queue="q")
    with pytest.raises(ConfigurationError, match="periodic job 'bad-payload'"):
        app.periodic("bad-payload", cron="0 3 * * *", queue="q", payload={"x": float("nan")})
