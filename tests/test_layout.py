"""The shape of the tree, guarded (issue 11; docs/architecture.md). The import contracts
themselves are `lint-imports` (pyproject.toml), run by scripts/check; these are the rules it
cannot express."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from pathlib import Path

import grimp

from jobfence.sql import queries

SRC = Path(__file__).resolve().parents[1] / "src" / "jobfence"
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
    "idempotency_insert": "a key's claim sent with the app's statements and COMMIT (deferred)",
    "idempotency_get_many": "look-ups of concurrent requests' keys batched",
    "dl_search_window": "a time window of dead letters through the failed_at index",
    "fence_partitions_add": "fences partitioned by day of expiry (SQLite: one plain table)",
    "flow_lock": "an advisory lock per limited queue (SQLite's write lock serialises claims)",
    "fence_partitions_detach": "fences partitioned by day of expiry",
    "fence_partitions_purge": "fences partitioned by day of expiry",
    "dead_letters_expire": "decided letters past the owner's retention (SQLite keeps every one)",
    "flow_admit": "a broker delivery's admission in one statement (SQLite: its transaction)",
}
SQLITE_ONLY = {
    "changes": "SQLite's row count of the last statement (PostgreSQL: RETURNING)",
    "flow_admit_state": "a key's state read by an admission's transaction (PostgreSQL: flow_admit)",
    "flow_take_slot": "a slot taken by an admission's transaction (PostgreSQL: flow_admit)",
}
#: the flat modules that moved into core/, runtime/, review/ and outbox/ (issue 24)
MOVED = (
    "jobs", "retry", "codec", "fence", "leases", "worker", "harness", "group_commit",
    "maintenance", "cleanup", "health", "threads", "hosted", "letters", "deadletters",
    "replays", "discards", "jobctl", "stats", "relay",
)  # fmt: skip
#: names with a leading underscore that belong to another library, not to a jobfence module
FOREIGN_PRIVATE = {
    "_replace": "a named tuple's (urllib's SplitResult) public copy-with-changes method",
    "_proxied": "SQLAlchemy's AsyncConnection: the sync Connection its events fire on",
    "_jobfence_watched": "jobfence's own mark on a SQLAlchemy Engine, set and read in db/",
}


def library_modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


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
    graph = grimp.build_graph("jobfence", exclude_type_checking_imports=False)
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


#: what only the queue port may know: which transport keeps its jobs in a table, and where
QUEUE_INTERNALS = re.compile(r"queue_db|shares_database|DatabaseQueue")


def queue_internals(source_text: str, module: str) -> list[str]:
    """Lines naming the database queue's internals, outside ``jobfence.transports``."""
    if module == "jobfence.transports" or module.startswith("jobfence.transports."):
        return []
    return [
        f"{module}:{n}: {line.strip()}"
        for n, line in enumerate(source_text.splitlines(), 1)
        if QUEUE_INTERNALS.search(line)
    ]


def test_only_the_queue_port_knows_the_database_queue() -> None:
    """Services and doors ask the transport for its job-control view
    (``Transport.jobs_db`` / ``Transport.job_control()``, which refuses a broker with one
    message) instead of branching on the transport's kind (issue 24): nothing outside
    transports/ names ``queue_db``, ``shares_database`` or ``DatabaseQueue``."""
    found = [
        hit
        for path in library_modules()
        for hit in queue_internals(path.read_text(encoding="utf-8"), _module_of(path)[0])
    ]
    assert found == []


def test_the_queue_internals_check_sees_each_name() -> None:
    sample = "x = app.transport.queue_db\nok = 1\nDatabaseQueue(db, shares_database=True)\n"
    assert queue_internals(sample, "jobfence.review.jobctl") == [
        "jobfence.review.jobctl:1: x = app.transport.queue_db",
        "jobfence.review.jobctl:3: DatabaseQueue(db, shares_database=True)",
    ]
    assert queue_internals(sample, "jobfence.transports.database") == []


def _module_of(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches(source_text: str, module: str, is_package: bool = False) -> list[str]:
    """``from x import _name`` of another module (a package may import its own children)
    and ``obj._name`` on anything but ``self``/``cls`` (or a foreign library's name)."""
    base = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source_text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            own = source == module or (is_package and source.startswith(module + "."))
            if source.startswith("jobfence") and not own:
                found += [f"from {source} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr not in FOREIGN_PRIVATE:
                found.append(ast.unparse(node))
    return [f"{module}: {what}" for what in found]


def test_no_module_reaches_into_another_ones_private_names() -> None:
    """A name with a leading underscore is its module's own: what another module needs is
    public in a proper home (review/validation.py, cli/common.py, db/'s drivers)."""
    found = [
        hit
        for path in library_modules()
        for hit in private_reaches(path.read_text(encoding="utf-8"), *_module_of(path))
    ]
    assert found == []


def test_the_private_name_check_sees_both_forms() -> None:
    sample = (
        "from .deadletters import _hidden\nfrom . import _child\nfrom ..app import App\n"
        "def f(app: App, self: object) -> None:\n    app._fence(self._own)\n"
    )
    assert private_reaches(sample, "jobfence.review.sample") == [
        "jobfence.review.sample: from jobfence.review.deadletters import _hidden",
        "jobfence.review.sample: from jobfence.review import _child",
        "jobfence.review.sample: app._fence",
    ]
    assert private_reaches("from .letters import _child\n", "jobfence.review", True) == []


ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"


def _picture() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return text.split("```", 2)[1]


def drawn(picture: str) -> tuple[set[str], set[str]]:
    """The folders (``x/``) and modules (``x.py``) a picture of the tree names."""
    folders = set(re.findall(r"(?<![\w<./])([a-z_]+)/", picture))
    modules = set(re.findall(r"(?<![\w.])([a-z_]+\.py)\b", picture))
    return folders, modules


def test_every_folder_and_module_the_architecture_draws_exists() -> None:
    """docs/architecture.md's picture matches the tree: a folder or a module it names that
    moved or went away fails here."""
    folders, modules = drawn(_picture())
    have_folders = {p.name for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    have_modules = {p.name for p in library_modules()}
    assert (sorted(folders - have_folders), sorted(modules - have_modules)) == ([], [])
    assert {"core", "runtime", "review", "outbox", "db", "transports"} <= folders


def test_the_check_of_the_picture_reads_folders_and_modules() -> None:
    assert drawn(" runtime/  harness.py (screen) sql/<dialect>/ db.postgres.PgBatch") == (
        {"runtime", "sql"},
        {"harness.py"},
    )


def test_every_contract_the_architecture_lists_is_in_pyproject() -> None:
    """The contracts docs/architecture.md lists are exactly pyproject.toml's."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    listed = re.findall(r"^- \*\*(.+?)\*\*", text.split("## The contracts", 1)[1], re.M)
    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = [c["name"] for c in config["tool"]["importlinter"]["contracts"]]
    assert sorted(listed) == sorted(contracts)
    assert config["tool"]["importlinter"]["exclude_type_checking_imports"] is False
