"""Fixtures of the contract suite: one ``target`` per transport, on the real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from .support import (
    KINDS,
    Target,
    broker_url,
    cleanup,
    create_effects_table,
    new_queue,
    sweep_rabbitmq_session,
)


@pytest.fixture(scope="session", autouse=True)
def _sweep_rabbitmq() -> Iterator[None]:
    yield
    sweep_rabbitmq_session()


def make_target(kind: str, request: pytest.FixtureRequest) -> Target:
    queue, token = new_queue()
    if kind == "sqlite":
        database = str(request.getfixturevalue("sqlite_database"))
        transport = None
    else:
        database = str(request.getfixturevalue("pg_database"))
        transport = None if kind == "postgresql" else broker_url(kind, token)
    create_effects_table(database)
    return Target(kind, database, transport, queue, token)


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The transport under test (each test runs once per transport)."""
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))
