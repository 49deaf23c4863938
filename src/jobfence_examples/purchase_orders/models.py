"""Documents, events and request states of the purchase-order service."""

from __future__ import annotations

import enum
from decimal import Decimal

import pydantic
from pydantic import Field

from jobfence import Category

QUEUE = "purchase-orders.create"


class State(enum.StrEnum):
    """Request states (seed 004 §10.4)::

    RECEIVED ──relay──► PUBLISHED ──consumer──► SENT_TO_ERP ──ERP ok──► COMPLETED
                                                   │    ▲
                               temporary failure   ▼    │ broker redelivery
                                                RETRY_PENDING
    final failure (dead letter): VALIDATION_FAILED | REJECTED | FAILED
    operator retry (new event id): VALIDATION_FAILED | REJECTED | FAILED ──► RECEIVED
    """

    RECEIVED = "RECEIVED"
    PUBLISHED = "PUBLISHED"
    SENT_TO_ERP = "SENT_TO_ERP"
    COMPLETED = "COMPLETED"
    RETRY_PENDING = "RETRY_PENDING"
    VALIDATION_FAILED = "VALIDATION_FAILED"
    REJECTED = "REJECTED"
    FAILED = "FAILED"


#: A request in one of these is being worked on: an operator retry would make a duplicate.
RUNNING = frozenset({State.RECEIVED, State.PUBLISHED, State.SENT_TO_ERP, State.RETRY_PENDING})
#: An operator may retry a request only from these.
RETRYABLE = frozenset({State.VALIDATION_FAILED, State.REJECTED, State.FAILED})
TERMINAL = frozenset({State.COMPLETED, *RETRYABLE})


def final_state(category: Category) -> State:
    """The request state a dead letter of ``category`` leaves (the taxonomy's final state)."""
    return State(category.info.final_state)


class Line(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    item: str = Field(min_length=1, max_length=100)
    quantity: Decimal = Field(gt=0, max_digits=18, decimal_places=4)
    unit_price: Decimal = Field(ge=0, max_digits=18, decimal_places=4)


class PurchaseOrderRequest(pydantic.BaseModel):
    """The body of ``POST /requests``."""

    model_config = pydantic.ConfigDict(extra="forbid")

    company_id: str = Field(min_length=1, max_length=100)
    document_type: str = Field(min_length=1, max_length=50)
    external_reference: str | None = Field(default=None, min_length=1, max_length=200)
    supplier_id: str | None = Field(default=None, max_length=100)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    lines: list[Line] = Field(min_length=1, max_length=500)


class OrderEvent(pydantic.BaseModel):
    """The outbox event (and queue payload): which request to send. The consumer reads the
    document from the database, so a fixed document is what an operator retry sends."""

    request_id: str
    partner_id: str
    company_id: str
    document_type: str
    external_reference: str | None = None
