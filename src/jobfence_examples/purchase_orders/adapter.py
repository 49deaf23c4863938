"""The ERP adapter: one purchase order to the ERP as a recorded step of its job (SPEC E1–E3),
every ERP answer mapped onto the taxonomy (SPEC R4, seed 004 §10.4).

The service's consumer sends an order with ``job.call`` (:mod:`jobfence.calls`)::

    await job.call("erp.create", send, reconcile=find, key=request_id, retry=…, refresh=…)

so the intent is committed before the request leaves and the answer after it; a redelivery
gets the recorded order without calling. The key is the request's id (seed 004 E7: an
operator's reprocessing, with a new event id, keeps the ERP key of the original request), sent
as ``requestId``. When nobody can know whether the ERP created the order (a timeout after
the request left, a reset, a 5xx), ``find`` (:meth:`ErpClient.find_order`) looks it up by
that key: found, the order is recorded and the job goes on; not found, it is sent again with
the same key. An ERP that does not de-duplicate therefore still gets one order per request.

=========================================  =========================================  ==========
ERP answer to the create                   the step (:mod:`jobfence.calls.outcomes`)  category
=========================================  =========================================  ==========
201 created / 200 already there            recorded: ``{"reference", "created"}``     (success)
timeout, reset after sending, 408, 5xx     in doubt → ``find``, then again or found   TEMPORARY
connection refused, token endpoint down    not sent → again after the R5 pause        TEMPORARY
429                                        not sent → again after the R5 pause        TEMPORARY
401                                        one token refresh, sent again; then        AUTHENTICATION
403                                        rejected (no effect)                       AUTHORIZATION
400 / 422 (functional: the ERP said no)    rejected                                   INTEGRATION
409 (business rule)                        rejected                                   BUSINESS
=========================================  =========================================  ==========

The in-process retry of seed 004 §10.3 (R5: 3 attempts, 2 s, ×2, at most 30 s) is the
ledger's, inside the one recorded step (``ErpSettings.retry``, a :class:`jobfence.CallRetry`;
tests and the demo shorten it). A 401 gets one token refresh, which is not an attempt.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from jobfence import (
    AuthenticationError,
    AuthorizationError,
    BusinessError,
    CallInDoubt,
    CallNotSent,
    CallRejected,
    CallRetry,
    CallUnauthorized,
)

# under "jobfence", so `jobfence demo purchase-orders --log-level` governs it as before
log = logging.getLogger("jobfence.purchase_orders.erp")

ORDERS_PATH = "/fscmRestApi/resources/latest/purchaseOrders"
TOKEN_PATH = "/oauth2/v1/token"
#: the recorded step of the ERP create
STEP = "erp.create"
#: seed 004 §10.3: 3 attempts, 2 s, ×2, at most 30 s
R5 = CallRetry(attempts=3, initial=2.0, multiplier=2.0, maximum=30.0)

__all__ = [
    "ORDERS_PATH",
    "R5",
    "STEP",
    "TOKEN_PATH",
    "CallRetry",
    "ErpClient",
    "ErpOrder",
    "ErpSettings",
]


class ErpForbidden(AuthorizationError, CallRejected):
    """403: the ERP forbids the operation; the request had no effect."""


class ErpBusinessRefusal(BusinessError, CallRejected):
    """409: a business rule of the ERP said no; the request had no effect."""


class ErpCredentialsRefused(AuthenticationError, CallRejected):
    """The token endpoint refused our client credentials: no order request left."""


@dataclass(frozen=True)
class ErpSettings:
    base_url: str
    client_id: str = "jobfence-po"
    client_secret: str = "stand-in-secret"
    timeout: float = 10.0  # seconds per HTTP call
    retry: CallRetry = R5  # in-process attempts of one step


@dataclass(frozen=True)
class ErpOrder:
    """The ERP's order for a request, as the recorded step says: ``how`` it is known —
    ``sent`` (this request's answer; ``created`` False when the ERP had it already),
    ``found`` (looked up by the key after a doubt) or ``settled`` (an operator's
    settlement)."""

    order_id: str
    created: bool
    how: str = "sent"

    @classmethod
    def of(cls, recorded: Any) -> ErpOrder:
        """The order of the step's recorded value (what ``send``, ``find`` or a settlement
        gave)."""
        if not isinstance(recorded, dict) or not recorded.get("reference"):
            raise ValueError(f"the ERP step recorded no order reference: {recorded!r:.200}")
        if recorded.get("settled") == "applied":
            return cls(str(recorded["reference"]), False, "settled")
        return cls(
            str(recorded["reference"]), bool(recorded.get("created")), recorded.get("how", "sent")
        )


@dataclass
class ErpCallStats:
    calls: int = 0  # order requests sent
    lookups: int = 0  # orders looked up by key (a doubt)
    token_refreshes: int = 0


class ErpClient:
    """A small client for the ERP's token and purchase-order endpoints."""

    def __init__(self, settings: ErpSettings) -> None:
        self.settings = settings
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
        """A token (a new one when ``stale`` is the current one). Its failures say that no
        order request left: not sent, or our credentials refused."""
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
                raise CallNotSent(
                    f"ERP token endpoint timed out: {exc}", code="ERP_TIMEOUT"
                ) from None
            except httpx.TransportError as exc:
                raise CallNotSent(
                    f"ERP token endpoint unreachable: {exc}", code="ERP_UNREACHABLE"
                ) from None
            if response.status_code in (401, 403):
                raise ErpCredentialsRefused(
                    f"the ERP refused our client credentials ({response.status_code})",
                    code="ERP_BAD_CREDENTIALS",
                )
            if response.status_code != 200:
                raise CallNotSent(
                    f"ERP token endpoint answered {response.status_code}",
                    code=f"ERP_TOKEN_HTTP_{response.status_code}",
                )
            if stale is not None:
                self.stats.token_refreshes += 1
            self._token = str(response.json()["access_token"])
            return self._token

    async def refresh_token(self) -> None:
        """Get a new token (the step's ``refresh`` hook after a 401)."""
        await self._get_token(self._token)

    async def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token or await self._get_token(None)}"}

    async def send_order(self, key: str, document: dict[str, Any]) -> dict[str, Any]:
        """One create request for the request whose key is ``key`` (sent as ``requestId``):
        ``{"reference": order number, "created": …}``, or the exception that says what
        happened to the request (module docstring)."""
        headers = await self._auth()
        self.stats.calls += 1
        try:
            response = await self.client.post(
                ORDERS_PATH, json={"requestId": key, **document}, headers=headers
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise CallNotSent(f"ERP unreachable: {exc}", code="ERP_UNREACHABLE") from None
        except httpx.TimeoutException as exc:
            raise CallInDoubt(
                f"ERP did not answer within {self.settings.timeout:g}s ({type(exc).__name__})",
                code="ERP_TIMEOUT",
            ) from None
        except httpx.TransportError as exc:
            raise CallInDoubt(
                f"the connection to the ERP broke after sending: {exc}", code="ERP_CONNECTION"
            ) from None
        if response.status_code in (200, 201):
            data = response.json()
            return {"reference": str(data["OrderNumber"]), "created": response.status_code == 201}
        raise _refusal(response)

    async def find_order(self, key: str) -> dict[str, Any] | None:
        """The ERP's order for ``key`` (its ``requestId``), or None: the step's ``reconcile``.
        Raises when the ERP cannot say (the step stays in doubt and is tried again)."""
        for refreshed in (False, True):
            headers = await self._auth()
            self.stats.lookups += 1
            response = await self.client.get(
                ORDERS_PATH, params={"q": f"requestId={key}"}, headers=headers
            )
            if response.status_code == 401 and not refreshed:
                await self.refresh_token()
                continue
            break
        if response.status_code != 200:
            raise CallInDoubt(
                f"the ERP could not look the order up ({response.status_code}): "
                f"{_detail(response)}",
                code=f"ERP_LOOKUP_HTTP_{response.status_code}",
            )
        items = response.json().get("items") or []
        if not items:
            return None
        if len(items) > 1:
            log.error(
                "the ERP holds several orders for one request",
                extra={"key": key, "orders": [i.get("OrderNumber") for i in items]},
            )
        return {"reference": str(items[0]["OrderNumber"]), "created": True, "how": "found"}


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        return str(data.get("detail") or data.get("title") or data)[:300]
    return str(data)[:300]


def _refusal(response: httpx.Response) -> Exception:
    """The exception an ERP answer other than 200/201 means (module docstring)."""
    status = response.status_code
    detail = _detail(response)
    code = f"ERP_HTTP_{status}"
    if status == 401:
        return CallUnauthorized(
            f"the ERP refused the token (401): {detail}", code="ERP_UNAUTHORIZED"
        )
    if status == 403:
        return ErpForbidden(f"the ERP forbids this operation (403): {detail}", code=code)
    if status in (400, 422):
        return CallRejected(f"the ERP rejected the order ({status}): {detail}", code=code)
    if status == 409:
        return ErpBusinessRefusal(f"the ERP refused the order ({status}): {detail}", code=code)
    if status == 429:
        return CallNotSent(f"the ERP said not now (429): {detail}", code=code)
    # 408, 5xx and anything unexpected: the order may exist
    return CallInDoubt(f"the ERP answered {status}: {detail}", code=code)
