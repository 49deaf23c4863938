"""``/v1/flow``: flow control for operators (issue 26 §5) — each limited queue's limit, how full
each key is and what waits on it, the held keys; and pausing or resuming one key
(:func:`jobfence.review.jobctl.pause_key`), the same service as ``jobfence queues
pause-key|resume-key`` and the console's queues page. Actions are audited.

The limits are this server's app's (``create_app(jobfence_app=…)``): a queue whose Limit the
app does not declare is not listed. Keys and their holds live with the queue's jobs (the
queue's database; for a broker, the app's database).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ...app import App
from ...core.limits import MAX_KEY_LENGTH
from ...review import jobctl
from ...review.validation import MAX_REASON
from ...runtime.flow_view import limits_of, queue_flows
from ..auth import Principal
from ..deps import APP, CONFLICT, FORBIDDEN, OPERATOR, VIEWER, actor_of

router = APIRouter()


class KeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queue: str = Field(min_length=1, max_length=200, description="A queue with a Limit.")
    key: str = Field(max_length=MAX_KEY_LENGTH, description="The key (e.g. a partner id).")
    reason: str | None = Field(default=None, max_length=MAX_REASON, description="Why.")


class KeyState(BaseModel):
    queue: str
    key: str
    paused: bool


@router.get("/v1/flow", tags=["queues"])
async def flow(
    queue: str | None = Query(None, max_length=200, description="Only this queue."),
    keys: int = Query(100, ge=1, le=1000, description="The busiest keys per queue."),
    who: Principal = VIEWER,
    jf: App = APP,
) -> Any:
    """Every queue with a Limit in this app: the limit, its busiest keys (running / slots,
    starts in the rate's window, waiting, held, and why its waiting jobs wait: hold,
    concurrency or rate), the jobs not keyed yet and the held keys. A partner-scoped token
    sees its partner's key only."""
    limits = limits_of(jf.consumers)
    if queue is not None:
        limits = {q: lim for q, lim in limits.items() if q == queue}
    flows = await queue_flows(jf.transport.jobs_db or jf.db, limits, keys=keys)
    shown = [f.to_json() for f in flows]
    partner = actor_of(who).partner
    if partner is not None:
        for item in shown:
            item["keys"] = [k for k in item["keys"] if k["key"] == partner]
            item["holds"] = [h for h in item["holds"] if h["key"] == partner]
            item["unkeyed"] = None
    return {"queues": shown}


@router.post(
    "/v1/flow/keys/{action}",
    response_model=KeyState,
    responses={**FORBIDDEN, **CONFLICT},
    tags=["queues"],
)
async def pause_or_resume_key(
    action: Literal["pause", "resume"], body: KeyBody, who: Principal = OPERATOR, jf: App = APP
) -> Any:
    """Pause one key of a queue (workers claim none of its jobs, brokers defer its deliveries;
    the queue's other keys go on) or resume it. Audited; 409 when it is paused already
    (pause) or not paused (resume)."""
    act = jobctl.pause_key if action == "pause" else jobctl.resume_key
    await act(
        jf.db,
        body.queue,
        body.key,
        actor=actor_of(who),
        reason=body.reason,
        jobs_db=jf.transport.jobs_db,
    )
    return KeyState(queue=body.queue, key=body.key, paused=action == "pause")
