"""Fixtures for adapter-specific tests: a target per broker (see tests/contract/support)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.contract.support import BROKERS, Target, cleanup, make_target, sweep_rabbitmq_session


@pytest.fixture(scope="session", autouse=True)
def _sweep_rabbitmq() -> Iterator[None]:
    yield
    sweep_rabbitmq_session()


def _target(kind: str, request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(kind, request)
    yield made
    asyncio.run(cleanup(made))


@pytest.fixture
def rabbitmq(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target("rabbitmq", request)


@pytest.fixture
def nats(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target("nats", request)


@pytest.fixture
def redis(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target("redis", request)


@pytest.fixture
def pubsub(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target("pubsub", request)


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target(str(request.param), request)
