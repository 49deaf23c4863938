"""Issue 12 §2: the README's first-contact path, run as a new user runs it — the twenty lines
as ``myapp.py`` (its database URL is the only thing changed, to the test's own database), the
ledger DDL, then every shell line of the README verbatim: migrate, worker, enqueue,
dead-letters, and the ops API.

Issue 13: the same path runs unchanged on SQLite too, with the URL the README's comment
gives (``sqlite:///jobs.db``): the handler's ``%s`` placeholders work on both stores."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence.config import parse_database_url
from jobfence.db import connect

from .helpers import REPO, eventually, query, wait_until

README = (REPO / "README.md").read_text(encoding="utf-8")
SECTION = README.split("## Twenty lines", 1)[1].split("\n## ", 1)[0]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", SECTION, flags=re.DOTALL)


def app_source(database_url: str) -> str:
    (source,) = [b for b in blocks("python") if "# myapp.py" in b]
    url = re.search(r'jobfence\.App\("([^"]+)"\)', source)
    assert url is not None, "the README's app names its database URL"
    return source.replace(url.group(1), database_url)


def shell_lines() -> list[str]:
    lines = []
    for block in blocks("sh"):
        for line in block.splitlines():
            line = line.split("   #", 1)[0].strip()
            if line and not line.startswith("pip install"):  # the test's venv has the extras
                lines.append(line)
    return lines


class User:
    """A shell in the user's project folder: exported variables carry over, ``&`` lines run
    in the background (stopped at the end)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        bin_dir = str(Path(sys.executable).parent)
        # a new user's shell: no JOBFENCE_* yet, and no COLUMNS inherited from the test
        # runner (xdist workers carry COLUMNS=80, which would wrap the ids in the table)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("JOBFENCE_") and k not in ("COLUMNS", "LINES")
        }
        self.env["PATH"] = f"{bin_dir}:{self.env.get('PATH', '')}"
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            self.env[name] = shlex.split(value)[0]
            return subprocess.CompletedProcess(line, 0, "", "")
        if line.endswith("&"):
            log = (self.folder / f"bg-{len(self.background)}.log").open("ab")
            self.background.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {line[:-1]}"],
                    cwd=self.folder,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            return subprocess.CompletedProcess(line, 0, "", "")
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{line!r} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def stop(self) -> None:
        procs, self.background = self.background, []
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[list[User]]:
    users: list[User] = []
    yield users
    for person in users:
        person.stop()


async def create_ledger(database_url: str) -> None:
    (ddl,) = blocks("sql")
    db = connect(parse_database_url(database_url))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute(ddl.strip().rstrip(";"))
    finally:
        await db.close()


def readme_sqlite_url() -> str:
    (source,) = [b for b in blocks("python") if "# myapp.py" in b]
    found = re.search(r'# or "(sqlite:///[^"]+)"', source)
    assert found is not None, "the README's app names the SQLite URL next to PostgreSQL's"
    return found.group(1)


async def test_the_readme_first_contact_path_runs_verbatim(
    folders: list[User], empty_pg_database: str, tmp_path: Path
) -> None:
    """On PostgreSQL, then on SQLite — one after the other, in one test: the README's ports
    (8089, 9108) are fixed."""
    sqlite_url = readme_sqlite_url()  # relative: the file lands in the user's folder
    for name, app_url in (("postgresql", empty_pg_database), ("sqlite", sqlite_url)):
        folder = tmp_path / name
        folder.mkdir()
        user = User(folder)
        folders.append(user)
        store = app_url
        if app_url.startswith("sqlite:///"):
            store = f"sqlite:///{folder / app_url.removeprefix('sqlite:///')}"
        await first_contact(user, app_url, store)
        user.stop()
        files = sorted(p.name for p in folder.glob("*.db"))
        assert files == ([] if name == "postgresql" else [Path(store).name]), (
            "no command made a SQLite file of its own"
        )


async def first_contact(user: User, app_url: str, store: str) -> None:
    """The README's shell lines in ``user``'s folder, with ``myapp.py`` on ``app_url``
    (``store`` is the same database as the test reaches it)."""
    lines = shell_lines()
    assert any(line.startswith("jobfence worker") for line in lines)
    (user.folder / "myapp.py").write_text(app_source(app_url), encoding="utf-8")
    for line in lines:
        if line.startswith("jobfence dead-letters list"):
            # the worker runs in the background: wait until it has handled both jobs
            await eventually(lambda: query(store, "SELECT job_id FROM ledger"), what="the credit")
            wait_until(
                lambda cmd=line: "order-43" in user.run(cmd).stdout,
                what="the dead letter",
                timeout=60,
            )
        if line.startswith("curl"):
            wait_until(lambda: _serving(8089), what="ops serve", timeout=60)
            body = json.loads(user.run(line).stdout)
            assert [item["job_id"] for item in body["items"]] == ["order-43"]
            continue
        output = user.run(line)
        if line.startswith("jobfence migrate"):
            await create_ledger(store)  # the README's "once, with your usual tool"
            assert "applied migrations" in output.stdout
    assert await query(store, "SELECT member_id, points, job_id FROM ledger") == [
        ("m-1", 40, "order-42")
    ]


def _serving(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0
