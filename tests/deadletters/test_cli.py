"""The CLI twins (``jobfence dead-letters …``, ``cleanup``, ``ops token``, ``alerts``): the
same service functions as the API, one-line errors, JSON for scripts. Both stores."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobfence.cli import main
from jobfence.cli.deadletters import list_dead_letters, replay
from jobfence.cli.jobctl import discard_matching
from jobfence.ops.auth import authenticate

from ..helpers import query, table
from ..test_cli import jf
from .conftest import letter_params, opened, seed_letters


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def jobfence(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def seed(url: str, *job_ids: str, **kwargs: Any) -> list[int]:
    return asyncio.run(
        seed_letters(url, [letter_params(dialect(url), j, **kwargs) for j in job_ids])
    )


def test_discard_without_a_reason_is_one_clear_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blank --reason and a missing one are refused in one line; nothing changes."""
    [letter] = seed(database_url, "j1")
    blank = jobfence(
        capsys,
        "dead-letters",
        "discard",
        str(letter),
        "--reason",
        "  \t",
        "--database-url",
        database_url,
    )
    missing = jobfence(
        capsys, "dead-letters", "discard", str(letter), "--database-url", database_url
    )
    assert blank == (
        1,
        "",
        "jobfence: error: a discard needs a reason: say why this letter needs no replay (e.g. "
        "'order cancelled by the partner, ticket OPS-123')\n",
    )
    assert missing[0] == 2
    assert missing[2].startswith("jobfence: error: Missing option '--reason'.")
    assert missing[2].count("\n") == 1
    state = asyncio.run(
        query(database_url, f"SELECT status FROM {table(database_url, 'dead_letters')}")
    )
    assert state == [("pending_review",)]


