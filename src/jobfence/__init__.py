"""jobfence: effectively-once effects for at-least-once queues.

The fence row of a job is written in the same database transaction as the handler's work,
so a redelivery can never apply the work twice; failures are retried or kept as dead
letters that people can read, replay and discard.
"""

from .app import App
from .db import SyncTx, Tx
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
from .retry import DEFAULT_POLICY, RetryPolicy
from .store import OutgoingJob
from .transports import Transport
from .worker import Worker

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_POLICY",
    "App",
    "AttemptRecord",
    "AuthenticationError",
    "AuthorizationError",
    "BusinessError",
    "Category",
    "ConfigurationError",
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
    "OutgoingJob",
    "PoisonPayload",
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
    "ValidationError",
    "Worker",
    "__version__",
    "classify",
]
