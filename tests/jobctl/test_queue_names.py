"""Issue 28, point 5: every legal queue name through every door, on both stores.

Queue names may hold any character but NUL: ``/``, ``%``, spaces, unicode. The ops API takes
the name as the path's rest (``/v1/queues/{queue:path}/pause``), percent-encoded or not; the
CLI as an argument; the console's forms and links URL-encode it (tests/ui/test_queue_names.py).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import pytest

from jobfence import App

from ..deadletters.conftest import OpsServer, ops
from ..deadletters.test_cli import jobfence
from ..helpers import query, table

__all__ = ["ops"]  # the fixture

NAMES = ["erp/send", "100% sure", "a b/c%2Fd", "über/队列", "x/pause"]


async def paused(url: str) -> list[str]:
    rows = await query(url, f"SELECT queue FROM {table(url, 'queue_pauses')} ORDER BY queue")
    return [r[0] for r in rows]


async def test_the_api_pauses_and_resumes_any_queue_name(ops: OpsServer) -> None:
    url = ops.database_url
    async with App(url) as jf:
        for name in NAMES:
            await jf.enqueue(name, {}, job_id=f"job-{NAMES.index(name)}")
    answers: dict[str, tuple[int, int, str | None, str | None]] = {}
    async with ops.client(ops.tokens.operator) as otto:
        for name in NAMES:
            encoded = quote(name, safe="")
            pause = await otto.post(f"/v1/queues/{encoded}/pause", json={"reason": "r"})
            # '/' left as it is (what a hand-written URL often does) names the same queue
            resume = await otto.post(f"/v1/queues/{quote(name, safe='/')}/resume")
            answers[name] = (
                pause.status_code,
                resume.status_code,
                pause.json().get("queue"),
                resume.json().get("queue"),
            )
        again = await otto.post(f"/v1/queues/{quote('erp/send', safe='')}/pause")
        listed = (await otto.get("/v1/queues")).json()
        jobs = (await otto.get("/v1/jobs", params={"queue": "über/队列"})).json()
    assert answers == {name: (200, 200, name, name) for name in answers}, answers
    assert again.status_code == 200, again.text
    assert await paused(url) == ["erp/send"]
    assert sorted(q["queue"] for q in listed["queues"]) == sorted(NAMES)
    assert [j["job_id"] for j in jobs["items"]] == [f"job-{NAMES.index('über/队列')}"]


def test_the_cli_pauses_and_resumes_any_queue_name(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = database_url
    asyncio.run(App(url).migrate())
    for name in NAMES:
        code, out, err = jobfence(
            capsys, "queues", "pause", name, "--database-url", url, "--reason", "r"
        )
        assert code == 0, err
    assert asyncio.run(paused(url)) == sorted(NAMES)
    code, out, err = jobfence(capsys, "queues", "list", "--database-url", url, "--json")
    assert code == 0, err
    listed = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sorted(q["queue"] for q in listed if q.get("paused")) == sorted(NAMES), listed
    for name in NAMES:
        code, out, err = jobfence(capsys, "queues", "resume", name, "--database-url", url)
        assert code == 0, err
    assert asyncio.run(paused(url)) == []


async def test_queue_names_are_partner_scoped_when_read(ops: OpsServer) -> None:
    """Issue 28, point 7: a partner-scoped token lists only the queues where its partner has
    jobs or letters (with their pause); an unscoped token lists every queue (as the CLI,
    which is never scoped, does: tests/jobctl/test_cli.py)."""
    url = ops.database_url
    ops.app.consumer("served.only")(_noop)  # a queue of the app nobody has used yet
    async with App(url) as jf:
        await jf.enqueue("acme.orders", {"partner_id": "acme"}, job_id="a-1")
        await jf.enqueue("globex.orders", {"partner_id": "globex"}, job_id="g-1")
        await jf.enqueue("shared", {"partner_id": "globex"}, job_id="g-2")
        await jf.enqueue("shared", {"partner_id": "acme"}, job_id="a-2")
    async with ops.client(ops.tokens.operator) as otto:
        for queue in ("shared", "globex.orders", "nobody"):
            paused_now = await otto.post(f"/v1/queues/{queue}/pause", json={"reason": "r"})
            assert paused_now.status_code == 200, paused_now.text
        everything = (await otto.get("/v1/queues")).json()["queues"]
    async with ops.client(ops.tokens.partner_a) as acme:
        scoped = (await acme.get("/v1/queues")).json()["queues"]
    assert [q["queue"] for q in everything] == [
        "acme.orders",
        "globex.orders",
        "nobody",
        "served.only",
        "shared",
    ]
    assert [(q["queue"], q["waiting"], q["paused"]) for q in scoped] == [
        ("acme.orders", 1, False),
        ("shared", 1, True),
    ]


async def _noop(job: object, tx: object) -> None:
    return None
