"""Every documented snippet runs (issue 23): each Python and shell block of README.md and of
the Markdown pages under docs/ (and the examples' READMEs) is either **run** here, against a
real database in a temporary folder with a timeout, or marked as a **fragment** that names
the test which runs what it shows. A block that stops working fails the build; a new block
without a marker fails it too.

The convention (CONTRIBUTING.md): on the line before a fenced block, one HTML comment —

- ``<!-- run: SETUP -->``: run by this file, with the setup ``SETUP`` of :data:`SETUPS`
  (its store, what is defined before the block, what is checked after it). The blocks with
  the same setup run in order (page by page), in one folder, on one database.
- ``<!-- fragment: tests/PATH.py::test_name -->``: not runnable on its own (a synopsis, a
  part of a larger program, a command needing Docker or a cloud); the named test, which must
  exist, runs what it shows.

Every fenced block names its language; ``text`` is for diagrams and output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .helpers import REPO, query, table

RUNNABLE = {"python", "sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(run|fragment):\s*(\S+)\s*-->\s*$")
TIMEOUT = 60  # seconds, per block


def pages() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found += sorted((REPO / "src" / "jobfence_examples").rglob("README.md"))
    found += sorted((REPO / "examples").rglob("README.md"))
    return [p for p in found if "vendor" not in p.parts]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str | None  # "run", "fragment" or None (no marker)
    target: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        lang = opening.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before]) if before >= 0 else None
        found.append(
            Block(
                page,
                i + 1,
                lang,
                code,
                marker.group(1) if marker else None,
                marker.group(2) if marker else None,
            )
        )
        i = end + 1
    return found


ALL = [b for page in pages() for b in blocks(page)]


# -- the convention ---------------------------------------------------------------------------


def test_every_block_names_its_language_and_every_snippet_is_run_or_a_named_fragment() -> None:
    problems = []
    for b in ALL:
        if not b.lang:
            problems.append(f"{b.where}: name the block's language (text for output, diagrams)")
        elif b.lang in RUNNABLE and b.kind is None:
            problems.append(
                f"{b.where}: a {b.lang} block without a marker: put `<!-- run: SETUP -->` or "
                "`<!-- fragment: tests/PATH.py::test_name -->` on the line before it "
                "(CONTRIBUTING.md)"
            )
        elif b.kind == "run" and b.target not in SETUPS:
            problems.append(f"{b.where}: no setup {b.target!r} in tests/test_doc_snippets.py")
        elif b.kind == "run" and b.lang not in RUNNABLE:
            problems.append(f"{b.where}: only Python and shell blocks run (this is {b.lang})")
    assert not problems, "\n".join(problems)
    assert len([b for b in ALL if b.kind == "run"]) >= 15  # the extraction works


def test_every_fragment_names_a_test_that_exists() -> None:
    problems = []
    for b in ALL:
        if b.kind != "fragment":
            continue
        path, _, name = (b.target or "").partition("::")
        source = REPO / path
        if not (path.startswith("tests/") and path.endswith(".py") and name):
            problems.append(f"{b.where}: a fragment names tests/PATH.py::test_name")
        elif not source.is_file():
            problems.append(f"{b.where}: {path} does not exist")
        elif not re.search(rf"^(async )?def {re.escape(name)}\(", source.read_text(), re.M):
            problems.append(f"{b.where}: {path} has no test {name}")
    assert not problems, "\n".join(problems)


# -- running them -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """How the blocks marked ``run: NAME`` run.

    ``stores``: the databases they run on, one after the other (``URL`` in Python programs,
    ``$DATABASE_URL`` and ``$JOBFENCE_DATABASE_URL`` in shells; None: no database);
    ``program``: the Python program each Python block runs in, the block in place of the
    line ``{BLOCK}`` (indented as that line is); ``shell``: lines before each shell block;
    ``seed``: awaited once with the database URL before the first block; ``files``: written
    to the folder first (``.sql``: run on the database); ``check``: awaited after the last
    block."""

    stores: tuple[str | None, ...] = ("sqlite",)
    program: str = "{BLOCK}\n"
    shell: str = ""
    seed: Callable[[str], Awaitable[None]] | None = None
    files: dict[str, str] = field(default_factory=dict)
    check: Callable[[str, Path], Awaitable[None]] | None = None


async def _outbox_written(url: str, folder: Path) -> None:
    rows = await query(url, f"SELECT event_id, queue FROM {table(url, 'outbox')}")
    assert [tuple(r) for r in rows] == [("order-created-o-1", "orders.created")]
    assert await query(url, "SELECT id, total FROM orders") == [("o-1", 12)]


async def _alert_queued(url: str, folder: Path) -> None:
    rows = await query(url, f"SELECT source, category FROM {table(url, 'alert_events')}")
    assert [tuple(r) for r in rows] == [("outbox", "PUBLISH_FAILED")]


async def _ledger_row(url: str, folder: Path) -> None:
    assert await query(url, "SELECT member_id, points FROM ledger") == [("m-1", 40)]


async def _letters_reviewed(url: str, folder: Path) -> None:
    rows = await query(url, f"SELECT status, count(*) FROM {table(url, 'dead_letters')} GROUP BY 1")
    assert dict(rows) == {"replayed": 44, "discarded": 1}


async def _po_812(url: str) -> None:
    from jobfence import App

    async with App(url) as jf:
        await jf.enqueue("erp.send", {"po": 812}, job_id="po-812")


async def _both_enqueued(url: str, folder: Path) -> None:
    rows = await query(url, f"SELECT job_id FROM {table(url, 'jobs')} ORDER BY job_id")
    assert [r[0] for r in rows] == ["order-42", "order-43"]
    assert await query(url, "SELECT id FROM orders") == [("o-43",)]


async def _queue_resumed(url: str, folder: Path) -> None:
    assert await query(url, f"SELECT queue FROM {table(url, 'queue_pauses')}") == []


APP = "from jobfence import App\napp = App(URL)\n"
#: the block as the body of ``main()``, run with ``asyncio.run``
IN_MAIN = "import asyncio\n\n\nasync def main():\n    {BLOCK}\n\n\nasyncio.run(main())\n"
MYAPP = """\
import jobfence

