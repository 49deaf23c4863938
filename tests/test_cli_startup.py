"""Commands that cannot start say why in one line (issue 12 §3, §4): a missing extra names
``pip install 'jobfence[ops]'``; ``ops serve`` on an unreachable or unmigrated database fails
before uvicorn starts. Each runs the real command in a subprocess."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .helpers import REPO, wait_until

#: Start-up that hides the ops extra's modules, as if `pip install -e .` had installed no extra.
WITHOUT_OPS = (
    "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None; "
    "sys.modules['starlette'] = None; from jobfence.cli import main; main()"
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobfence: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ["ops", "serve"],
        ["ops", "token", "create", "--name", "ann", "--role", "viewer"],
        ["ops", "token", "list"],
        ["ops", "token", "revoke", "ann"],
        ["demo", "purchase-orders"],
    ],
)
def test_a_command_without_the_ops_extra_names_it(command: list[str], tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/never-created.db"
    extra = [] if command[0] == "demo" else ["--database-url", url]
    line = one_line_error(_run("-c", WITHOUT_OPS, *command, *extra))
    assert "pip install 'jobfence[ops]'" in line
    assert " ".join(["jobfence", *command[:3]]) in line or "jobfence demo purchase-orders" in line
    assert not os.path.exists(f"{tmp_path}/never-created.db")  # refused before it started


def test_the_ops_help_works_without_the_extra() -> None:
    result = _run("-c", WITHOUT_OPS, "ops", "--help")
    assert result.returncode == 0, result.stderr
    assert "jobfence[ops]" in result.stdout


@pytest.mark.parametrize(
    ("module", "hidden"),
    [("jobfence.http.idempotency", "starlette"), ("jobfence.ops.app", "fastapi")],
)
def test_importing_a_door_without_the_extra_raises_an_import_error_naming_it(
    module: str, hidden: str
) -> None:
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = _run("-c", code).stdout
    assert out.startswith("MissingExtra "), out
    assert "pip install 'jobfence[ops]'" in out


def test_ops_serve_on_an_unreachable_database_says_so_in_one_line() -> None:
    result = _run(
        "-m",
        "jobfence.cli",
        "ops",
        "serve",
        "--database-url",
        "postgresql://postgres@127.0.0.1:1/nope",
        "--port",
        str(_free_port()),
    )
    assert "cannot connect" in one_line_error(result)


def test_ops_serve_on_an_unmigrated_database_says_so_in_one_line(empty_pg_database: str) -> None:
    result = _run(
        "-m",
        "jobfence.cli",
        "ops",
        "serve",
        "--database-url",
        empty_pg_database,
        "--port",
        str(_free_port()),
    )
    assert "jobfence migrate" in one_line_error(result)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_ops_serve_on_a_migrated_database_serves_and_stops_on_sigterm(pg_database: str) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "jobfence.cli", "ops", "serve"),
            *("--database-url", pg_database, "--port", str(port), "--log-level", "warning"),
        ],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=60, what="ops serve answering /healthz")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        # uvicorn re-raises the SIGTERM it caught once it has shut down gracefully
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


#: shell lines that need the ops extra
NEEDS_OPS = re.compile(r"^\s*(?:\$ )?jobfence (?:ops (?:serve|token)|demo purchase-orders)\b")


@pytest.mark.parametrize(
    "doc",
    [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_the_docs_name_the_extra_before_a_command_that_needs_it(doc: Path) -> None:
    """Issue 12 §3: a reader who copies a shell line that needs the ops extra has been told
    `pip install 'jobfence[ops]'` earlier on the same page."""
    if doc.name == "configuration.md":
        return  # the generated flag reference: no shell lines to copy
    text = doc.read_text(encoding="utf-8")
    for block in re.finditer(r"```(?:sh|bash|console|shell)\n(.*?)```", text, re.DOTALL):
        for line in block.group(1).splitlines():
            if NEEDS_OPS.match(line):
                before = text[: block.start(1) + block.group(1).index(line)]
                assert "jobfence[ops]" in before, f"{doc.name}: {line.strip()!r}"
