"""Request and response bodies of the ops API (what its OpenAPI document describes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..review.deadletters import AuditEntry, ItemOutcome, LetterView
from ..review.letters import DeadLetter
from ..review.letters import payload_view as _payload_view
from ..review.replays import ReplayPreview, ReplayStatus
from ..review.validation import MAX_ID, MAX_IDS, MAX_REASON

#: A letter or replay id: what the stores hold (bigint / INTEGER), so 422, never an overflow.
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


class Problem(BaseModel):
    """An error (RFC 9457 problem details)."""

    type: str = "about:blank"
    title: str
    status: int
    code: str
    detail: str | None = None


class LetterSummary(BaseModel):
    """A dead letter without its payload (what lists show)."""

    id: int
    queue: str
    consumer: str
    job_id: str
    correlation_id: str | None
    partner: str | None
    status: Literal["pending_review", "replayed", "discarded"]
    error_category: str
    error_code: str | None
    last_error: str
    attempts: int
    payload_size: int
    payload_truncated: bool
    enqueued_at: datetime | None
    failed_at: datetime
    previous_id: int | None
    reviewed_at: datetime | None
    reviewed_by: str | None
    review_reason: str | None

    @classmethod
    def of(cls, letter: DeadLetter) -> LetterSummary:
        data = {name: getattr(letter, name) for name in cls.model_fields}
        return cls(**data)


class Attempt(BaseModel):
    attempt: int
    at: str
    category: str
    error: str
    retry_at: str | None = None
    trace: str | None = Field(
        None,
        description="The attempt's traceback: its last 16 KiB, frames only (no local "
        "variables, no payload); null when the attempt raised nothing (a lost worker).",
    )


class Payload(BaseModel):
    """The payload exactly as received: UTF-8 text, or base64 when it is not UTF-8."""

    encoding: Literal["utf-8", "base64"]
    data: str
    size: int = Field(description="Size of the original payload in bytes.")
    truncated: bool = Field(description="True when only the first bytes were kept.")


class AuditRow(BaseModel):
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    partner: str | None
    dead_letter_id: int | None
    replay_id: int | None
    reason: str | None
    details: dict[str, Any]
    old_state: str | None = Field(
        default=None, description="The state before the action (null: none, or not recorded)."
    )
    new_state: str | None = Field(default=None, description="The state the action left.")

    @classmethod
    def of(cls, entry: AuditEntry) -> AuditRow:
        return cls(**entry.__dict__)


class LetterDetail(LetterSummary):
    """One dead letter with everything needed to understand it."""

    payload: Payload
    history: list[Attempt] = Field(description="Every failed attempt, oldest first.")
    followers: list[int] = Field(
        description="Letters of the same job that failed again after this one was replayed."
    )
    audit: list[AuditRow]

    @classmethod
    def of_view(cls, view: LetterView) -> LetterDetail:
        letter = view.letter
        shown = _payload_view(letter.payload)
        return cls(
            **LetterSummary.of(letter).model_dump(),
            payload=Payload(
                encoding=shown["encoding"],
                data=shown["data"] or "",
                size=letter.payload_size,
                truncated=letter.payload_truncated,
            ),
            history=[Attempt(**h.__dict__) for h in letter.history],
            followers=view.followers,
            audit=[AuditRow.of(e) for e in view.audit],
        )


class LetterPage(BaseModel):
    items: list[LetterSummary]
    next_cursor: int | None = Field(description="Pass as `before` for the next page; null: end.")


class AuditPage(BaseModel):
    items: list[AuditRow]
    next_cursor: int | None


class ReplayBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=MAX_REASON, description="Why (optional).")


class DiscardBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(max_length=MAX_REASON, description="Why this letter needs no replay.")


class ItemResult(BaseModel):
    dead_letter_id: int
    outcome: ItemOutcome
    detail: str | None


class LetterFilter(BaseModel):
    """Which pending letters a bulk replay takes: every given criterion must match."""

    model_config = ConfigDict(extra="forbid")
    queue: str | None = None
    consumer: str | None = None
    category: str | None = None
    error: str | None = Field(default=None, description="Case-insensitive substring of the error.")
    job_id: str | None = None
    since: datetime | None = Field(default=None, description="failed_at ≥ since")
    until: datetime | None = Field(default=None, description="failed_at < until")
    ids: list[Id] | None = Field(default=None, max_length=MAX_IDS)


class PreviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filter: LetterFilter = Field(default_factory=LetterFilter)
    all_pending: bool = Field(default=False, description="Take every pending letter in scope.")
    sample: int = Field(default=10, ge=0, le=100)


class SampleLetter(BaseModel):
    id: int
    queue: str
    consumer: str
    job_id: str
    error_category: str
    last_error: str
    failed_at: datetime | None


class Breakdown(BaseModel):
    queue: str
    category: str
    letters: int
    truncated: int = Field(description="Cannot be replayed: their payload was truncated.")
    applied: int = Field(description="Already applied (fenced): marked replayed, not republished.")


class Preview(BaseModel):
    """The dry run of a bulk replay: a fixed snapshot of letter ids, not yet acted on."""

    replay_id: int
    total: int
    expires_at: datetime
    filter: dict[str, Any]
    breakdown: list[Breakdown]
    sample: list[SampleLetter]
    already_applied: int
    truncated: int
    confirm: str = Field(description="POST here with expected_total = total to run it.")

    @classmethod
    def of(cls, preview: ReplayPreview, confirm: str) -> Preview:
        return cls(
            replay_id=preview.replay_id,
            total=preview.total,
            expires_at=preview.expires_at,
            filter=preview.filter,
            breakdown=[Breakdown(**row) for row in preview.breakdown],
            sample=[SampleLetter(**row) for row in preview.sample],
            already_applied=preview.already_applied,
            truncated=preview.truncated,
            confirm=confirm,
        )


class RunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expected_total: int = Field(
        ge=0, le=MAX_ID, description="The preview's total: the confirmation."
    )
    rate: float | None = Field(
        default=500.0, gt=0, le=100_000, description="Letters per second (null: no limit)."
    )
    reason: str | None = Field(
        default=None,
        max_length=MAX_REASON,
        description='Why (kept on each letter and in the audit log; default "bulk replay N").',
    )


class Replay(BaseModel):
    """A bulk replay's progress and per-outcome counts."""

    id: int
    state: Literal["previewed", "running", "done"]
    total: int
    done: int
    counts: dict[str, int]
    filter: dict[str, Any]
    partner: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime
    confirmed_by: str | None
    confirmed_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, status: ReplayStatus) -> Replay:
        return cls(
            id=status.id,
            state=status.state,  # type: ignore[arg-type]
            total=status.total,
            done=status.done,
            counts=status.counts,
            filter=status.filter,
            partner=status.partner,
            created_by=status.created_by,
            created_at=status.created_at,
            expires_at=status.expires_at,
            confirmed_by=status.confirmed_by,
            confirmed_at=status.confirmed_at,
            finished_at=status.finished_at,
        )


