"""deploy/prometheus/alerts.yml and deploy/grafana/jobfence.json: the rules pass promtool's
check and its unit tests (series that must and must not fire), the dashboard is well formed,
and every series the two query is in a real worker's or relay's /metrics."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..helpers import REPO, start_worker, stop_process
from ..test_health import expect, free_port, scrape, start_relay

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "jobfence.json"
SERIES = re.compile(r"\bjobfence_[a-z0-9_]+")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: bash scripts/promtool installs it (Debian's prometheus)")
    return found


def run_promtool(*args: str) -> str:
    done = subprocess.run(
        [promtool(), *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_pass_promtool_check() -> None:
    out = run_promtool("check", "rules", RULES.name)
    assert "SUCCESS" in out


def test_the_rules_unit_tests_pass() -> None:
    """alerts_test.yml: for every rule, input series that fire it and series that do not."""
    run_promtool("test", "rules", RULES_TEST.name)


def test_every_rule_has_a_unit_test_that_fires_it() -> None:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {
        t["alertname"] for group in tests for t in group["alert_rule_test"] if t.get("exp_alerts")
    }
    quiet = {
        t["alertname"]
        for group in tests
        for t in group["alert_rule_test"]
        if not t.get("exp_alerts")
    }
    names = {r["alert"] for r in rules}
    assert names == fired, f"rules without a firing test: {names - fired}"
    assert names == quiet, f"rules without a quiet test: {names - quiet}"
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"], rule["alert"]


def dashboard_queries() -> list[str]:
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found += [t["expr"] for t in panel.get("targets", [])]
    return found


def test_the_dashboard_is_well_formed() -> None:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "jobfence"
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "queue"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert SERIES.search(target["expr"]), (panel["title"], target["expr"])


def exposed(text: str) -> set[str]:
    """The series names a scrape offers (a histogram's _bucket, _sum and _count too)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)$", text, re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_series_the_dashboard_and_rules_query_is_exported(
    pg_ledger: str, tmp_path: Path
) -> None:
    """A real worker and a real relay against PostgreSQL, scraped: their /metrics offer
    every series named in the dashboard's and the rules' queries."""
    wanted = set()
    for expr in dashboard_queries():
        wanted |= set(SERIES.findall(expr))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            wanted |= set(SERIES.findall(rule["expr"]))
    assert len(wanted) > 20

    worker_port, relay_port = free_port(), free_port()
    env = {"JF_DB": pg_ledger, "JF_MARKS": str(tmp_path)}
    worker = start_worker(
        "tests.apps.shutdown_app:app", env, tmp_path / "w.log", "--metrics-port", str(worker_port)
    )
    relay = start_relay(pg_ledger, relay_port, tmp_path / "relay.log")
    try:
        expect(worker_port, "/readyz", 200)
        expect(relay_port, "/readyz", 200)
        offered = exposed(scrape(worker_port)) | exposed(scrape(relay_port))
    finally:
        for proc in (worker, relay):
            proc.send_signal(signal.SIGTERM)
        stop_process(worker)
        stop_process(relay)
    missing = sorted(wanted - offered)
    assert not missing, f"queried but exported by neither a worker nor a relay: {missing}"
