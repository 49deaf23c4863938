"""Issue 13: examples/sqlalchemy_app run as a user runs it — the shop's tables, ``jobfence
migrate``, the API under uvicorn and ``jobfence relay --with-worker`` as real processes; two
POSTs with one idempotency key and one with another make two orders, two outbox events and
two shipments, each exactly once."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..helpers import REPO, eventually, scalar, table, wait_until
from .orm_app import engine_url

EXAMPLE = REPO / "examples" / "sqlalchemy_app"


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database as a new project has it: jobfence's tables not there yet."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("empty_pg_database"))
    return f"sqlite:///{tmp_path / 'shop.db'}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Project:
    def __init__(self, folder: Path, store: str) -> None:
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
        self.env["PATH"] = f"{Path(sys.executable).parent}:{self.env.get('PATH', '')}"
        self.env["SHOP_DATABASE_URL"] = engine_url(store)
        self.env["PYTHONPATH"] = str(folder)
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str) -> str:
        done = subprocess.run(
            args, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, name: str, *args: str) -> None:
        log = (self.folder / f"{name}.log").open("ab")
        self.background.append(
            subprocess.Popen(
                args, cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        )

    def stop(self) -> list[int]:
        codes = []
        for proc in self.background:
            proc.send_signal(signal.SIGTERM)
        for proc in self.background:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        self.background = []
        return codes


@pytest.fixture
def project(tmp_path: Path, store: str) -> Iterator[Project]:
    folder = tmp_path / "shop"
    folder.mkdir()
    shutil.copy(EXAMPLE / "shop.py", folder / "shop.py")
    person = Project(folder, store)
    yield person
    person.stop()


README = (EXAMPLE / "README.md").read_text(encoding="utf-8")


async def test_the_example_shop_runs_as_documented(project: Project, store: str) -> None:
    # the commands below are the README's (the port aside)
    for command in (
        "python shop.py",
        "jobfence migrate --app shop:jobs",
        "uvicorn shop:api --port",
        "jobfence relay shop:jobs --with-worker",
        "-H 'Idempotency-Key: ",
    ):
        assert command in README, command
    assert "tables created" in project.run(sys.executable, "shop.py")
    assert "applied migrations" in project.run("jobfence", "migrate", "--app", "shop:jobs")
    port = free_port()
    project.start("api", "uvicorn", "shop:api", "--port", str(port))
    project.start("relay", "jobfence", "relay", "shop:jobs", "--with-worker")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/docs", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, what="the API", timeout=60)
    order = {"sku": "book", "quantity": 2}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        first = await client.post("/orders", json=order, headers={"Idempotency-Key": "k-1"})
        again = await client.post("/orders", json=order, headers={"Idempotency-Key": "k-1"})
        other = await client.post("/orders", json=order, headers={"Idempotency-Key": "k-2"})
        missing = await client.post("/orders", json=order)
    assert first.status_code == 201, first.text
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers.get("idempotent-replayed") == "true"
    assert other.status_code == 201
    assert other.json()["id"] != first.json()["id"]
    assert missing.status_code == 400

    async def shipped() -> bool:
        return bool(await scalar(store, "SELECT count(*) FROM shipments") == 2)

    await eventually(shipped, timeout=60, what="two shipments")
    api, relay = project.stop()
    assert api in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
    assert relay == 0
    assert await scalar(store, "SELECT count(*) FROM orders") == 2
    assert await scalar(store, "SELECT sum(quantity) FROM shipments") == 4
    assert await scalar(store, f"SELECT count(*) FROM {table(store, 'outbox')}") == 2
    assert await scalar(store, f"SELECT count(*) FROM {table(store, 'processed_jobs')}") == 2
