"""Issue 12 §9: one CLI. The rules are checked on the command tree itself (so a new command
cannot break them unseen), and the behaviour through real ``jobfence`` subprocesses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import click
import pytest

from jobfence.cli import main_group
from jobfence.cli.common import Duration, parse_duration
from jobfence.review.validation import MAX_PAGE

from .test_cli import jf, one_line_error

#: commands that run until stopped: they log instead of printing a result
LONG_RUNNING = {
    "worker",
    "relay",
    "scheduler",
    "ops serve",
    "cleanup",
    "alerts deliver",
}
#: commands that print no result to script against (a demo's report, a secret-free
#: confirmation is still JSON where it matters)
NO_RESULT = {"worker", "relay", "scheduler", "ops serve", "demo", "demo purchase-orders"}
#: flags whose value is a duration (the one grammar)
DURATION_FLAGS = {
    ("worker", "--shutdown-grace"),
    ("worker", "--batch-window"),
    ("worker", "--summary-interval"),
    ("enqueue", "--delay"),
    ("cleanup", "--interval"),
    ("cleanup", "--min-age"),
    ("alerts deliver", "--interval"),
    ("alerts deliver", "--window"),
    ("relay", "--poll-interval"),
    ("relay", "--retention"),
    ("outbox cleanup", "--retention"),
    ("ops serve", "--session-ttl"),
    ("worker", "--liveness-timeout"),
    ("relay", "--liveness-timeout"),
    ("calls list", "--older-than"),
    ("schedules prune", "--older-than"),
    ("migrate", "--wait"),
}
#: commands whose database is given by an APP argument (with JOBFENCE_APP) instead of --app,
#: and the demo, which runs on a temporary database of its own
OWN_DATABASE = {"worker", "relay", "scheduler", "demo", "demo purchase-orders"}


def commands() -> Iterator[tuple[str, click.Command]]:
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, click.Command]]:
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])
            if not getattr(cmd, "invoke_without_command", False):
                return
        if path:
            yield " ".join(path), cmd

    yield from walk(main_group, [])


def options(cmd: click.Command) -> dict[str, click.Option]:
    found: dict[str, click.Option] = {}
    for param in cmd.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                if opt.startswith("--"):
                    found[opt] = param
    return found


ALL = dict(commands())


def test_the_tree_is_what_these_rules_talk_about() -> None:
    for name in LONG_RUNNING | NO_RESULT | OWN_DATABASE | {c for c, _ in DURATION_FLAGS}:
        assert name in ALL, f"{name} is not a command any more: update this test"


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_flag_has_help(name: str) -> None:
    for opt, param in options(ALL[name]).items():
        if opt in ("--help", "--version"):
            continue
        assert (param.help or "").strip(), f"jobfence {name} {opt} has no help text"


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_database_command_takes_the_app(name: str) -> None:
    opts = options(ALL[name])
    if "--database-url" not in opts or name in OWN_DATABASE:
        return
    assert "--app" in opts, f"jobfence {name} has --database-url but no --app"
    assert opts["--app"].envvar == "JOBFENCE_APP"
    assert opts["--database-url"].envvar == "JOBFENCE_DATABASE_URL"
    assert opts["--schema"].envvar == "JOBFENCE_SCHEMA"


@pytest.mark.parametrize("name", sorted(ALL))
def test_json_on_every_command_that_prints_a_result(name: str) -> None:
    if name in NO_RESULT:
        return
    assert "--json" in options(ALL[name]), f"jobfence {name} has no --json"


@pytest.mark.parametrize("name", sorted(ALL))
def test_one_actor_option(name: str) -> None:
    opts = options(ALL[name])
    assert "--by" not in opts or name == "dead-letters audit", (
        f"jobfence {name}: who acts is --actor, not --by"
    )
    if "--actor" in opts:
        assert opts["--actor"].envvar == "JOBFENCE_ACTOR"


@pytest.mark.parametrize("name", sorted(ALL))
def test_one_limit_cap(name: str) -> None:
    limit = options(ALL[name]).get("--limit")
    if limit is None:
        return
    assert isinstance(limit.type, click.IntRange)
    assert (limit.type.min, limit.type.max) == (1, MAX_PAGE), f"jobfence {name} --limit"


@pytest.mark.parametrize("name", sorted(LONG_RUNNING))
def test_long_running_commands_log_alike(name: str) -> None:
    opts = options(ALL[name])
    level, fmt = opts["--log-level"], opts["--log-format"]
    assert (level.default, fmt.default) == ("INFO", "console")
    assert (level.envvar, fmt.envvar) == ("JOBFENCE_LOG_LEVEL", "JOBFENCE_LOG_FORMAT")


@pytest.mark.parametrize("name", ["worker", "relay"])
def test_every_worker_and_relay_flag_has_an_environment_variable(name: str) -> None:
    for opt, param in options(ALL[name]).items():
        if opt == "--help":
            continue
        assert str(param.envvar).startswith("JOBFENCE_"), (
            f"jobfence {name} {opt} has no JOBFENCE_ environment variable"
        )
    argument = next(p for p in ALL[name].params if isinstance(p, click.Argument))
    assert argument.envvar == "JOBFENCE_APP"


def test_duration_flags_share_one_grammar() -> None:
    for name, opt in DURATION_FLAGS:
        assert isinstance(options(ALL[name])[opt].type, Duration), f"jobfence {name} {opt}"
    for name, cmd in ALL.items():
        for opt, param in options(cmd).items():
            if isinstance(param.type, Duration):
                assert (name, opt) in DURATION_FLAGS, f"add jobfence {name} {opt} to the list"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("7d", 604800), ("2h", 7200), ("250ms", 0.25), ("1.5", 1.5)],
)
def test_the_duration_grammar(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["5 minutes", "-1s", "1w", "", "s"])
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_a_bad_duration_is_one_line_with_the_grammar(sqlite_database: str) -> None:
    line = one_line_error(
        jf("enqueue", "q", "--payload", "{}", "--delay", "soon", "--database-url", sqlite_database)
    )
    assert "'soon' is not a duration: 250ms, 30s, 5m, 12h, 7d, or plain seconds" in line


def test_delay_takes_the_grammar_end_to_end(sqlite_database: str) -> None:
    put = jf(
        "enqueue", "q", "--payload", "{}", "--delay", "2h", "--json", "--database-url",
        sqlite_database,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    job = json.loads(put.stdout)
    assert set(job) == {"job_id", "queue"}


def test_outbox_redrive_by_is_gone(sqlite_database: str) -> None:
    result = jf(
        "outbox", "redrive", "x", "--reason", "r", "--by", "me", "--database-url",
        sqlite_database,
    )  # fmt: skip
    assert "No such option '--by'" in one_line_error(result)


def test_a_limit_over_the_cap_is_refused(sqlite_database: str) -> None:
    line = one_line_error(
        jf("dead-letters", "list", "--limit", str(MAX_PAGE + 1), "--database-url", sqlite_database)
    )
    assert f"1<=x<={MAX_PAGE}" in line


def test_worker_flags_come_from_the_environment_too() -> None:
    """A bad value given by the environment is reported naming the variable."""
    line = one_line_error(jf("worker", "x:y", env={"JOBFENCE_CONCURRENCY": "0"}))
    assert "JOBFENCE_CONCURRENCY" in line
    assert "0 is not in the range" in line


#: commands that print a list with --json: one object per line (JSON lines)
LISTS = {
    "schedules",
    "dead-letters list",
    "dead-letters audit",
    "alerts list",
    "ops token list",
    "outbox list",
    "jobs list",
    "queues list",
    "calls list",
}


def test_json_output_has_the_documented_shape(sqlite_database: str) -> None:
    """`--json` prints one object per line for a list, one object otherwise (what
    docs/configuration.md says), on a store with something to show: every command that
    prints a result is run once (in-process: this checks the shape, not the process)."""
    import asyncio

    from click.testing import CliRunner

    from jobfence import App, outbox

    from .deadletters.conftest import letter_params, seed_letters

    url = sqlite_database
    ids = asyncio.run(seed_letters(url, [letter_params("sqlite", f"j-{i}") for i in range(4)]))

    async def seed_event() -> None:
        async with App(url) as app, app.db.transaction() as tx:
            await outbox.write(tx, "q", {"x": 1}, event_id="evt-1")

    asyncio.run(seed_event())

    async def seed_call() -> None:  # an in-doubt call, through the ledger's own statements
        from jobfence.calls import open_ledger
        from jobfence.config import parse_database_url

        ledger = await open_ledger(parse_database_url(url))
        try:
            params = {"consumer": "q", "queue": "q", "job_id": "j-9", "step": "erp.create"}
            [row] = await ledger.run("calls_intent", {**params, "key": "k-9", "partner": None})
            await ledger.run("calls_doubt", {"id": row["id"], "error": "read timeout"})
        finally:
            await ledger.close()

    asyncio.run(seed_call())
    runs = {
        "migrate": ["migrate"],
        "enqueue": ["enqueue", "q", "--payload", "{}"],
        "dead-letters stats": ["dead-letters", "stats"],
        "dead-letters show": ["dead-letters", "show", str(ids[0])],
        "dead-letters replay": ["dead-letters", "replay", str(ids[0]), "--actor", "ann"],
        "dead-letters discard": [
            "dead-letters", "discard", str(ids[1]), "--reason", "dup", "--actor", "ann",
        ],
        "dead-letters list": ["dead-letters", "list", "--status", "all"],
        "dead-letters audit": ["dead-letters", "audit"],
        "cleanup": ["cleanup", "--once"],
        "ops token create": ["ops", "token", "create", "--name", "ann", "--role", "viewer"],
        "ops token list": ["ops", "token", "list"],
        "ops token revoke": ["ops", "token", "revoke", "ann"],
        "dead-letters replay#bulk": ["dead-letters", "replay", "--job-id", "j-2", "--yes"],
        "dead-letters discard-matching": [
            "dead-letters", "discard-matching", "--job-id", "j-3", "--reason", "r", "--yes",
        ],
        "enqueue#later": ["enqueue", "q", "--payload", "{}", "--delay", "1h"],
        "jobs list": ["jobs", "list"],
        "jobs show": ["jobs", "show", "--id", "1"],
        "jobs retry-now": ["jobs", "retry-now", "--id", "4"],  # the delayed one
        "jobs cancel": ["jobs", "cancel", "--id", "1", "--reason", "r"],
        "queues pause": ["queues", "pause", "q"],
        "queues list": ["queues", "list"],
        "queues resume": ["queues", "resume", "q"],
        "queues pause-key": ["queues", "pause-key", "q", "acme", "--reason", "r"],
        "queues resume-key": ["queues", "resume-key", "q", "acme"],
        "dead-letters replay-report": ["dead-letters", "replay-report", "1"],
        "outbox list": ["outbox", "list"],
        "outbox show": ["outbox", "show", "evt-1"],
        "outbox redrive": ["outbox", "redrive", "--all", "--yes", "--reason", "r"],
        "alerts deliver": ["alerts", "deliver", "--once"],
        "outbox cleanup": ["outbox", "cleanup"],
        "alerts list": ["alerts", "list"],
        "calls list": ["calls", "list", "--state", "all"],
        "calls show": ["calls", "show", "1"],
        "calls settle": ["calls", "settle", "1", "not_applied", "--reason", "not there"],
        "schedules": ["schedules"],
        "schedules prune": ["schedules", "prune"],
    }  # fmt: skip
    runner = CliRunner()
    env = {"JOBFENCE_ACTOR": "ann", "COLUMNS": "200"}
    printing = {n for n, cmd in ALL.items() if n not in NO_RESULT and "--json" in options(cmd)}
    assert {n.partition("#")[0] for n in runs} == printing
    for key, argv in runs.items():
        name = key.partition("#")[0]
        result = runner.invoke(main_group, [*argv, "--json", "--database-url", url], env=env)
        assert result.exit_code == 0, (name, result.output)
        lines = result.stdout.splitlines()
        try:
            parsed = [json.loads(line) for line in lines]
        except ValueError:
            pytest.fail(f"jobfence {name} --json printed: {result.stdout!r}")
        assert all(isinstance(p, dict) for p in parsed), (name, result.stdout)
        if name in LISTS:
            assert name != "dead-letters list" or len(parsed) == 4, result.stdout
            assert name != "dead-letters audit" or len(parsed) >= 2, result.stdout
        else:
            assert len(parsed) == 1, (name, result.stdout)