class ReplayItem(BaseModel):
    dead_letter_id: int
    outcome: str
    detail: str | None
    done_at: datetime | None
    queue: str
    job_id: str


class ReplayItemPage(BaseModel):
    items: list[ReplayItem]
    next_cursor: int | None = Field(description="Pass as `after` for the next page.")


class LetterCount(BaseModel):
    queue: str
    category: str
    status: str
    letters: int


class QueueDepth(BaseModel):
    queue: str
    state: str
    jobs: int


class QueueBacklog(BaseModel):
    queue: str
    waiting: int = Field(description="Jobs waiting to run (due or delayed).")
    running: int = Field(description="Jobs a worker holds right now.")
    oldest_waiting_s: float | None = Field(
        description="Age in seconds of the oldest waiting job (since it was enqueued)."
    )
    served: bool | None = Field(
        description="Whether one of the app's consumers serves this queue (false: its jobs "
        "wait for a worker that may never come); null when the app names no consumers."
    )


class Stats(BaseModel):
    letters: list[LetterCount]
    queue_depth: list[QueueDepth] | None = Field(
        description="Jobs waiting or running per queue; null for partner-scoped tokens."
    )
    queues: list[QueueBacklog] | None = Field(
        description="Each queue with jobs: waiting, running, the oldest waiting job's age and "
        "whether the app serves it; null for partner-scoped tokens."
    )


class Health(BaseModel):
    status: Literal["ok"]


class ScheduleView(BaseModel):
    """A periodic job: its definition, next run and last run (times in UTC)."""

    name: str
    cron: str = Field(description="Five fields, or six with seconds first.")
    tz: str = Field(description="The IANA time zone the cron expression is read in.")
    queue: str
    missed: Literal["last", "skip", "all"] = Field(description="The missed-tick policy.")
    next_run: datetime | None = Field(
        description="The next tick (null: the stored cron no longer parses)."
    )
    last_slot: datetime | None = Field(
        description="The tick the schedule is at (enqueued, or dropped by the missed-tick policy)."
    )
    last_job_id: str | None = Field(description="The job_id of the last tick enqueued.")
    last_enqueued_at: datetime | None
    last_outcome: (
        Literal["waiting", "running", "retrying", "processed", "dead_letter", "unknown"] | None
    ) = Field(description="What became of the last tick enqueued (null: none yet).")
    last_processed_at: datetime | None
    dead_letter_id: int | None
    created_at: datetime | None = Field(
        description="When a scheduler first stored it (null: defined by the app, not stored yet)."
    )
    defined: bool | None = Field(
        description="Whether the served app defines it (null: the server has no app's definitions)."
    )
    declared_at: datetime | None = Field(
        default=None, description="When a running scheduler last declared it (null: not stored)."
    )
    undeclared: bool = Field(
        default=False,
        description="No running scheduler declared it for 3 hours: no running app defines it.",
    )
