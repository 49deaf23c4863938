"""The call ledger's fault suite (issue 25): real worker processes killed with SIGKILL at every
point of a call, a downstream that does not deduplicate and counts every effect, injected
timeouts, resets and 5xx — on PostgreSQL and SQLite (database queue), RabbitMQ and Pub/Sub
(emulator), with group commit on (the default).

- With ``reconcile``: exactly one downstream effect per job, and every job done (none lost).
- Without it (and not repeatable): no job's request is applied twice, and every job is either
  done or parked as a dead letter (``UNKNOWN_OUTCOME``) whose call is listed in doubt.

The default run has :data:`DEFAULT_JOBS` jobs per case; the ``slow`` run 1 000.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobfence.calls import UNKNOWN_OUTCOME, default_key

from ..contract.support import (
    REPO,
    Target,
    cleanup,
    make_target,
    remaining,
    sweep_rabbitmq_session,
    with_option,
)
from ..helpers import eventually, query, table
from .apps import STEP
from .test_ledger import ledger_of

DEFAULT_JOBS = 100
SLOW_JOBS = 1000
WORKERS = 2
KILLS = ("before", "in_send", "in_flight", "after")
FAULTS = ("timeout", "reset", "reset_before", "500", "503")
#: each kind of kill, and each fault, happens to this share of the jobs (at least 2 jobs each)
KILL_SHARE = 0.02
FAULT_SHARE = 0.04
#: Pub/Sub redelivers a lost message at once (no retry policy), and never moves one to its
#: dead-letter topic
FAST_PUBSUB = {"min_backoff": 0, "max_backoff": 0, "max_delivery_attempts": 100}


@pytest.fixture(scope="module", autouse=True)
def _sweep_rabbitmq() -> Iterator[None]:
    yield
    sweep_rabbitmq_session()


# Pub/Sub: FAST_PUBSUB declares no retry policy. With one, the emulator's backoff stops
# redelivering on a subscription once a pulled batch runs out of deadline on a redelivery,
# and jobs held by a worker killed with kill -9 were never delivered again (docs/transports.md)
@pytest.fixture(params=["postgresql", "sqlite", "rabbitmq", "pubsub"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[str]:
    """The downstream, in a process of its own; its base URL."""
    portfile = tmp_path / "stub.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.calls.stub", str(portfile)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stub.log").open("ab"),
    )
    try:
        deadline = time.monotonic() + 60
        while not portfile.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the stub did not start: {(tmp_path / 'stub.log').read_text()}"
                )
            time.sleep(0.02)
        yield f"http://127.0.0.1:{portfile.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def plans(n: int, seed: int) -> list[dict[str, str]]:
    """What goes wrong for each of ``n`` jobs: every kill and fault for a share of them,
    spread through the queue."""
    kills = max(2, round(n * KILL_SHARE))
    faults = max(2, round(n * FAULT_SHARE))
    planned: list[dict[str, str]] = []
    for kill in KILLS:
        planned += [{"kill": kill}] * kills
    for fault in FAULTS:
        planned += [{"fault": fault}] * faults
    planned += [{}] * (n - len(planned))
    random.Random(seed).shuffle(planned)
    return planned


class Workers:
    """Worker processes of tests/calls/apps.py, restarted when they die; ``kill_one`` kills
    one at random with SIGKILL (at whatever point it is)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = (self.logs / f"worker-{self.started}.log").open("ab")
        try:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "jobfence.cli", "worker", "tests.calls.apps:app",
                    "--concurrency", "4", "--log-level", "WARNING",
                ],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def revive(self) -> int:
        """Start a worker for each that died; how many died."""
        dead = [p for p in self.procs if p.poll() is not None]
        for proc in dead:
            self.procs.remove(proc)
            self.start()
        return len(dead)

    def kill_one(self, rng: random.Random) -> None:
        alive = [p for p in self.procs if p.poll() is None]
        if alive:
            with contextlib.suppress(ProcessLookupError):
                rng.choice(alive).send_signal(signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def done_jobs(url: str) -> set[str]:
    rows = await query(url, "SELECT job_id FROM effects")
    return {str(r[0]) for r in rows}


async def parked_jobs(url: str) -> dict[str, str]:
    rows = await query(
        url,
        f"SELECT job_id, error_code, last_error FROM {table(url, 'dead_letters')}",
    )
    return {str(r[0]): f"{r[1]}: {r[2]}" for r in rows}


async def run_faults(target: Target, stub: str, tmp_path: Path, n: int, reconcile: bool) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    seed = int.from_bytes(os.urandom(4), "big")
    planned = plans(n, seed)
    transport = target.transport_url
    if target.kind == "pubsub":
        # the subscription's redelivery backoff (10 s up to 10 min by default) would hold a
        # job whose worker was killed twice for minutes; and no Pub/Sub dead-lettering
        for option, value in FAST_PUBSUB.items():
            transport = with_option(transport or "", option, value)
    app = target.app(lease=2.0, transport_url=transport)
    async with app:
        jobs = [app.job(target.queue, plan, job_id=f"job-{i}") for i, plan in enumerate(planned)]
        await app.enqueue_many(jobs)
    workers = Workers(
        {
            "JF_DB": target.database_url,
            "JF_TRANSPORT": transport or "",
            "JF_QUEUE": target.queue,
            "JF_LEASE": "2",
            "JF_STUB": stub,
            "JF_RECONCILE": "1" if reconcile else "0",
            "JF_MARKS": str(marks),
        },
        tmp_path,
    )
    rng = random.Random(seed)
    began = time.monotonic()
    external = 0
    next_kill = began + rng.uniform(1.0, 3.0)
    for _ in range(WORKERS):
        workers.start()
    try:

        async def settled() -> bool:
            workers.revive()
            nonlocal external, next_kill
            # besides the planned kills, kill a worker at a random moment now and then
            if external < 3 + n // 200 and time.monotonic() > next_kill:
                workers.kill_one(rng)
                external += 1
                next_kill = time.monotonic() + rng.uniform(1.0, 4.0)
            finished = await done_jobs(target.database_url)
            parked = await parked_jobs(target.database_url)
            return len(finished | set(parked)) >= n

        # well inside pytest's own timeout, so that a run that never settles fails here,
        # saying which jobs are missing, and its workers and databases are cleaned up
        await eventually(settled, timeout=120 + n * 0.6, interval=0.1, what=f"{n} jobs settled")
    except AssertionError as exc:
        finished = await done_jobs(target.database_url)
        parked = await parked_jobs(target.database_url)
        rows = await query(
            ledger_of(target.database_url),
            f"SELECT job_id, state FROM {table(target.database_url, 'calls')}",
        )
        states = {str(r[0]): str(r[1]) for r in rows}
        missing = {
            job: states.get(job, "no call")
            for job in (f"job-{i}" for i in range(n))
            if job not in finished and job not in parked
        }
        raise AssertionError(
            f"{exc}: not done nor parked, with their calls' states: {missing} (seed {seed}, "
            f"{workers.started} workers started)"
        ) from None
    finally:
        workers.stop()
    took = time.monotonic() - began

    async with httpx.AsyncClient() as client:
        seen = (await client.get(f"{stub}/effects")).json()
    effects: dict[str, int] = seen["effects"]
    finished = await done_jobs(target.database_url)
    parked = await parked_jobs(target.database_url)
    keys = {f"job-{i}": default_key(f"job-{i}", STEP) for i in range(n)}
    rows = await query(
        ledger_of(target.database_url),
        f"SELECT job_id, state FROM {table(target.database_url, 'calls')}",
    )
    states = {str(r[0]): str(r[1]) for r in rows}
    kills = {k: sum(1 for m in os.listdir(marks) if m.endswith(f".{k}")) for k in KILLS}
    print(
        f"\n{target.kind} reconcile={reconcile}: {n} jobs in {took:.1f}s, "
        f"{len(finished)} done, {len(parked)} parked, planned kills {kills}, "
        f"{external} random kills, {workers.started} workers started, "
        f"faults {seen['faults']}, seed {seed}"
    )

    # nothing applied twice downstream, ever
    twice = {key: count for key, count in effects.items() if count > 1}
    assert twice == {}
    # every planned kill happened (the in-flight one is counted by its marker, set before)
    assert all(count > 0 for count in kills.values()), kills
    assert not (finished & set(parked)), "a job both done and parked"
    if reconcile:
        # exactly one effect per job, every job done, nothing parked or lost
        assert parked == {}
        assert finished == set(keys)
        assert {job: effects.get(key, 0) for job, key in keys.items()} == dict.fromkeys(keys, 1)
        assert set(states.values()) == {"succeeded"}
    else:
        # done: applied once; parked: its call is listed in doubt, with its key, never resent
        for job in finished:
            assert effects.get(keys[job]) == 1, job
            assert states[job] == "succeeded", job
        for job, why in parked.items():
            assert why.startswith(UNKNOWN_OUTCOME), (job, why)
            assert keys[job] in why, (job, why)
            assert states[job] == "in_doubt", job
        assert finished | set(parked) == set(keys)
        assert parked, "no call was in doubt: the faults did not bite"
    assert await remaining(target, transport) == 0


@pytest.mark.parametrize("reconcile", [True, False], ids=["reconcile", "no_reconcile"])
async def test_faults(target: Target, stub: str, tmp_path: Path, reconcile: bool) -> None:
    await run_faults(target, stub, tmp_path, DEFAULT_JOBS, reconcile)


@pytest.mark.proof  # 1 000 jobs: ~4–5 min a run; `pytest -m proof tests/calls`
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("reconcile", [True, False], ids=["reconcile", "no_reconcile"])
async def test_faults_1000_jobs(target: Target, stub: str, tmp_path: Path, reconcile: bool) -> None:
    await run_faults(target, stub, tmp_path, SLOW_JOBS, reconcile)


def test_the_plans_cover_every_kill_and_fault() -> None:
    planned = plans(DEFAULT_JOBS, 1)
    assert len(planned) == DEFAULT_JOBS
    kinds = {p.get("kill") or p.get("fault") for p in planned}
    assert kinds == {*KILLS, *FAULTS, None}
    assert json.dumps(planned)  # payloads are JSON
