"""``jobfence demo purchase-orders``: the whole A2 path on loopback, with a summary that proves
no double order.

It starts a PostgreSQL database (a fresh one on the local server unless ``--database-url``),
the ERP stand-in as a separate process (failing transiently and functionally at the chosen
rates, with tokens that expire), the API (uvicorn), a worker and the relay; sends POSTs with
repeated idempotency keys (client retries, some while the first is still running) and
repeated external references; waits until every request settled; retries the failed ones as
an operator once the ERP's rule is "fixed"; and checks the ERP's orders against the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from jobfence import RetryPolicy
from jobfence.http import DEFAULT_LEASE, DEFAULT_WINDOW, tcp_listen_socket

from .adapter import CallRetry, ErpSettings
from .erp import ErpProcess, Switches
from .models import QUEUE, RETRYABLE, RUNNING, State
from .service import PurchaseOrderService, migrate

DEMO_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

DEMO_POLICY = RetryPolicy(
    base=timedelta(seconds=0.1),
    cap=timedelta(seconds=1),
    justification=(
        "demo only: broker backoff compressed from 10 s–10 min to 0.1–1 s so the demo ends in "
        "seconds; the service's default is PO_POLICY"
    ),
)
#: the in-process retry of the ERP step, compressed for the demo (R5: 2 s, ×2, ≤ 30 s). Its
#: first pause is twice the client's timeout: a request that timed out is looked up only
#: once it had time to land — a lookup racing a create still queued in a busy ERP would say
#: "not there" and the step would send it again (docs/calls.md, "In doubt").
DEMO_CALL_RETRY = CallRetry(attempts=3, initial=1.0, multiplier=2.0, maximum=2.0)


@dataclass(frozen=True)
class Scenario:
    """What to throw at the service. Shares are of POSTs (keys, references) or ERP calls."""

    posts: int = 200
    repeat_key_share: float = 0.20
    repeat_reference_share: float = 0.05
    transient_share: float = 0.10
    functional_share: float = 0.02
    business_share: float = 0.0
    client_concurrency: int = 32
    worker_concurrency: int = 12
    erp_latency_ms: float = 2.0
    erp_client_timeout: float = 0.5
    token_ttl: float = 2.0
    call_retry: CallRetry = DEMO_CALL_RETRY
    policy: RetryPolicy = DEMO_POLICY
    seed: int = 4
    settle_timeout: float = 120.0
    idempotency_window: timedelta = DEFAULT_WINDOW
    idempotency_lease: timedelta = DEFAULT_LEASE
    #: the queue (None: the table next to the fence; or amqp://, nats://, redis://, pubsub://)
    transport: str | None = None
    #: whether the ERP de-duplicates creates by requestId (off: every repeated create would
    #: be a second order, so only the call ledger stands between a doubt and a double order)
    erp_deduplication: bool = False


@dataclass
class Send:
    op: int
    kind: str  # "original" | "repeat" | "reference"
    status: int = 0
    first_status: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    in_flight_waits: int = 0


@dataclass
class Result:
    scenario: Scenario
    sends: list[Send]
    request_of_op: dict[int, str]
    requests: dict[str, dict[str, Any]]
    dead_letters: dict[str, dict[str, Any]]
    erp_stats: dict[str, Any]
    erp_orders: dict[str, dict[str, Any]]
    retried: dict[str, int]
    retry_refusals: list[tuple[str, int, str]]
    extras: dict[str, tuple[int, str]]
    post_seconds: float
    settle_seconds: float
    outbox_counts: dict[str, int]
    #: every dead letter of the requests' events, by review status (old events' included)
    letter_statuses: dict[str, int] = field(default_factory=dict)
    #: how the ERP steps ended (per delivery) and their doubts were resolved (the service's
    #: CallTally), and the ledger's rows by state at the end
    call_outcomes: dict[str, int] = field(default_factory=dict)
    reconciled: dict[str, int] = field(default_factory=dict)
    ledger_states: dict[str, int] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def first_answers(self) -> Counter[str]:
        found: Counter[str] = Counter()
        for send in self.sends:
            if send.first_status == 202 and send.replayed:
                found["202 replay"] += 1
            elif send.first_status == 202:
                found["202 accepted"] += 1
            else:
                code = send.body.get("code", "") if send.first_status == send.status else ""
                found[f"{send.first_status} {code}".strip()] += 1
        return found


def _document(rng: random.Random, op: int, reference: str | None) -> dict[str, Any]:
    return {
        "company_id": f"BU-{op % 3 + 1}",
        "document_type": "STANDARD",
        "external_reference": reference,
        "supplier_id": f"SUP-{rng.randint(1, 40):03d}",
        "currency": "USD",
        "lines": [
            {
                "item": f"ITEM-{rng.randint(1, 500):04d}",
                "quantity": rng.randint(1, 20),
                "unit_price": f"{rng.uniform(1, 900):.2f}",
            }
            for _ in range(rng.randint(1, 4))
        ],
    }


async def _wait(
    check: Callable[[], Awaitable[Any]], *, timeout: float, what: str, interval: float = 0.1
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


class LocalStack:
    """ERP process, service, API server and (with ``pipeline``) worker, relay and
    reconciler, all on loopback; what the demo and the tests run."""

    def __init__(
        self,
        database_url: str,
        scenario: Scenario,
        *,
        pipeline: bool = True,
        erp: ErpProcess | None = None,
    ) -> None:
        self.database_url = database_url
        self.scenario = scenario
        self.pipeline = pipeline
        self.own_erp = erp is None
        self.erp = erp or ErpProcess()
        self.switches = Switches(
            deduplicate=scenario.erp_deduplication,
            latency_ms=scenario.erp_latency_ms,
            error_rate=scenario.transient_share * 0.6,
            ambiguous_rate=scenario.transient_share * 0.2,
            timeout_rate=scenario.transient_share * 0.2,
            timeout_seconds=scenario.erp_client_timeout * 2,
            functional_rate=scenario.functional_share,
            business_rate=scenario.business_share,
            token_ttl=scenario.token_ttl,
            seed=scenario.seed,
        )
        self.service: PurchaseOrderService | None = None
        self.server: Any = None
        self.relay: Any = None
        self.worker: Any = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.reconciler: asyncio.Task[Any] | None = None
        self.api_url = ""

    async def __aenter__(self) -> LocalStack:
        import uvicorn

        from .api import create_api

        await migrate(self.database_url)
        if self.own_erp:
            self.erp.switches = self.switches
            erp_url = await asyncio.to_thread(self.erp.start)
        else:
            await asyncio.to_thread(self.erp.reset, self.switches)
            erp_url = self.erp.url
        try:
            self.service = PurchaseOrderService(
                self.database_url,
                erp=ErpSettings(
                    erp_url,
                    timeout=self.scenario.erp_client_timeout,
                    retry=self.scenario.call_retry,
                ),
                retry=self.scenario.policy,
                transport=self.scenario.transport,
            )
            await self.service.open(pool_size=self.scenario.worker_concurrency + 8)
            sock = tcp_listen_socket()  # TCP_NODELAY: no 40 ms per keep-alive answer
            self.api_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            self.server = uvicorn.Server(
                uvicorn.Config(
                    create_api(
                        self.service,
                        manage_service=False,
                        idempotency_window=self.scenario.idempotency_window,
                        idempotency_lease=self.scenario.idempotency_lease,
                    ),
                    log_level="critical",
                    access_log=False,
                    lifespan="on",
                )
            )
            self.tasks.append(asyncio.create_task(self.server.serve(sockets=[sock])))
            if self.pipeline:
                self.start_pipeline()
            await _wait(self._started, timeout=20, what="the API server")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    def start_pipeline(self) -> None:
        """Start the relay, the worker and the reconciler (if not running yet)."""
        if self.relay is None:
            self.start_relay()
        if self.worker is None:
            self.worker = self.svc.worker(concurrency=self.scenario.worker_concurrency)
            self.tasks.append(asyncio.create_task(self.worker.run()))
            self.reconciler = asyncio.create_task(self.svc.reconcile_forever(1.0))
            self.tasks.append(self.reconciler)

    def start_relay(self) -> None:
        self.relay = self.svc.relay(poll_interval=1.0)
        self.tasks.append(self.relay.start())

    async def stop_relay(self) -> None:
        if self.relay is not None:
            relay, self.relay = self.relay, None
            await relay.stop()

    async def control(self, **switches: Any) -> dict[str, Any]:
        """Change the ERP stand-in's switches while it runs."""
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{self.erp.url}/_control", json=switches)
            response.raise_for_status()
            data: dict[str, Any] = response.json()
            return data

    async def erp_stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            data: dict[str, Any] = (await client.get(f"{self.erp.url}/_stats")).json()
            return data

    async def _started(self) -> bool:
        return bool(self.server.started)

    async def __aexit__(self, *exc: object) -> None:
        for part in (self.worker, self.relay):
            if part is not None:
                part.request_stop()
        if self.server is not None:
            self.server.should_exit = True
        if self.reconciler is not None:
            self.reconciler.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.service is not None:
            await self.service.close()
        if self.own_erp:
            await asyncio.to_thread(self.erp.stop)

    @property
    def svc(self) -> PurchaseOrderService:
        assert self.service is not None
        return self.service