app = jobfence.App({URL!r})


@app.consumer("erp.send")
async def send(job, tx):
    raise jobfence.TemporaryError("ERP down")
"""
#: the block as a handler's body: one job through a real worker
IN_HANDLER = """\
import asyncio, time
from jobfence import App

app = App(URL)
member, points = "m-1", 40


@app.consumer("points.credit")
async def credit(job, tx):
    {BLOCK}


async def main():
    async with app:
        await app.enqueue("points.credit", {}, job_id="j-1")
        worker = app.worker(concurrency=1, poll_interval=0.05)
        running = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while not worker.stats.handled and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        worker.request_stop()
        await running


asyncio.run(main())
"""
SEED_LETTERS = """
from tests.deadletters.conftest import letter_params, seed_letters
asyncio.run(seed_letters(URL, [
    letter_params("sqlite", f"po-{n}", queue="erp.send", category="TEMPORARY_ERROR")
    for n in range(1, 46)
]))
"""

SETUPS: dict[str, Setup] = {
    # a Python block that needs nothing but jobfence (and its extras)
    "plain": Setup(stores=(None,)),
    # a block that uses `app` (imports as the page's earlier blocks have them)
    "app": Setup(program=APP + "token = 'bs-token'\n{BLOCK}\n"),
    "outbox": Setup(
        program=APP
        + "from jobfence import Relay\n"
        + "order_id, total, request_id = 'o-1', 12, 'req-1'\n"
        + IN_MAIN,
        files={"orders.sql": "CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)"},
        check=_outbox_written,
    ),
    "alerts": Setup(program=APP + "event_id = 'e-1'\n" + IN_MAIN, check=_alert_queued),
    # a handler's body, on both stores: the same placeholders
    "handler-tx": Setup(
        stores=("sqlite", "postgresql"),
        program=IN_HANDLER,
        files={"ledger.sql": "CREATE TABLE ledger (member_id TEXT, points INTEGER, job_id TEXT)"},
        check=_ledger_row,
    ),
    "letters-in-code": Setup(
        program=APP + "import asyncio\n" + SEED_LETTERS + IN_MAIN, check=_letters_reviewed
    ),
    "http": Setup(
        program="from datetime import timedelta\nfrom fastapi import FastAPI\n"
        + "from jobfence import App\napi = FastAPI()\njobfence_app = App(URL)\n"
        + "def partner_of(request):\n    return None\n{BLOCK}\n",
    ),
    "sqlalchemy": Setup(
        stores=(None,),
        program=(
            "import jobfence, pydantic\n"
            "from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column\n"
            "class OrderPlaced(pydantic.BaseModel):\n    order_id: int\n"
            "class Base(DeclarativeBase):\n    pass\n"
            "class Order(Base):\n    __tablename__ = 'orders'\n"
            "    id: Mapped[int] = mapped_column(primary_key=True)\n    sku: Mapped[str]\n"
            "class Shipment(Base):\n    __tablename__ = 'shipments'\n"
            "    id: Mapped[int] = mapped_column(primary_key=True)\n"
            "    order_id: Mapped[int]\n    sku: Mapped[str]\n{BLOCK}\n"
        ),
    ),
    # jobfence commands on a queue with a job po-812 that failed once (erp.send), --app myapp:app
    "ops-cli": Setup(
        files={"myapp.py": MYAPP},
        shell="export JOBFENCE_APP=myapp:app\n",
        seed=_po_812,
        check=_queue_resumed,
    ),
    # `pip install 'jobfence[…]'`: the extras exist and what they install is installed here
    "pip": Setup(stores=(None,)),
    # shell lines that need nothing
    "shell": Setup(stores=(None,)),
    # a block that uses jobfence's public names as the page's earlier blocks import them
    "api": Setup(stores=(None,), program="from jobfence import *\n{BLOCK}\n"),
    # the README's "enqueue from code": an app that is not open, then the caller's transaction
    "readme-enqueue": Setup(
        stores=("postgresql",),
        program="import jobfence, psycopg\napp = jobfence.App(URL)\nurl = URL\n" + IN_MAIN,
        files={"orders.sql": "CREATE TABLE orders (id TEXT PRIMARY KEY, member_id TEXT)"},
        check=_both_enqueued,
    ),
}


def _pip_shim(folder: Path) -> Path:
    """A `pip` for the shell blocks: `pip install 'jobfence[a,b]'` checks that the extras
    exist and that their requirements are installed in the test's environment (it installs
    nothing); any other use of pip fails the block."""
    shim = folder / ".bin" / "pip"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import importlib.metadata as md, re, sys, tomllib
            extras = tomllib.load(open({str(REPO / "pyproject.toml")!r}, "rb"))
            extras = extras["project"]["optional-dependencies"]
            args = sys.argv[1:]
            if not args or args[0] != "install" or not args[1:]:
                sys.exit(f"the snippets' pip only checks pip install 'jobfence[...]': {{args}}")
            for arg in args[1:]:
                found = re.fullmatch(r"jobfence\\[([\\w,-]+)\\]", arg)
                if not found:
                    sys.exit(f"the doc snippets' pip installs only jobfence's extras, not {{arg}}")
                for extra in found.group(1).split(","):
                    if extra not in extras:
                        sys.exit(f"jobfence has no extra {{extra!r}}")
                    for req in extras[extra]:
                        name = re.split(r"[<>=!~; \\[]", req, maxsplit=1)[0]
                        md.version(name)  # raises when the extra's package is missing
            """
        ),
        encoding="utf-8",
    )
    shim.chmod(0o755)
    return shim.parent


