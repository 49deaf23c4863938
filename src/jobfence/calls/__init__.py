"""Effects outside the database (SPEC E1–E4): a handler's call to a partner's API as a
recorded step of its job (``await job.call(step, send, reconcile=…)``).

- :mod:`.ledger` — the recorded step: its key, intent and outcome, in-doubt resolution and
  the in-process retry.
- :mod:`.outcomes` — what a ``send`` can say happened (and how httpx's errors read).
- :mod:`.store` — where the ledger lives (PostgreSQL: the store's schema, its own pool;
  SQLite: a file of its own next to the store).
"""

from .ledger import DEFAULT_CALL_RETRY, CallRetry, Ledger, default_key
from .outcomes import (
    UNKNOWN_OUTCOME,
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallUnauthorized,
    UnknownOutcome,
    check,
)
from .store import ledger_url, open_ledger

__all__ = [
    "DEFAULT_CALL_RETRY",
    "UNKNOWN_OUTCOME",
    "CallInDoubt",
    "CallNotSent",
    "CallRejected",
    "CallRetry",
    "CallUnauthorized",
    "Ledger",
    "UnknownOutcome",
    "check",
    "default_key",
    "ledger_url",
    "open_ledger",
]
