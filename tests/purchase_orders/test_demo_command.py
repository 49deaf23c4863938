"""`jobfence demo purchase-orders` as a user runs it: one command, a temporary database on the
local PostgreSQL server, a summary whose checks prove no double order, exit status 0."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from ..conftest import PG_ADMIN


def _demo_databases() -> set[str]:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'jobfence_demo_po_%%'"
        ).fetchall()
    return {row[0] for row in rows}


def test_demo_purchase_orders_runs_end_to_end_and_cleans_up() -> None:
    """The demo starts its own database, ERP stand-in, API, worker and relay, prints the
    checks (all ok, "no double order") and drops its database afterwards."""
    before = _demo_databases()
    result = subprocess.run(
        [sys.executable, "-m", "jobfence.cli", "demo", "purchase-orders", "--posts", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},  # the summary's rows unwrapped
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "no double order; every request accounted for" in out
    assert "some checks failed" not in out
    assert out.count("│ ok │") == 9  # every check of the summary
    assert "ERP orders created = completed" in out
    # the ERP does not de-duplicate (the default): the call ledger keeps it to one order each
    assert "ERP orders created = requests accepted (ERP de-duplication off)" in out
    assert "ERP calls in doubt" in out
    assert "found in the ERP by the key" in out
    assert _demo_databases() == before