def _run(argv: list[str], folder: Path, env: dict[str, str], what: str) -> str:
    """Run one block in its own process group; background jobs (`… &`) end with it."""
    proc = subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not finish within {TIMEOUT} s:\n{out}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out}"
    return out


def _python_source(setup: Setup, block: Block, url: str | None) -> str:
    lines = setup.program.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == "{BLOCK}"]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    body = textwrap.indent(block.code, indent).rstrip("\n")
    return "\n".join([f"URL = {url!r}", *lines[:at], body, *lines[at + 1 :]]) + "\n"


async def _prepare(url: str | None, folder: Path, setup: Setup) -> None:
    for name, content in setup.files.items():
        if name.endswith(".sql"):
            assert url is not None
            from jobfence import App

            async with App(url) as jf, jf.db.transaction() as tx:
                await tx.execute(content)
        else:
            (folder / name).write_text(content.replace("{URL!r}", repr(url)), encoding="utf-8")


#: the blocks of each setup, page after page (one folder, one database per store)
GROUPS: dict[str, list[Block]] = {}
for _b in ALL:
    if _b.kind == "run" and _b.target in SETUPS and _b.lang in RUNNABLE:
        GROUPS.setdefault(_b.target or "", []).append(_b)
RUNS = [(name, store) for name in sorted(GROUPS) for store in SETUPS[name].stores]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r[0]}:{r[1] or 'no-db'}")
def test_the_snippet_runs(
    run: tuple[str, str | None], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    name, store = run
    setup = SETUPS[name]
    url: str | None = None
    if store == "sqlite":
        url = str(request.getfixturevalue("sqlite_database"))
    elif store == "postgresql":
        url = str(request.getfixturevalue("pg_database"))
    asyncio.run(_prepare(url, tmp_path, setup))
    bin_dir = _pip_shim(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env.pop("COLUMNS", None)
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    if url is not None:
        env["DATABASE_URL"] = env["JOBFENCE_DATABASE_URL"] = url
    if setup.seed is not None:
        assert url is not None
        asyncio.run(setup.seed(url))
    for block in GROUPS[name]:
        what = f"the {block.lang} block at {block.where}"
        if block.lang == "python":
            script = tmp_path / f"snippet_{block.line}.py"
            script.write_text(_python_source(setup, block, url), encoding="utf-8")
            _run([sys.executable, str(script)], tmp_path, env, what)
        else:
            source = "set -euo pipefail\n" + setup.shell + block.code
            _run(["bash", "-c", source], tmp_path, env, what)
    if setup.check is not None:
        assert url is not None
        asyncio.run(setup.check(url, tmp_path))


def test_extras_named_by_the_docs_exist() -> None:
    """The pip shim's premise: pyproject.toml declares the extras the pages install."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = set()
    for b in ALL:
        named |= {
            e for found in re.findall(r"jobfence\[([\w,-]+)\]", b.code) for e in found.split(",")
        }
    assert named
    assert named <= set(extras), named - set(extras)


def test_the_scripts_and_benchmarks_the_docs_run_exist_with_their_flags() -> None:
    """The commands of the pages that take minutes or a whole machine (`bash scripts/…`, the
    benchmarks under bench/) are not run here: each script they name exists (a shell script
    that bash can parse) and takes every flag they pass."""
    commands = []
    for b in ALL:
        if b.lang in RUNNABLE:
            joined = b.code.replace("\\\n", " ")
            commands += re.findall(
                r"(?:^|\s)(?:bash|\.venv/bin/python) ((?:scripts|bench)/\S+)(.*)", joined
            )
    assert len(commands) >= 6  # the scan works
    for script, rest in commands:
        path = REPO / script
        assert path.is_file(), f"the docs run {script}, which does not exist"
        if script.startswith("scripts/"):
            parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert parsed.returncode == 0, f"{script}: {parsed.stderr}"
            continue
        # the script's flags, or those of the bench modules it builds its parser from
        source = "".join(p.read_text(encoding="utf-8") for p in (REPO / "bench").glob("*.py"))
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest.split("#", 1)[0]):
            assert f'"{flag}"' in source, f"the docs pass {flag} to {script}: no such flag"
