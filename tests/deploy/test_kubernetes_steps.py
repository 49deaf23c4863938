"""The two steps of the Kubernetes deployment that run jobfence itself, run here for real:
the init container's `jobfence migrate --wait` against a PostgreSQL that is still starting (and
again, re-applied), and deploy/kubernetes/create-ops-token.sh, with a stand-in `kubectl` that
runs the command it was asked to `exec` in this machine's shell (there is no cluster here)."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

from jobfence.ops.auth import authenticate

from ..contract.servers import PostgresServer
from ..deadletters.conftest import opened
from ..helpers import REPO, query, scalar

SCRIPT = REPO / "deploy" / "kubernetes" / "create-ops-token.sh"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    return {**env, **extra}


def _migrate(url: str, wait: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "migrate", "--wait", wait, "--database-url", url],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_migrate_waits_for_a_starting_database_then_reapplies_cleanly() -> None:
    server = PostgresServer()  # initialised, not started: the database is not up yet
    try:
        proc = _migrate(server.url, "2m")
        await asyncio.sleep(0)
        began = time.monotonic()
        while time.monotonic() - began < 3:  # it keeps waiting while nothing answers
            assert proc.poll() is None
            await asyncio.sleep(0.1)
        await asyncio.to_thread(server.start)
        out, err = await asyncio.to_thread(proc.communicate, timeout=120)
        assert proc.returncode == 0, err
        assert "waiting up to 120 s for the database" in err
        assert err.count("\n") == 1, err  # said once, not once per try
        assert re.search(r"applied migrations 1, 2, .*11(, \d+)* to ", out), out
        assert await scalar(server.url, "SELECT max(version) FROM core.schema_migrations") >= 11
        again = await asyncio.to_thread(_migrate(server.url, "5m").communicate, timeout=120)
        assert "is up to date" in again[0], again  # the next pod's init container
    finally:
        await asyncio.to_thread(server.close)


def test_migrate_gives_up_after_its_wait_in_one_line() -> None:
    began = time.monotonic()
    proc = _migrate("postgresql://postgres@127.0.0.1:1/nowhere", "2s")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert time.monotonic() - began >= 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("waiting up to 2 s for the database: cannot connect")
    assert lines[-1].startswith("jobfence: error: cannot connect to postgresql://")
    assert "Traceback" not in err


def _stand_in_kubectl(folder: Path) -> Path:
    """A `kubectl` that records its arguments and runs what follows `--` here."""
    kubectl = folder / "kubectl"
    kubectl.write_text(
        "#!/usr/bin/env bash\n"
        'printf "%s\\n" "$*" > "$KUBECTL_LOG"\n'
        'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n'
        "shift\n"
        'exec "$@"\n'
    )
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    return kubectl


async def test_the_token_script_makes_a_working_operator_token(
    pg_database: str, tmp_path: Path
) -> None:
    bin_dir = Path(sys.executable).parent  # where `jobfence` is installed
    log = tmp_path / "kubectl.log"
    env = _env(
        PATH=f"{tmp_path}:{bin_dir}:{os.environ['PATH']}",
        KUBECTL=str(_stand_in_kubectl(tmp_path)),
        KUBECTL_LOG=str(log),
        JOBFENCE_DATABASE_URL=pg_database,
        USER="alice",
    )
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", str(SCRIPT), "first-admin", "operator", "30d"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert log.read_text().startswith("-n jobfence exec deploy/jobfence-ops -c ops -- jobfence")
    token = re.search(r"\bjfo_[\w-]+", done.stdout)
    assert token, done.stdout
    async with opened(pg_database) as db:
        principal = await authenticate(db, token.group(0))
    assert principal is not None
    assert (principal.name, principal.role) == ("first-admin", "operator")
    assert await query(pg_database, "SELECT actor, via, action FROM core.audit_log") == [
        ("kubectl:alice", "cli", "ops.token.create")
    ]


def test_the_token_script_refuses_a_wrong_role_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "bob", "admin"],
        env=_env(KUBECTL="/bin/false"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("the role is viewer or operator, not 'admin'")
