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
from .db import Database, SyncTx, Tx
from .deadletters import Actor
from .deadletters import discard as discard_dead_letter
from .deadletters import letters as list_dead_letters
from .errors import (
    AuthenticationError,
    AuthorizationError,
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
from .jobs import AttemptRecord, Delivery, Job
from .letters import DeadLetter
from .observers import Observer
from .outbox import OutboxEvent
from .relay import Relay
from .retry import DEFAULT_POLICY, RetryPolicy
from .store import OutgoingJob
from .transports import Transport
from .worker import Worker

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_POLICY",
    "Actor",
    "App",
    "AttemptRecord",
    "AuthenticationError",
    "AuthorizationError",
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
    "NonRetryableError",
    "NotFound",
    "Observer",
    "OutboxEvent",
    "OutgoingJob",
    "PoisonPayload",
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
