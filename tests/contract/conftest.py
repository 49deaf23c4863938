"""Fixtures of the contract suite: one ``target`` per transport, on the real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from .support import (
    KINDS,
    Target,
    cleanup,
    make_target,
    sweep_rabbitmq_session,
)


@pytest.fixture(scope="session", autouse=True)
def _sweep_rabbitmq() -> Iterator[None]:
    yield
    sweep_rabbitmq_session()


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The transport under test (each test runs once per transport)."""
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))
