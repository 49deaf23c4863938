"""Issue 12 §10: docs/configuration.md is the single reference of every flag and every
environment variable, and cannot drift from the code."""

from __future__ import annotations

import re

from jobfence.cli.reference import apply

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
