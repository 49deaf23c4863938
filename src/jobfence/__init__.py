"""jobfence: effectively-once effects for at-least-once queues.

The fence row of a job is written in the same database transaction as the handler's work,
so a redelivery can never apply the work twice; failures are retried or kept as dead
letters that people can read, replay and discard.
"""

from .app import App
from .calls import (
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallRetry,
    CallUnauthorized,
    UnknownOutcome,
)
from .core.jobs import AttemptRecord, Delivery, Job, OutgoingJob
from .core.limits import Limit, Rate
from .core.retry import DEFAULT_POLICY, RetryPolicy
from .db import Database, SyncTx, Tx
from .errors import (
    AuthenticationError,
    AuthorizationError,
    BackOff,
    BusinessError,
    Category,
    ConfigurationError,
    DatabaseUnavailable,
    EnqueueError,
    HandlerError,
    IntegrationError,
    InvalidRequest,
    JobfenceError,
    NonRetryableError,
    NotFound,
    PoisonPayload,
    Retry,
    ReviewConflict,
    SchemaError,
    TechnicalError,
    TemporaryError,
    TokenError,
    TransactionBoundaryError,
    UniqueViolation,
    ValidationError,
    classify,
)
from .observers import Observer
from .outbox.relay import OutboxEvent, Relay
from .review.deadletters import Actor
from .review.deadletters import discard as discard_dead_letter
from .review.deadletters import letters as list_dead_letters
from .review.letters import DeadLetter
from .runtime.worker import Worker
from .transports import Transport

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_POLICY",
    "Actor",
    "App",
    "AttemptRecord",
    "AuthenticationError",
    "AuthorizationError",
    "BackOff",
    "BusinessError",
    "CallInDoubt",
    "CallNotSent",
    "CallRejected",
    "CallRetry",
    "CallUnauthorized",
    "Category",
    "ConfigurationError",
    "Database",
    "DatabaseUnavailable",
    "DeadLetter",
    "Delivery",
    "EnqueueError",
    "HandlerError",
    "IntegrationError",
    "InvalidRequest",
    "Job",
    "JobfenceError",
    "Limit",
    "NonRetryableError",
    "NotFound",
    "Observer",
    "OutboxEvent",
    "OutgoingJob",
    "PoisonPayload",
    "Rate",
    "Relay",
    "Retry",
    "RetryPolicy",
    "ReviewConflict",
    "SchemaError",
    "SyncTx",
    "TechnicalError",
    "TemporaryError",
    "TokenError",
    "TransactionBoundaryError",
    "Transport",
    "Tx",
    "UniqueViolation",
    "UnknownOutcome",
    "ValidationError",
    "Worker",
    "__version__",
    "classify",
    "discard_dead_letter",
    "list_dead_letters",
]