def test_show_replay_discard_and_audit_for_scripts(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json everywhere: show has the payload, replay reports its outcome, a second replay
    is a one-line conflict, discard and audit record the actor."""
    url = database_url
    one, two = seed(url, "po-1", "po-2", correlation_id="req-1")
    code, out, _ = jobfence(
        capsys, "dead-letters", "show", str(one), "--json", "--database-url", url
    )
    shown = json.loads(out)
    assert code == 0
    assert (shown["job_id"], shown["correlation_id"], shown["status"]) == (
        "po-1",
        "req-1",
        "pending_review",
    )
    assert shown["payload"] == {"encoding": "utf-8", "data": '{"member_id": "po-1", "points": 1}'}
    replayed = jobfence(
        capsys,
        "dead-letters",
        "replay",
        str(one),
        "--json",
        "--actor",
        "ana",
        "--database-url",
        url,
    )
    again = jobfence(capsys, "dead-letters", "replay", str(one), "--database-url", url)
    discarded = jobfence(
        capsys,
        "dead-letters",
        "discard",
        str(two),
        "--reason",
        "test order",
        "--actor",
        "ben",
        "--json",
        "--database-url",
        url,
    )
    code, out, _ = jobfence(capsys, "dead-letters", "audit", "--json", "--database-url", url)
    assert json.loads(replayed[1]) == {
        "dead_letter_id": one,
        "outcome": "published",
        "detail": None,
    }
    assert again[0] == 1
    assert again[2].startswith(
        f"jobfence: error: dead letter {one} was already replayed by ana at "
    )
    assert json.loads(discarded[1]) == {
        "dead_letter_id": two,
        "outcome": "discarded",
        "detail": None,
    }
    entries = [json.loads(line) for line in out.splitlines()]
    assert [(e["actor"], e["via"], e["action"], e["dead_letter_id"]) for e in entries] == [
        ("ben", "cli", "dead_letter.discard", two),
        ("ana", "cli", "dead_letter.replay", one),
    ]


def test_a_bulk_replay_asks_before_it_acts(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preview (count, breakdown, sample) comes first; answering no republishes nothing;
    --yes --expect N runs it and reports the outcomes; --json without --yes is refused."""
    url = database_url
    ids = seed(url, "b-1", "b-2", "b-3", queue="erp.send")
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    declined = jobfence(
        capsys, "dead-letters", "replay", "--queue", "erp.send", "--database-url", url
    )
    refused = jobfence(
        capsys, "dead-letters", "replay", "--queue", "erp.send", "--json", "--database-url", url
    )
    wrong = jobfence(
        capsys,
        "dead-letters",
        "replay",
        "--queue",
        "erp.send",
        "--yes",
        "--expect",
        "5",
        "--json",
        "--database-url",
        url,
    )
    done = jobfence(
        capsys,
        "dead-letters",
        "replay",
        "--queue",
        "erp.send",
        "--since",
        "1h",
        "--yes",
        "--expect",
        "3",
        "--rate",
        "0",
        "--json",
        "--database-url",
        url,
    )
    assert (declined[0], declined[2]) == (1, "not confirmed: nothing was replayed\n")
    assert "bulk replay" in declined[1]
    assert "3 pending letters" in declined[1]
    assert refused[0] == 2
    assert "--json runs unattended: add --yes" in refused[2]
    assert wrong[0] == 1
    assert "the snapshot has 3 letters, not the 5 expected" in wrong[2]
    report = json.loads(done[1])
    assert (done[0], report["state"], report["counts"]) == (0, "done", {"published": 3})
    jobs = asyncio.run(query(url, f"SELECT job_id FROM {table(url, 'jobs')} ORDER BY job_id"))
    assert jobs == [("b-1",), ("b-2",), ("b-3",)]
    assert len(ids) == 3


def test_token_create_prints_a_token_the_api_accepts(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The token is printed once; only its hash is stored; it authenticates as created."""
    code, out, _ = jobfence(
        capsys,
        "ops",
        "token",
        "create",
        "--name",
        "carol",
        "--role",
        "operator",
        "--partner",
        "acme",
        "--expires-in",
        "30d",
        "--database-url",
        database_url,
    )
    token = out.strip()

    async def check() -> tuple[Any, list[tuple[Any, ...]]]:
        async with opened(database_url) as db:
            principal = await authenticate(db, token)
        stored = await query(
            database_url, f"SELECT token_hash FROM {table(database_url, 'ops_tokens')}"
        )
        return principal, stored

    principal, stored = asyncio.run(check())
    listed = jobfence(capsys, "ops", "token", "list", "--json", "--database-url", database_url)
    revoked = jobfence(capsys, "ops", "token", "revoke", "carol", "--database-url", database_url)
    assert code == 0
    assert token.startswith("jfo_")
    assert (principal.name, principal.role, principal.partner) == ("carol", "operator", "acme")
    assert token not in str(stored)
    assert json.loads(listed[1])["name"] == "carol"
    assert "token_hash" not in listed[1]
    assert revoked[0] == 0


def test_cleanup_once_reports_what_it_deleted(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``jobfence cleanup --once --json``: expired fences go, a fresh one stays."""
    url = database_url
    p = "%s" if url.startswith("postgresql") else "?"
    old = datetime.now(UTC) - timedelta(days=9)
    fresh = datetime.now(UTC)

    def at(moment: datetime) -> Any:
        return moment if url.startswith("postgresql") else moment.timestamp()

    async def add() -> None:
        async with opened(url) as db, db.transaction() as tx:
            for job_id, processed in (("old-1", old), ("old-2", old), ("fresh", fresh)):
                await tx.execute(
                    f"INSERT INTO {table(url, 'processed_jobs')} VALUES ({p}, {p}, {p}, {p})",
                    ("points", job_id, at(processed), at(processed + timedelta(days=7))),
                )

    asyncio.run(add())
    code, out, _ = jobfence(capsys, "cleanup", "--once", "--json", "--database-url", url)
    result = json.loads(out)
    assert (code, result["deleted"], result["batches"], result["ran"]) == (0, 2, 1, True)
    assert result["letters_expired"] == 0  # no retention set by the owner
    left = asyncio.run(query(url, f"SELECT job_id FROM {table(url, 'processed_jobs')}"))
    assert left == [("fresh",)]


def test_ids_beyond_int64_are_one_clear_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id or cursor the stores cannot hold (one past int64) is refused by the service in
    one line (exit 1), not an overflow traceback from the driver."""
    big = str(2**63)
    shown = jobfence(capsys, "dead-letters", "show", big, "--database-url", database_url)
    audited = jobfence(
        capsys, "dead-letters", "audit", "--dead-letter", big, "--database-url", database_url
    )
    assert shown == (
        1,
        "",
        f"jobfence: error: the dead letter id must be a whole number from 1 to {2**63 - 1}, "
        f"not {big}\n",
    )
    assert audited[0] == 1
    assert audited[2].startswith("jobfence: error: dead_letter_id must be a whole number")
    assert len(audited[2].splitlines()) == 1


# -- issue 12 §8: the real `jobfence` command in a subprocess -----------------------------------


def test_a_bulk_replay_keeps_its_reason(database_url: str) -> None:
    """--reason of a bulk replay is kept on the letters and in the audit log, not replaced by
    "bulk replay N"."""
    url = database_url
    ids = seed(url, "r-1", "r-2", queue="erp.send")
    why = "ERP back after the 503 storm, OPS-7"
    ran = jf(
        "dead-letters",
        "replay",
        "--queue",
        "erp.send",
        "--yes",
        "--expect",
        "2",
        "--rate",
        "0",
        "--reason",
        why,
        "--json",
        "--database-url",
        url,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["counts"] == {"published": 2}
    listed = jf("dead-letters", "list", "--status", "all", "--json", "--database-url", url)
    reasons = {x["id"]: x["review_reason"] for x in map(json.loads, listed.stdout.splitlines())}
    assert reasons == {ids[0]: why, ids[1]: why}
    audit = jf("dead-letters", "audit", "--json", "--database-url", url)
    per_letter = [
        e["reason"] for e in map(json.loads, audit.stdout.splitlines()) if e["dead_letter_id"]
    ]
    assert per_letter == [why, why]


def test_answering_no_is_exit_1_not_an_interrupt(database_url: str) -> None:
    """Declining the confirmation is not Ctrl-C: exit 1 (130 means SIGINT) with one line;
    nothing is replayed."""
    url = database_url
    seed(url, "n-1", "n-2", queue="erp.send")
    declined = jf(
        "dead-letters", "replay", "--queue", "erp.send", "--database-url", url, input="n\n"
    )
    assert declined.returncode == 1, declined.stderr
    assert declined.stderr == "not confirmed: nothing was replayed\n"
    jobs = asyncio.run(query(url, f"SELECT job_id FROM {table(url, 'jobs')}"))
    assert jobs == []


def test_list_shows_the_replay_chain(database_url: str) -> None:
    """The table has the runbook's "replay of" column (``previous_id``), as --json has."""
    url = database_url
    [first] = seed(url, "c-1")
    replayed = jf("dead-letters", "replay", str(first), "--database-url", url)
    assert replayed.returncode == 0, replayed.stderr
    [again] = seed(url, "c-1")  # the replayed job failed again
    table_out = jf(
        "dead-letters", "list", "--status", "all", "--database-url", url, env={"COLUMNS": "250"}
    )
    assert table_out.returncode == 0, table_out.stderr
    header = next(line for line in table_out.stdout.splitlines() if "job_id" in line)
    assert [c.strip() for c in header.strip("┃").split("┃")][-1] == "replay of"
    rows = {
        cells[0]: cells[-1]
        for line in table_out.stdout.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    assert rows == {str(again): str(first), str(first): "-"}
    as_json = jf("dead-letters", "list", "--status", "all", "--json", "--database-url", url)
    listed = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(x["id"], x["previous_id"]) for x in listed] == [(again, first), (first, None)]


def test_list_json_leaves_history_to_show(database_url: str) -> None:
    """`list --json` has no "history" key (a list leaves the attempts to `show`) rather than
    an empty list for a letter that has attempts; `show --json` has them."""
    url = database_url
    [letter] = seed(url, "h-1")
    as_json = jf("dead-letters", "list", "--json", "--database-url", url)
    [listed] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert listed["id"] == letter
    assert "history" not in listed
    shown = jf("dead-letters", "show", str(letter), "--json", "--database-url", url)
    assert [a["attempt"] for a in json.loads(shown.stdout)["history"]] == [6]


def test_list_takes_the_letter_filter_replay_and_discard_take(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dead-letters list` filters by --consumer, --error, --job-id and --since/--until as
    `replay`, `discard-matching`, the ops API and the console do (issue 23): one set of
    options, one filter; a bad criterion is one line."""
    url = database_url
    ids = {
        job: seed(url, job, consumer=consumer, error=error)[0]
        for job, consumer, error in [
            ("f-erp", "ledger", "TemporaryError: ERP answered 503"),
            ("f-mail", "mailer", "SMTPError: mailbox full"),
            ("f-old", "ledger", "TemporaryError: ERP answered 502"),
        ]
    }
    back = datetime.now(UTC) - timedelta(days=3)
    asyncio.run(
        query(
            url,
            f"UPDATE {table(url, 'dead_letters')} SET failed_at = {{p}} WHERE id = {{p}}",
            (back if dialect(url) == "postgresql" else back.timestamp(), ids["f-old"]),
        )
    )

    def listed(*criteria: str) -> list[str]:
        code, out, err = jobfence(
            capsys, "dead-letters", "list", "--json", "--database-url", url, *criteria
        )
        assert code == 0, err
        return sorted(json.loads(line)["job_id"] for line in out.splitlines())

    assert listed() == ["f-erp", "f-mail", "f-old"]
    assert listed("--consumer", "mailer") == ["f-mail"]
    assert listed("--error", "erp answered") == ["f-erp", "f-old"]
    assert listed("--job-id", "f-old") == ["f-old"]
    assert listed("--since", "1d") == ["f-erp", "f-mail"]
    assert listed("--until", "1d", "--consumer", "ledger") == ["f-old"]
    assert listed("--error", "503", "--since", "1d") == ["f-erp"]
    code, out, err = jobfence(
        capsys, "dead-letters", "list", "--since", "1d", "--until", "2d", "--database-url", url
    )
    assert (code, out, err) == (1, "", "jobfence: error: since must be before until\n")

    wanted = {"--queue", "--consumer", "--category", "--error", "--job-id", "--since", "--until"}
    for command in (list_dead_letters, replay, discard_matching):
        assert {o for p in command.params for o in p.opts} >= wanted, command.name