async def run_scenario(
    database_url: str,
    scenario: Scenario,
    *,
    console: Console | None = None,
    erp: ErpProcess | None = None,
) -> Result:
    """Run the scenario against a migrated-or-empty PostgreSQL database; return the evidence."""
    from jobfence.ops.auth import create_token

    say = console.print if console is not None else (lambda *a, **k: None)
    rng = random.Random(scenario.seed)
    async with LocalStack(database_url, scenario, erp=erp) as stack:
        svc = stack.svc
        run = uuid.uuid4().hex[:6]
        partners = {
            name: await svc.create_partner(f"{name}-{run}", name.title())
            for name in ("acme", "globex")
        }
        operator = await create_token(
            svc.db, name=f"demo-operator-{run}", role="operator", partner=None
        )
        say(
            f"ERP stand-in {stack.erp.url}, API {stack.api_url}, database {svc.db.display}, "
            f"queue {svc.app.transport.name}"
        )

        # -- plan the POSTs ----------------------------------------------------------------------
        repeats = round(scenario.posts * scenario.repeat_key_share)
        uniques = scenario.posts - repeats
        references = round(scenario.posts * scenario.repeat_reference_share)
        ops: list[dict[str, Any]] = []
        for op in range(uniques - references):
            partner = "acme" if op % 2 == 0 else "globex"
            reference = f"EXT-{run}-{op}" if rng.random() < 0.9 else None
            ops.append(
                {
                    "partner": partner,
                    "key": f"key-{run}-{op}",
                    "body": _document(rng, op, reference),
                    "kind": "original",
                }
            )
        with_reference = [i for i, o in enumerate(ops) if o["body"]["external_reference"]]
        for n in range(references):
            source = ops[rng.choice(with_reference)]
            op = len(ops)
            body = _document(rng, op, source["body"]["external_reference"])
            body["company_id"] = source["body"]["company_id"]
            ops.append(
                {
                    "partner": source["partner"],
                    "key": f"key-{run}-ref-{n}",
                    "body": body,
                    "kind": "reference",
                }
            )
        # phase 1: originals and client retries (half of them right behind their original,
        # so some arrive while it is still running); phase 2: repeated external references
        position = {i: rng.random() for i in range(len(ops)) if ops[i]["kind"] == "original"}
        phase1 = [(position[i], Send(op=i, kind="original")) for i in position]
        for n in range(repeats):
            op = rng.choice(list(position))
            at = position[op] + 1e-9 * (n + 1) if n % 2 == 0 else rng.random()
            phase1.append((at, Send(op=op, kind="repeat")))
        phase1.sort(key=lambda item: item[0])
        phase2 = [
            Send(op=i, kind="reference") for i in range(len(ops)) if ops[i]["kind"] == "reference"
        ]
        sends = [send for _, send in phase1] + phase2

        # several small clients: one httpx pool scans all its connections for every request
        lanes = max(1, scenario.client_concurrency // 4)
        limits = httpx.Limits(max_connections=4)
        async with contextlib.AsyncExitStack() as clients:
            pool = [
                await clients.enter_async_context(
                    httpx.AsyncClient(base_url=stack.api_url, timeout=30, limits=limits)
                )
                for _ in range(lanes)
            ]
            http = pool[0]
            rotation = itertools.count()
            gate = asyncio.Semaphore(scenario.client_concurrency)

            async def post(send: Send) -> None:
                spec = ops[send.op]
                headers = {
                    "Authorization": f"Bearer {partners[spec['partner']]}",
                    "Idempotency-Key": spec["key"],
                }
                lane = pool[next(rotation) % lanes]
                async with gate:
                    for _ in range(200):
                        response = await lane.post("/requests", json=spec["body"], headers=headers)
                        if not send.first_status:
                            send.first_status = response.status_code
                        send.status = response.status_code
                        send.body = response.json()
                        send.replayed = response.headers.get("idempotent-replayed") == "true"
                        if send.body.get("code") != "IDEMPOTENCY_KEY_IN_FLIGHT":
                            return
                        # what a well-behaved client does: wait, retry with the same key
                        send.in_flight_waits += 1
                        await asyncio.sleep(0.02)

            started = time.monotonic()
            await asyncio.gather(*(post(s) for s in sends[: len(phase1)]))
            await asyncio.gather(*(post(s) for s in phase2))
            post_seconds = time.monotonic() - started

            # a few requests that must be refused outright
            extras: dict[str, tuple[int, str]] = {}
            spec = ops[0]
            auth = {"Authorization": f"Bearer {partners[spec['partner']]}"}
            r = await http.post("/requests", json=spec["body"], headers=auth)
            extras["no key"] = (r.status_code, r.json().get("code", ""))
            changed = {**spec["body"], "currency": "EUR"}
            r = await http.post(
                "/requests", json=changed, headers={**auth, "X-Idempotency-Key": spec["key"]}
            )
            extras["same key, other body"] = (r.status_code, r.json().get("code", ""))
            r = await http.post(
                "/requests", json=spec["body"], headers={**auth, "Idempotency-Key": "x" * 256}
            )
            extras["key of 256 characters"] = (r.status_code, r.json().get("code", ""))
            other = "globex" if spec["partner"] == "acme" else "acme"
            r = await http.post(
                "/requests",
                json=spec["body"],
                headers={
                    "Authorization": f"Bearer {partners[other]}",
                    "Idempotency-Key": spec["key"],
                },
            )
            extras["another partner, same key"] = (r.status_code, r.json().get("state", ""))
            other_request = r.json().get("requestId")

            request_of_op: dict[int, str] = {}
            for send in sends:
                if send.status == 202 and send.kind != "repeat":
                    request_of_op[send.op] = send.body["requestId"]
            accepted = set(request_of_op.values())
            if other_request:
                accepted.add(other_request)

            async def settled() -> bool:
                states = await svc.requests_by_ids(sorted(accepted))
                return all(row["state"] not in RUNNING for row in states.values())

            say(f"{len(sends)} POSTs answered in {post_seconds:.2f}s; waiting for the pipeline…")
            started = time.monotonic()
            await _wait(settled, timeout=scenario.settle_timeout, what="every request to settle")

            # -- the operator: fix the ERP rule, retry what failed ------------------------------
            await stack.control(functional_rate=0.0, business_rate=0.0)
            states = await svc.requests_by_ids(sorted(accepted))
            failed = sorted(r for r, row in states.items() if row["state"] in RETRYABLE)
            op_auth = {"Authorization": f"Bearer {operator}"}
            retried: dict[str, int] = {}
            refusals: list[tuple[str, int, str]] = []
            # the relay waits while the operator works, so a double click finds the first
            # retry still RECEIVED
            await stack.stop_relay()
            for request_id in failed:
                r = await http.post(
                    f"/requests/{request_id}/retry",
                    json={"reason": "ERP supplier-site rule fixed (demo)"},
                    headers=op_auth,
                )
                retried[request_id] = r.status_code
                if len(retried) == 1:
                    r = await http.post(
                        f"/requests/{request_id}/retry",
                        json={"reason": "double click"},
                        headers=op_auth,
                    )
                    refusals.append(
                        ("retry while running", r.status_code, r.json().get("code", ""))
                    )
            stack.start_relay()
            completed = [r for r, row in states.items() if row["state"] == State.COMPLETED]
            if completed:
                r = await http.post(
                    f"/requests/{completed[0]}/retry",
                    json={"reason": "why not"},
                    headers=op_auth,
                )
                refusals.append(
                    ("retry of a completed request", r.status_code, r.json().get("code", ""))
                )
            await _wait(settled, timeout=scenario.settle_timeout, what="retried requests")
            settle_seconds = time.monotonic() - started

            erp_stats = (await http.get(f"{stack.erp.url}/_stats")).json()
            erp_orders = (await http.get(f"{stack.erp.url}/_orders")).json()

        requests = await svc.requests_by_ids(sorted(accepted))
        letters = await svc.dead_letters_for([row["current_event_id"] for row in requests.values()])
        async with svc.db.transaction() as tx:
            ledger = await tx.fetchall("SELECT state, count(*) FROM core.calls GROUP BY state")
        from jobfence import outbox

        result = Result(
            scenario=scenario,
            sends=sends,
            request_of_op=request_of_op,
            requests=requests,
            dead_letters=letters,
            erp_stats=erp_stats,
            erp_orders=erp_orders,
            retried=retried,
            retry_refusals=refusals,
            extras=extras,
            post_seconds=post_seconds,
            settle_seconds=settle_seconds,
            outbox_counts=await outbox.counts(svc.db),
            letter_statuses=await svc.dead_letter_statuses(sorted(accepted)),
            call_outcomes=dict(svc.calls.finished),
            reconciled=dict(svc.calls.reconciled),
            ledger_states={str(state): int(n) for state, n in ledger},
        )
    result.checks = check(result)
    return result


def check(result: Result) -> list[tuple[str, bool, str]]:
    """The claims the summary makes, each with its evidence."""
    checks: list[tuple[str, bool, str]] = []
    requests = result.requests
    completed = {r for r, row in requests.items() if row["state"] == State.COMPLETED}
    orders = result.erp_orders
    checks.append(
        (
            "ERP orders created = completed requests (no double order)",
            result.erp_stats["orders_created"] == len(completed) and set(orders) == completed,
            f"{result.erp_stats['orders_created']} orders, {len(completed)} completed",
        )
    )
    checks.append(
        (
            "ERP orders created = requests accepted (ERP de-duplication "
            f"{'on' if result.scenario.erp_deduplication else 'off'})",
            result.erp_stats["orders_created"] == len(requests)
            and result.erp_stats["duplicates"] == 0,
            f"{result.erp_stats['orders_created']} orders, {len(requests)} accepted, "
            f"{result.erp_stats['duplicates']} second orders for a request",
        )
    )
    open_calls = {s: n for s, n in result.ledger_states.items() if s in ("pending", "in_doubt")}
    doubts = sum(result.reconciled.values())
    checks.append(
        (
            "every call in doubt resolved (none left pending or in doubt)",
            not open_calls,
            f"{doubts} doubts looked up; left: {open_calls or 'none'}",
        )
    )
    wrong = [
        r for r in completed if orders.get(r, {}).get("OrderNumber") != requests[r]["erp_order_id"]
    ]
    checks.append(
        ("each completed request holds its ERP order number", not wrong, f"{len(wrong)} mismatched")
    )
    unsettled = []
    for request_id, row in requests.items():
        if row["state"] == State.COMPLETED:
            continue
        letter = result.dead_letters.get(row["current_event_id"])
        if row["state"] not in RETRYABLE or letter is None:
            unsettled.append(request_id)
    checks.append(
        (
            "every other accepted request is failed with its dead letter",
            not unsettled,
            f"{len(requests) - len(completed)} failed, {len(unsettled)} without a dead letter",
        )
    )
    server_errors = [s for s in result.sends if s.status >= 500 or s.first_status >= 500]
    checks.append(("no 5xx answer to any POST", not server_errors, f"{len(server_errors)} 5xx"))
    bad_repeats = 0
    for send in result.sends:
        if send.kind == "repeat":
            original = result.request_of_op.get(send.op)
            wrong_request = send.status == 202 and send.body.get("requestId") != original
            refused = send.status != 202
            if wrong_request or refused:
                bad_repeats += 1
    checks.append(
        (
            "repeated keys got the original answer",
            bad_repeats == 0,
            f"{bad_repeats} repeats answered differently",
        )
    )
    duplicates = [s for s in result.sends if s.kind == "reference"]
    named = [
        s
        for s in duplicates
        if s.status == 409
        and s.body.get("code") == "DUPLICATE_DOCUMENT"
        and s.body.get("existingRequestId") in requests
    ]
    checks.append(
        (
            "repeated external references → 409 naming the request",
            len(named) == len(duplicates),
            f"{len(named)}/{len(duplicates)}",
        )
    )
    retried_ok = [
        r
        for r, status in result.retried.items()
        if status == 202
        and requests[r]["state"] == State.COMPLETED
        and requests[r]["operator_retries"] == 1
    ]
    checks.append(
        (
            "operator retries completed each failed request once",
            len(retried_ok) == len(result.retried),
            f"{len(retried_ok)}/{len(result.retried)}",
        )
    )
    return checks


def add_dead_letter_rows(pipeline: Table, result: Result) -> None:
    """Every dead letter the run wrote, and why a failed request that the operator retried
    has none pending: its retry sent a new event and discarded the old event's letter."""
    statuses = result.letter_statuses
    written = sum(statuses.values())
    pipeline.add_row("dead letters written (one per failed event)", str(written))
    pipeline.add_row(
        "  discarded: superseded by the operator's retry (a new event)",
        str(statuses.get("discarded", 0)),
    )
    pipeline.add_row(
        "  pending review: requests still failed (their current event)",
        str(len(result.dead_letters)),
    )
    transport = result.scenario.transport or ""
    if transport.startswith("pubsub://"):
        dlq = dlq_topic(transport)
        pipeline.add_row(f"  each also published once to the DLQ topic {dlq}", str(written))


def dlq_topic(url: str) -> str:
    """The DLQ topic of the purchase-order queue on the ``pubsub://`` transport ``url``:
    ``PREFIX.QUEUE.DLQ`` (``?prefix=``, default ``jobfence``; ``?dlq=``, default ``dlq``;
    docs/transports.md)."""
    from urllib.parse import parse_qs, urlsplit

    options = parse_qs(urlsplit(url).query)
    prefix = options.get("prefix", ["jobfence"])[0]
    return f"{prefix}.{QUEUE}.{options.get('dlq', ['dlq'])[0]}"


def print_summary(result: Result, console: Console) -> None:
    answers = Table(title="HTTP answers (first answer per POST)")
    answers.add_column("answer")
    answers.add_column("POSTs", justify="right")
    for name, count in sorted(result.first_answers().items()):
        answers.add_row(name, str(count))
    waits = sum(s.in_flight_waits for s in result.sends)
    answers.add_row("(409 in flight, then retried by the client)", str(waits))
    for name, (status, code) in result.extras.items():
        answers.add_row(f"{name}", f"{status} {code}")
    console.print(answers)

    states = Counter(row["state"] for row in result.requests.values())
    pipeline = Table(title="Requests and the ERP")
    pipeline.add_column("what")
    pipeline.add_column("count", justify="right")
    pipeline.add_row("accepted requests", str(len(result.requests)))
    for state in State:
        if states.get(state):
            pipeline.add_row(f"  {state.value}", str(states[state]))
    pipeline.add_row(
        "operator retries (202)", str(sum(1 for s in result.retried.values() if s == 202))
    )
    for name, status, code in result.retry_refusals:
        pipeline.add_row(f"  {name}", f"{status} {code}")
    erp = result.erp_stats
    pipeline.add_row("ERP orders created", str(erp["orders_created"]))
    pipeline.add_row("ERP calls", str(erp["order_calls"]))
    pipeline.add_row(
        "  answered 503 / 500 after create / timed out",
        f"{erp['unavailable']} / {erp['ambiguous']} / {erp['timeouts']}",
    )
    pipeline.add_row(
        "  ERP de-duplication by requestId",
        "on" if result.scenario.erp_deduplication else "off",
    )
    pipeline.add_row(
        "  repeated creates absorbed by the ERP / second orders made",
        f"{erp['deduplicated']} / {erp['duplicates']}",
    )
    pipeline.add_row(
        "  rejected (functional 400 / business 409)",
        f"{erp['rejected_functional']} / {erp['rejected_business']}",
    )
    pipeline.add_row("  401 (expired token → one refresh)", str(erp["unauthorized"]))
    add_dead_letter_rows(pipeline, result)
    found = result.reconciled
    pipeline.add_row(
        "ERP calls in doubt (timeout, reset, 5xx after sending)", str(sum(found.values()))
    )
    pipeline.add_row(
        "  found in the ERP by the key → recorded, not sent again", str(found.get("found", 0))
    )
    pipeline.add_row(
        "  not in the ERP → sent again with the same key", str(found.get("not_found", 0))
    )
    pipeline.add_row("  lookup failed → tried again later", str(found.get("error", 0)))
    pipeline.add_row(
        "  parked for an operator (no lookup)", str(result.call_outcomes.get("parked", 0))
    )
    pipeline.add_row(
        "ERP steps answered from the ledger (redeliveries, no call)",
        str(result.call_outcomes.get("recorded", 0)),
    )
    pipeline.add_row("outbox", ", ".join(f"{k} {v}" for k, v in result.outbox_counts.items()))
    pipeline.add_row("POST rate", f"{len(result.sends) / result.post_seconds:.0f}/s")
    console.print(pipeline)
    if (result.scenario.transport or "").startswith("pubsub://"):
        console.print(
            f"Pub/Sub keeps a message of {dlq_topic(result.scenario.transport or '')} only for "
            "the subscriptions that exist when it is published: to read the DLQ topic, create "
            "your own subscription on it before the failures (docs/transports.md)."
        )

    checks = Table(title="Checks")
    checks.add_column("claim")
    checks.add_column("", justify="center")
    checks.add_column("evidence")
    for name, ok, evidence in result.checks:
        checks.add_row(name, "[green]ok[/]" if ok else "[red]FAILED[/]", evidence)
    console.print(checks)


async def run_demo(
    database_url: str | None,
    scenario: Scenario,
    *,
    keep: bool,
    console: Console,
    admin_url: str = DEMO_ADMIN_URL,
) -> bool:
    """Run the demo; on a temporary database (created on ``admin_url``'s server) unless
    ``database_url`` is given. Returns whether every check held."""
    import psycopg
    from psycopg import sql

    from jobfence import DatabaseUnavailable

    created: str | None = None
    if database_url is None:
        created = f"jobfence_demo_po_{uuid.uuid4().hex[:8]}"
        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(created)))
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0]
            raise DatabaseUnavailable(
                f"cannot create a demo database on {admin_url}: {first}; "
                "pass --database-url postgresql://… of a database the demo may use"
            ) from None
        database_url = admin_url.rsplit("/", 1)[0] + f"/{created}"
    try:
        result = await run_scenario(database_url, scenario, console=console)
        print_summary(result, console)
        verdict = (
            "[green]no double order; every request accounted for[/]"
            if result.ok
            else ("[red]some checks failed[/]")
        )
        console.print(verdict)
        return result.ok
    finally:
        if created is not None:
            if keep:
                console.print(f"kept the demo database: {database_url}")
            else:
                with (
                    contextlib.suppress(psycopg.Error),
                    psycopg.connect(admin_url, autocommit=True) as conn,
                ):
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(created)
                        )
                    )
