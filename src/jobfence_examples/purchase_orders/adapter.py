"""The ERP adapter: one purchase order to the ERP, with in-process retry (SPEC R5).

Every outcome becomes either an :class:`ErpOrder` or a jobfence
:class:`~jobfence.HandlerError` of the right taxonomy category (SPEC R4), so the
harness knows whether to retry at the broker level or to dead-letter:

=========================================  ==========================  ======================
ERP answer                                 category                    in-process retry
=========================================  ==========================  ======================
201 created / 200 already there            (success)                   —
timeout, connection error, 429, 5xx        TEMPORARY_ERROR             yes (R5), then broker
401                                        refresh the token, call again once; then
                                           AUTHENTICATION_ERROR        (one broker retry)
403                                        AUTHORIZATION_ERROR         no
400 / 422 (functional: the ERP said no)    INTEGRATION_ERROR           no
409 (business rule)                        BUSINESS_ERROR              no
anything else                              TECHNICAL_ERROR             no (limited broker)
=========================================  ==========================  ======================

R5 (seed 004 §10.3, Resilience4j): 3 attempts, 2 s initial interval, ×2, at most 30 s. The
timings are injectable (:class:`CallRetry`) so tests run in milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx

from jobfence import (
    AuthenticationError,
    AuthorizationError,
    BusinessError,
    ConfigurationError,
    HandlerError,
    IntegrationError,
    TechnicalError,
    TemporaryError,
)

# under "jobfence", so `jobfence demo purchase-orders --log-level` governs it as before
log = logging.getLogger("jobfence.purchase_orders.erp")

ORDERS_PATH = "/fscmRestApi/resources/latest/purchaseOrders"
TOKEN_PATH = "/oauth2/v1/token"


@dataclass(frozen=True)
class CallRetry:
    """In-process retry of one ERP call (R5), distinct from broker-level redelivery."""

    attempts: int = 3
    initial: timedelta = timedelta(seconds=2)
    multiplier: float = 2.0
    max_interval: timedelta = timedelta(seconds=30)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("CallRetry.attempts must be at least 1")
        if self.initial < timedelta(0) or self.multiplier < 1:
            raise ConfigurationError("CallRetry needs initial >= 0 and multiplier >= 1")

    def interval(self, failed_attempt: int) -> float:
        """Seconds to wait after failed attempt ``failed_attempt`` (1-based)."""
        seconds = self.initial.total_seconds() * self.multiplier ** (failed_attempt - 1)
        return min(seconds, self.max_interval.total_seconds())


@dataclass(frozen=True)
class ErpSettings:
    base_url: str
    client_id: str = "jobfence-po"
    client_secret: str = "stand-in-secret"
    timeout: float = 10.0  # seconds per HTTP call
    retry: CallRetry = CallRetry()


@dataclass(frozen=True)
class ErpOrder:
    order_id: str
    created: bool  # False: the ERP already had an order for this request (its de-duplication)


@dataclass
class ErpCallStats:
    calls: int = 0
    retries: int = 0
    token_refreshes: int = 0


class ErpClient:
    """A small client for the ERP's token and purchase-order endpoints."""

    def __init__(
        self,
        settings: ErpSettings,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self._client: httpx.AsyncClient | None = None
        self._token: str | None = None
        self._token_lock = asyncio.Lock()
        self.stats = ErpCallStats()

    async def open(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.settings.base_url,
                timeout=self.settings.timeout,
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=50),
            )

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("ErpClient is not open")
        return self._client

    async def _get_token(self, stale: str | None) -> str:
        async with self._token_lock:
            if self._token is not None and self._token != stale:
                return self._token  # someone refreshed it meanwhile
            try:
                response = await self.client.post(
                    TOKEN_PATH,
                    data={"grant_type": "client_credentials"},
                    auth=(self.settings.client_id, self.settings.client_secret),
                )
            except httpx.TimeoutException as exc:
                raise TemporaryError(
                    f"ERP token endpoint timed out: {exc}", code="ERP_TIMEOUT"
                ) from None
            except httpx.TransportError as exc:
                raise TemporaryError(
                    f"ERP token endpoint unreachable: {exc}", code="ERP_UNREACHABLE"
                ) from None
            if response.status_code in (401, 403):
                raise AuthenticationError(
                    f"the ERP refused our client credentials ({response.status_code})",
                    code="ERP_BAD_CREDENTIALS",
                )
            if response.status_code >= 500 or response.status_code == 429:
                raise TemporaryError(
                    f"ERP token endpoint answered {response.status_code}",
                    code=f"ERP_HTTP_{response.status_code}",
                )
            if response.status_code != 200:
                raise TechnicalError(
                    f"ERP token endpoint answered {response.status_code}",
                    code=f"ERP_TOKEN_HTTP_{response.status_code}",
                )
            if stale is not None:
                self.stats.token_refreshes += 1
            self._token = str(response.json()["access_token"])
            return self._token

    async def create_purchase_order(self, request_id: str, document: dict[str, Any]) -> ErpOrder:
        """Create the order for ``request_id`` (the ERP de-duplicates on it); R5 retries."""
        retry = self.settings.retry
        body = {"requestId": request_id, **document}
        attempt = 1
        refreshed = False
        while True:
            self.stats.calls += 1
            try:
                token = self._token or await self._get_token(None)
                response = await self.client.post(
                    ORDERS_PATH, json=body, headers={"Authorization": f"Bearer {token}"}
                )
            except TemporaryError as exc:  # the token endpoint, transiently
                error: HandlerError = exc
            except httpx.TimeoutException as exc:
                error = TemporaryError(
                    f"ERP did not answer within {self.settings.timeout:g}s ({type(exc).__name__})",
                    code="ERP_TIMEOUT",
                )
            except httpx.TransportError as exc:
                error = TemporaryError(f"ERP unreachable: {exc}", code="ERP_UNREACHABLE")
            else:
                if response.status_code in (200, 201):
                    data = response.json()
                    return ErpOrder(str(data["OrderNumber"]), response.status_code == 201)
                if response.status_code == 401 and not refreshed:
                    refreshed = True
                    await self._get_token(token)
                    continue  # one refresh, not an attempt
                error = _map_error(response)
            if not isinstance(error, TemporaryError) or attempt >= retry.attempts:
                raise error
            delay = retry.interval(attempt)
            log.info(
                "ERP call failed; retrying in-process",
                extra={"request_id": request_id, "attempt": attempt, "retry_in_s": delay},
            )
            self.stats.retries += 1
            attempt += 1
            await self._sleep(delay)


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        return str(data.get("detail") or data.get("title") or data)[:300]
    return str(data)[:300]


def _map_error(response: httpx.Response) -> HandlerError:
    status = response.status_code
    detail = _detail(response)
    code = f"ERP_HTTP_{status}"
    if status == 401:
        return AuthenticationError(
            f"the ERP refused a freshly refreshed token (401): {detail}", code="ERP_UNAUTHORIZED"
        )
    if status == 403:
        return AuthorizationError(f"the ERP forbids this operation (403): {detail}", code=code)
    if status in (400, 422):
        return IntegrationError(f"the ERP rejected the order ({status}): {detail}", code=code)
    if status == 409:
        return BusinessError(f"the ERP refused the order ({status}): {detail}", code=code)
    if status == 429 or status >= 500:
        return TemporaryError(f"the ERP answered {status}: {detail}", code=code)
    return TechnicalError(f"unexpected ERP answer {status}: {detail}", code=code)
