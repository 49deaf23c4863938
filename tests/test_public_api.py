"""jobfence's public API is what ``jobfence.__all__`` says (the way httpx tests its exports).

A name imported into ``jobfence/__init__.py`` is either exported or private (``_name``), so
``__all__`` can neither miss a name nor list one that is gone. The reference applications in
``jobfence_examples`` are held to that API.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import jobfence
import jobfence.http

#: dunder names that are exported on purpose
EXPORTED_DUNDERS = {"__version__"}


def public_names(module: types.ModuleType) -> set[str]:
    """Names bound in ``module`` that do not start with ``_``, except submodules (importing
    ``jobfence.x`` anywhere binds ``x`` on the package)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_all_is_exactly_the_public_names_of_the_package() -> None:
    assert set(jobfence.__all__) == public_names(jobfence) | EXPORTED_DUNDERS


def test_all_has_no_duplicates() -> None:
    assert len(jobfence.__all__) == len(set(jobfence.__all__))


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from jobfence import *", namespace)  # the star import is what __all__ governs
    assert [name for name in jobfence.__all__ if name not in namespace] == []


#: the public API, pinned: moving a module inside the package (issue 24) or any other change
#: that adds, drops or renames an export fails here first, and says which name
PUBLIC_API = [
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


def test_all_is_pinned() -> None:
    assert jobfence.__all__ == PUBLIC_API


# -- the examples use the public API only (docs/architecture.md) ---------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "jobfence_examples"
#: jobfence's public modules besides the package itself: HTTP idempotency, the ops API (its
#: app factory, its tokens, and the outbox routes other FastAPI apps mount), the outbox
PUBLIC_MODULES = {
    "jobfence.http",
    "jobfence.ops",
    "jobfence.ops.app",
    "jobfence.ops.auth",
    "jobfence.ops.routes.outbox",
    "jobfence.outbox",
}


def private_uses(tree: ast.AST) -> list[str]:
    """``module.name`` for every import of something of jobfence that is not public."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                a.name
                for a in node.names
                if a.name.startswith("jobfence.") and a.name not in PUBLIC_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if module != "jobfence" and not module.startswith("jobfence."):
                continue
            for alias in node.names:
                name = alias.name
                if f"{module}.{name}" in PUBLIC_MODULES:
                    continue
                public = (
                    name in jobfence.__all__
                    if module == "jobfence"
                    else name in jobfence.http.__all__
                    if module == "jobfence.http"
                    else module in PUBLIC_MODULES and not name.startswith("_")
                )
                if not public:
                    found.append(f"{module}.{name}")
    return found


def test_private_uses_are_found() -> None:
    source = (
        "from jobfence import App, outbox\n"
        "from jobfence.http import DEFAULT_WINDOW\n"
        "from jobfence.ops.routes import outbox as routes\n"
        "def f():\n"
        "    from jobfence.store import Store\n"
        "    from jobfence import deadletters\n"
        "    from jobfence.http import idempotency\n"
        "    import jobfence.db\n"
        "    from jobfence.ops.auth import _duration\n"
    )
    assert private_uses(ast.parse(source)) == [
        "jobfence.store.Store",
        "jobfence.deadletters",
        "jobfence.http.idempotency",
        "jobfence.db",
        "jobfence.ops.auth._duration",
    ]


def test_the_examples_import_only_the_public_api() -> None:
    files = sorted(EXAMPLES.rglob("*.py"))
    assert files, f"no examples under {EXAMPLES}"
    found = {
        str(path.relative_to(EXAMPLES)): uses
        for path in files
        if (uses := private_uses(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
