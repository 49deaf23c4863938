"""Where alerts go: :class:`Alert` as a sink sends it, the :class:`AlertSink` port,
:class:`BetterStack` (Uptime incidents), :class:`Webhook` (a JSON POST), and
:func:`sinks_from_env`."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .events import redact

if TYPE_CHECKING:
    import httpx

ENV_BETTERSTACK_TOKEN = "JOBFENCE_BETTERSTACK_TOKEN"
ENV_BETTERSTACK_URL = "JOBFENCE_BETTERSTACK_URL"
ENV_BETTERSTACK_EMAIL = "JOBFENCE_BETTERSTACK_EMAIL"
ENV_WEBHOOK_URL = "JOBFENCE_ALERT_WEBHOOK_URL"
ENV_WEBHOOK_TOKEN = "JOBFENCE_ALERT_WEBHOOK_TOKEN"


# -- alerts and sinks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One alert as a sink sends it."""

    id: int
    kind: str  # "first" or "summary"
    source: str
    queue: str
    category: str
    fingerprint: str
    title: str
    details: dict[str, str]
    count: int
    window_start: datetime
    window_end: datetime

    @property
    def name(self) -> str:
        if self.kind == "summary":
            return f"{self.count} more like this: {self.title}"
        return self.title

    @property
    def summary(self) -> str:
        when = f"{self.window_start:%H:%M:%S}–{self.window_end:%H:%M:%S} UTC"
        if self.kind == "summary":
            return (
                f"{self.count} more {self.category} failures in {self.queue} with the same "
                f"error between {when} (after the alert sent for the first one)"
            )
        return (
            f"{self.category} in {self.queue}; identical failures until "
            f"{self.window_end:%H:%M:%S} UTC will be summed up in one follow-up"
        )

    @property
    def description(self) -> str:
        lines = [self.summary, ""]
        lines += [f"{key}: {value}" for key, value in self.details.items()]
        lines += [f"fingerprint: {self.fingerprint}", f"alert: #{self.id} ({self.kind})"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "source": self.source,
            "queue": self.queue,
            "category": self.category,
            "fingerprint": self.fingerprint,
            "name": self.name,
            "summary": self.summary,
            "count": self.count,
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "details": self.details,
        }


class DeliveryFailed(Exception):
    """A sink did not accept an alert (retried later)."""


class AlertSink(ABC):
    """Where alerts go. ``key`` names it in ``core.alert_deliveries`` (keep it stable)."""

    key: str

    @abstractmethod
    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        """Deliver or raise (any exception means "try again later")."""


def _check(response: httpx.Response, expected: Sequence[int]) -> None:
    if response.status_code not in expected:
        raise DeliveryFailed(f"HTTP {response.status_code}: {redact(response.text, 200)}")


@dataclass(frozen=True)
class BetterStack(AlertSink):
    """BetterStack Uptime: each alert opens an incident (and pages on-call per your policy).

    ``POST {base_url}/api/v3/incidents`` with ``Authorization: Bearer <Uptime API token>``
    (Better Stack → Uptime → API tokens) and a JSON body with ``requester_email``, ``name``,
    ``summary``, ``description``, the ``call``/``sms``/``email``/``push`` switches and,
    optionally, ``team_wait``, ``policy_id`` and ``team_name``. Success is HTTP 201.
    """

    token: str = field(repr=False)
    requester_email: str | None = None
    base_url: str = "https://uptime.betterstack.com"
    call: bool = False
    sms: bool = False
    email: bool = True
    push: bool = True
    team_wait: int | None = None
    policy_id: str | None = None
    team_name: str | None = None
    key: str = "betterstack"

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ConfigurationError("the BetterStack sink needs an Uptime API token")
        if not self.base_url.startswith(("https://", "http://")):
            raise ConfigurationError(
                f"BetterStack base_url must be http(s)://…, got {self.base_url!r}"
            )

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/api/v3/incidents"

    def body(self, alert: Alert) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": alert.name[:255],
            "summary": alert.summary,
            "description": alert.description,
            "call": self.call,
            "sms": self.sms,
            "email": self.email,
            "push": self.push,
        }
        optional = {
            "requester_email": self.requester_email,
            "team_wait": self.team_wait,
            "policy_id": self.policy_id,
            "team_name": self.team_name,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body

    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        response = await client.post(
            self.url, json=self.body(alert), headers={"Authorization": f"Bearer {self.token}"}
        )
        _check(response, (201,))


@dataclass(frozen=True)
class Webhook(AlertSink):
    """A JSON POST of :meth:`Alert.to_json` to ``url`` (any 2xx is success), with
    ``Authorization: Bearer <token>`` when a token is set."""

    url: str
    token: str | None = field(default=None, repr=False)
    key: str = "webhook"

    def __post_init__(self) -> None:
        if not self.url.startswith(("https://", "http://")):
            raise ConfigurationError(f"the webhook URL must be http(s)://…, got {self.url!r}")

    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = await client.post(self.url, json=alert.to_json(), headers=headers)
        _check(response, range(200, 300))


def sinks_from_env(env: Mapping[str, str] | None = None) -> list[AlertSink]:
    """Sinks configured by environment variables:

    - ``JOBFENCE_BETTERSTACK_TOKEN`` (Uptime API token) turns BetterStack on;
      ``JOBFENCE_BETTERSTACK_EMAIL`` sets ``requester_email``; ``JOBFENCE_BETTERSTACK_URL``
      overrides the base URL (default ``https://uptime.betterstack.com``).
    - ``JOBFENCE_ALERT_WEBHOOK_URL`` turns the webhook on; ``JOBFENCE_ALERT_WEBHOOK_TOKEN``
      adds a bearer token.
    """
    env = os.environ if env is None else env
    sinks: list[AlertSink] = []
    token = env.get(ENV_BETTERSTACK_TOKEN, "").strip()
    if token:
        sinks.append(
            BetterStack(
                token=token,
                requester_email=env.get(ENV_BETTERSTACK_EMAIL) or None,
                base_url=env.get(ENV_BETTERSTACK_URL) or "https://uptime.betterstack.com",
            )
        )
    url = env.get(ENV_WEBHOOK_URL, "").strip()
    if url:
        sinks.append(Webhook(url=url, token=env.get(ENV_WEBHOOK_TOKEN) or None))
    return sinks
