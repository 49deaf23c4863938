"""The shape of the tree, guarded (issue 11; docs/architecture.md). The import contracts
themselves are `lint-imports` (pyproject.toml), run by scripts/check; these are the rules it
cannot express."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import grimp

from jobfence.sql import queries

SRC = Path(__file__).resolve().parents[1] / "src" / "jobfence"
MAX_LINES = 600
#: the doors (and the framework integrations): nothing in the library imports them
DOORS = ("jobfence.cli", "jobfence.ops", "jobfence.http", "jobfence.integrations")
#: named queries that exist on PostgreSQL only, and why
POSTGRESQL_ONLY = {
    "batch_ack": "group commit (PostgreSQL only)",
    "batch_fence_and_ack": "group commit",
    "requeue": "group commit",
    "unfence": "group commit",
    "copy_jobs": "binary COPY for bulk enqueue",
    "fence_and_ack": "the fence and the ack in one statement (SQLite runs ack, then fence)",
    "lend_begin": "the server-side transaction-boundary guards (SQLite: an authorizer)",
    "lend_commit": "the server-side transaction-boundary guards",
    "lend_commit_and_commit": "the server-side transaction-boundary guards",
    "lock_migrations": "an advisory lock (SQLite's write lock serialises migrations)",
    "notify_queues": "LISTEN/NOTIFY wake-ups",
    "outbox_relay_to_jobs": "the relay moves events to the jobs table in one statement",
    "outbox_wait_register": "relays waiting on writers (SQLite has one writer at a time)",
    "outbox_wait_writers": "relays waiting on writers",
    "outbox_wait_done": "relays waiting on writers",
    "idempotency_claim_many": "claims of concurrent requests batched (jobfence.http.batch)",
    "idempotency_complete_many": "completions of concurrent requests batched",
    "dl_search_window": "a time window of dead letters through the failed_at index",
    "fence_partitions_add": "fences partitioned by day of expiry (SQLite: one plain table)",
    "fence_partition_drop": "fences partitioned by day of expiry",
}
SQLITE_ONLY = {"changes": "SQLite's row count of the last statement (PostgreSQL: RETURNING)"}
#: the flat modules that moved into core/, runtime/, review/ and outbox/ (issue 24)
MOVED = (
    "jobs", "retry", "codec", "fence", "leases", "worker", "harness", "group_commit",
    "maintenance", "cleanup", "health", "threads", "hosted", "letters", "deadletters",
    "replays", "discards", "jobctl", "stats", "relay",
)  # fmt: skip


def library_modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_passes_600_lines() -> None:
    """A module that grows past 600 lines holds more than one concept: split it."""
    long = {
        str(path.relative_to(SRC)): n
        for path in library_modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_moved_modules_left_no_shim_behind() -> None:
    """A module has one home: the old flat names of the moved modules do not import."""
    assert [m for m in MOVED if importlib.util.find_spec(f"jobfence.{m}") is not None] == []


def _source_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in library_modules())


def test_every_named_query_is_used() -> None:
    """A named query nobody runs is dead SQL (or a typo in a caller)."""
    text = _source_text()
    names = set(queries("postgresql")) | set(queries("sqlite"))
    unused = sorted(n for n in names if not re.search(rf"[\"']{n}[\"']", text))
    assert unused == []


def test_named_queries_exist_in_both_dialects_but_the_documented_ones() -> None:
    postgresql, sqlite = set(queries("postgresql")), set(queries("sqlite"))
    assert (postgresql - sqlite, sqlite - postgresql) == (set(POSTGRESQL_ONLY), set(SQLITE_ONLY))


def test_the_doors_are_imported_by_nothing_in_the_library() -> None:
    """The CLI, the ops API and the HTTP middleware sit on top: the library never imports
    them (they import each other where one door serves another, e.g. `ops serve`)."""
    graph = grimp.build_graph("jobfence", exclude_type_checking_imports=True)
    offending = sorted(
        (importer, imported)
        for door in DOORS
        for imported in graph.find_descendants(door) | {door}
        for importer in graph.find_modules_that_directly_import(imported)
        if not importer.startswith(DOORS) and importer != "jobfence"
    )
    assert offending == []


def test_no_asyncio_wait_for_in_the_library() -> None:
    """``asyncio.wait_for`` on Python 3.11 returns the inner result when a cancellation lands
    in the same loop step as the inner call finishes: the cancel is lost, and a task in a
    loop (the health ping, a wake-up wait) then runs on after its owner cancelled it — a
    worker that never exits on SIGTERM. ``async with asyncio.timeout(...)`` keeps the
    cancellation (3.12 rebuilt wait_for on it)."""
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in library_modules()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "wait_for(" in line and not line.lstrip().startswith("#")
    ]
    assert found == []
