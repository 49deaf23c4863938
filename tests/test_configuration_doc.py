"""Issue 12 §10: docs/configuration.md is the single reference of every flag and every
environment variable, and cannot drift from the code."""

from __future__ import annotations

import ast
import inspect
import re

from jobfence import App
from jobfence.cli.jobs import worker as worker_command
from jobfence.cli.reference import apply
from jobfence.config import DEFAULT_BATCH_SIZE

from .helpers import REPO

PAGE = REPO / "docs" / "configuration.md"


def test_the_generated_reference_matches_the_commands() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert apply(page) == page, (
        "docs/configuration.md is out of date with the CLI: run "
        "`python -m jobfence.cli.reference docs/configuration.md`"
    )


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    page = PAGE.read_text(encoding="utf-8")
    read: set[str] = set()
    others: set[str] = set()
    for path in (REPO / "src").rglob("*.py"):
        code = path.read_text("utf-8")
        read |= set(re.findall(r"\bJOBFENCE_[A-Z][A-Z_]*[A-Z]\b", code))
        # any other variable read by name (os.environ.get/[...], os.getenv, envvar=; not a
        # WSGI environ)
        others |= set(
            re.findall(
                r"""(?:os\.environ(?:\.get\(|\[)|getenv\(|envvar=)["']([A-Z][A-Z0-9_]+)["']""", code
            )
        )
    assert len(read) >= 20  # the scan works
    assert {"PUBSUB_EMULATOR_HOST", "COLUMNS"} <= others  # and finds the others
    read |= others
    missing = sorted(name for name in read if f"`{name}`" not in page)
    assert not missing, f"read by the code, not in docs/configuration.md: {missing}"


def _documented_signature(title: str) -> tuple[dict[str, object], dict[str, str]]:
    """The defaults in a section's heading (``name=literal``) and in its table's last column."""
    page = PAGE.read_text(encoding="utf-8")
    section = page.split(f"## `{title}(", 1)[1].split("\n## ", 1)[0]
    heading, body = section.split("\n", 1)
    defaults: dict[str, object] = {}
    for name, value in re.findall(r"(\w+)=([^,)]+)", heading):
        defaults[name] = ast.literal_eval(value)
    table = dict(re.findall(r"^\| `(\w+)` \|.*\| ([^|]+) \|$", body, re.M))
    return defaults, {k: v.strip() for k, v in table.items()}


def test_the_worker_defaults_are_the_documented_ones_and_the_clis() -> None:
    """One default per setting: `app.worker()`, `jobfence worker` and the reference agree
    (issue 23: the page said batch_size=1 while both doors use 50)."""
    heading, table = _documented_signature("app.worker")
    code = {
        name: p.default
        for name, p in inspect.signature(App.worker).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }
    assert heading == code, "the app.worker heading in docs/configuration.md is out of date"
    for name, default in code.items():
        if isinstance(default, int | float) and not isinstance(default, bool):
            assert ast.literal_eval(table[name]) == default, f"the table's default of {name}"
    flags = {p.name: p.default for p in worker_command.params}
    assert flags["batch_size"] == code["batch_size"] == DEFAULT_BATCH_SIZE
    assert flags["concurrency"] == code["concurrency"]
