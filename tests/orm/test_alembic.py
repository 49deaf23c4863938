"""Issue 13: an Alembic project gets jobfence's tables from a revision of its own — the
revision docs/integrations/sqlalchemy.md shows, verbatim, in a project made by `alembic
init`, run with `alembic upgrade head` as a user runs it, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobfence import App

from ..helpers import REPO
from .orm_app import sync_engine_url

pytest.importorskip("alembic")

DOC = (REPO / "docs" / "integrations" / "sqlalchemy.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent


def documented_revision() -> str:
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC, flags=re.DOTALL)
        if "jobfence.integrations.alembic.migrate(op.get_bind())" in b
    ]
    return block


async def pending(url: str) -> list[int]:
    """The migrations ``jobfence migrate`` would still apply (it applies them, and says so)."""
    app = App(url, auto_migrate=False)
    try:
        return await app.migrate()
    finally:
        await app.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database as a new project has it: jobfence's tables not there yet."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("empty_pg_database"))
    return f"sqlite:///{tmp_path / 'app.db'}"


def test_the_documented_alembic_revision_creates_jobfences_tables(
    store: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"

    def run(*args: str) -> str:
        done = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    from alembic import command
    from alembic.config import Config

    # `alembic init migrations`, in process (the upgrades below run as the user runs them)
    command.init(Config(str(tmp_path / "alembic.ini")), str(tmp_path / "migrations"))
    ini = tmp_path / "alembic.ini"
    ini.write_text(
        re.sub(
            r"^sqlalchemy\.url = .*$",
            f"sqlalchemy.url = {sync_engine_url(store)}",
            ini.read_text(),
            flags=re.MULTILINE,
        )
    )
    versions = tmp_path / "migrations" / "versions"
    revision = documented_revision()
    (versions / "2b1f_jobfence.py").write_text(revision)
    run("alembic", "upgrade", "head")
    # jobfence sees the schema version it needs: nothing left for `jobfence migrate`
    assert asyncio.run(pending(store)) == []

    # after a jobfence upgrade, a new revision with the same body applies what is pending
    again = revision.replace('revision = "2b1f"', 'revision = "3c2a"').replace(
        "down_revision = None", 'down_revision = "2b1f"'
    )
    (versions / "3c2a_jobfence.py").write_text(again)
    assert "2b1f -> 3c2a" in run("alembic", "upgrade", "head")
    assert "is up to date" in run("jobfence", "migrate", "--database-url", store)
