"""OpenTelemetry tracing (issue 17 §1, docs/tracing.md): one connected trace from the producer
(an enqueue, or an HTTP POST with an idempotency key through the outbox and its relay) to the
handler, on the database queue and on brokers; a replayed dead letter links to its original
trace; the attributes are there; logs carry the ids; nothing breaks without the extra.

The SDK's in-memory exporter records the spans; real servers, no mocks."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
from fastapi import FastAPI, Request
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult
from opentelemetry.trace import SpanKind

from jobfence import App, Job, TemporaryError, Tx, ValidationError, list_dead_letters
from jobfence.core.jobs import trace_context_of, trace_headers
from jobfence.http import IdempotencyMiddleware
from jobfence.outbox import write as outbox_write
from jobfence.outbox.relay import Relay
from jobfence.review.deadletters import Actor, replay
from jobfence.tracing import TraceIds
from jobfence_examples.points import DEMO_POLICY, Credit
from tests.contract.support import Target, cleanup, make_target
from tests.helpers import REPO, RunningWorker, eventually, scalar

test_tracer = trace.get_tracer("tests")


class WhileTesting(Sampler):
    """Record spans only during a test of this module: the SDK is set once per process, and
    the other tests that process runs afterwards should neither pay for spans nor fill the
    in-memory exporter."""

    active = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return (ALWAYS_ON if self.active else ALWAYS_OFF).should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "tests/test_tracing.py"


GATE = WhileTesting()


@pytest.fixture(scope="session")
def exporter() -> InMemorySpanExporter:
    """The SDK, once per test process, exporting to memory."""
    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(sampler=GATE)
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    GATE.active = True
    try:
        yield exporter
    finally:
        GATE.active = False
        exporter.clear()


@pytest.fixture
def ids_log() -> Iterator[list[logging.LogRecord]]:
    """jobfence's log records, through the filter that adds trace and span ids."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    handler.addFilter(TraceIds())
    logger = logging.getLogger("jobfence")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


@pytest.fixture(params=["postgresql", "sqlite", "rabbitmq", "redis", "nats", "pubsub"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    if made.transport_url:
        import asyncio

        asyncio.run(cleanup(made))


def in_trace(spans: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]


def named(found: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def points_app(target: Target, effects: list[str]) -> App:
    """The points demo's consumer (its payload schema, a credit that fails once on a flaky
    partner), on the target's queue and transport; the handler opens a span of its own."""
    app = target.app()

    @app.consumer(target.queue, schema=Credit, retry=DEMO_POLICY)
    async def credit(job: Job[Credit], tx: Tx) -> None:
        with test_tracer.start_as_current_span("credit points"):
            if job.payload.member_id == "member-partner-flaky" and job.attempt < 2:
                raise TemporaryError("loyalty partner API timed out")
            logging.getLogger("jobfence.test").info("crediting", extra={"job_id": job.job_id})
            effects.append(job.job_id)

    return app


async def test_one_trace_from_enqueue_to_the_handler(
    target: Target, spans: InMemorySpanExporter, ids_log: list[logging.LogRecord]
) -> None:
    effects: list[str] = []
    app = points_app(target, effects)
    async with app:
        with test_tracer.start_as_current_span("checkout") as root:
            await app.enqueue(
                target.queue,
                {"member_id": "member-partner-flaky", "points": 5},
                job_id="credit-1",
                correlation_id="order-1",
            )
        async with RunningWorker(app, concurrency=2, poll_interval=0.1) as worker:
            await eventually(lambda: effects == ["credit-1"], timeout=30, what="the credit")
            await eventually(lambda: worker.stats.handled == 2, what="both attempts settled")
    trace_id = root.get_span_context().trace_id
    found = in_trace(spans, trace_id)

    send = named(found, f"send {target.queue}")
    assert len(send) == 1
    assert send[0].kind is SpanKind.PRODUCER
    assert parent_of(send[0]) == root.get_span_context().span_id
    processes = named(found, f"process {target.queue}")
    assert len(processes) == 2, [s.name for s in found]  # the failed attempt and the retry
    for process in processes:
        assert process.kind is SpanKind.CONSUMER
        assert parent_of(process) == send[0].context.span_id
    first, second = sorted(processes, key=lambda s: s.attributes["jobfence.attempt"])
    system = {"pubsub": "gcp_pubsub"}.get(target.kind, target.kind)
    assert dict(second.attributes) | {
        "messaging.system": system,
        "messaging.destination.name": target.queue,
        "messaging.message.id": "credit-1",
        "messaging.operation.type": "process",
        "jobfence.job_id": "credit-1",
        "jobfence.correlation_id": "order-1",
        "jobfence.outcome": "processed",
    } == dict(second.attributes)
    assert first.attributes["jobfence.outcome"] == "retry"
    assert first.attributes["jobfence.error.category"] == "TEMPORARY_ERROR"
    (retry,) = named(found, f"retry {target.queue}")
    assert parent_of(retry) == first.context.span_id
    assert retry.attributes["jobfence.error.category"] == "TEMPORARY_ERROR"
    handler_spans = named(found, "credit points")
    assert {parent_of(s) for s in handler_spans} == {first.context.span_id, second.context.span_id}

    # logs made inside the spans carry their ids: the retry's (harness) and the handler's
    by_message = {r.getMessage(): r for r in ids_log if getattr(r, "trace_id", None)}
    assert by_message["job failed; retry scheduled"].trace_id == format(trace_id, "032x")
    crediting = by_message["crediting"]
    assert crediting.trace_id == format(trace_id, "032x")
    assert crediting.span_id in {format(s.context.span_id, "016x") for s in handler_spans}


@pytest.fixture(params=["postgresql-one-statement", "postgresql", "rabbitmq"])
def relayed(request: pytest.FixtureRequest) -> Iterator[tuple[Target, bool]]:
    """Where the relay publishes: the job table of the same database in one statement, the
    same with publish-then-mark rounds (every other transport's path), a broker."""
    kind = str(request.param)
    made = make_target(kind.removesuffix("-one-statement"), request)
    yield made, kind.endswith("-one-statement")
    if made.transport_url:
        import asyncio

        asyncio.run(cleanup(made))


async def test_http_post_through_the_outbox_and_relay_to_the_handler(
    relayed: tuple[Target, bool], spans: InMemorySpanExporter
) -> None:
    """POST with an idempotency key (and the client's traceparent) → outbox write in the
    request → relay → worker → handler: one trace. A repeat is ``replayed``, another body
    under the same key ``mismatch``, all as span attributes."""
    target, one_statement = relayed
    queue = target.queue
    effects: list[str] = []
    app = target.app()

    @app.consumer(queue, schema=Credit)
    async def credit(job: Job[Credit], tx: Tx) -> None:
        with test_tracer.start_as_current_span("credit points"):
            effects.append(job.job_id)

    api = FastAPI()

    @api.post("/credits")
    async def create(request: Request) -> dict[str, str]:
        body = Credit.model_validate(await request.json())
        async with app.db.transaction() as tx:
            event_id = await outbox_write(tx, queue, body.model_dump(), correlation_id="http-1")
        return {"event_id": event_id}

    asgi = IdempotencyMiddleware(api, database=lambda: app.db)
    client_trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with app:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi), base_url="http://test"
        ) as client:
            headers = {"idempotency-key": "key-1", "traceparent": client_trace}
            first = await client.post(
                "/credits", json={"member_id": "m", "points": 3}, headers=headers
            )
            assert first.status_code == 200, first.text
            again = await client.post(
                "/credits", json={"member_id": "m", "points": 3}, headers=headers
            )
            assert again.json() == first.json()
            other = await client.post(
                "/credits", json={"member_id": "m", "points": 4}, headers=headers
            )
            assert other.status_code == 409
        event_id = first.json()["event_id"]
        relay = Relay(app, one_transaction=None if one_statement else False)
        assert relay.direct is one_statement
        assert await relay.run_once() == 1
        async with RunningWorker(app, concurrency=2, poll_interval=0.1):
            await eventually(lambda: effects == [event_id], what="the credit")

    trace_id = int(client_trace.split("-")[1], 16)
    found = in_trace(spans, trace_id)
    outcomes = [s.attributes["jobfence.idempotency.outcome"] for s in named(found, "idempotency")]
    assert outcomes == ["executed", "replayed", "mismatch"]
    executed, replayed, mismatch = named(found, "idempotency")
    assert executed.kind is SpanKind.SERVER
    assert parent_of(executed) == int(client_trace.split("-")[2], 16)
    assert replayed.attributes["jobfence.idempotency.replayed"] is True
    assert mismatch.attributes["jobfence.idempotency.mismatch"] is True
    (create_span,) = named(found, f"create {queue}")
    assert create_span.attributes["messaging.operation.type"] == "create"
    assert create_span.attributes["jobfence.job_id"] == event_id
    (publish,) = named(found, f"publish {queue}")
    (process,) = named(found, f"process {queue}")
    assert parent_of(publish) == create_span.context.span_id
    assert parent_of(process) == create_span.context.span_id
    assert process.attributes["jobfence.correlation_id"] == "http-1"
    (handler,) = named(found, "credit points")
    assert parent_of(handler) == process.context.span_id
    stored = await scalar(target.database_url, "SELECT trace_context FROM core.outbox")
    assert trace_headers(stored)["traceparent"].split("-")[1] == format(trace_id, "032x")


class Order(pydantic.BaseModel):
    sku: str


@pytest.fixture(params=["postgresql", "sqlite", "rabbitmq"])
def replayed(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The replay inserts the job in SQL (database queue) or publishes it (a broker)."""
    made = make_target(str(request.param), request)
    yield made
    if made.transport_url:
        import asyncio

        asyncio.run(cleanup(made))


async def test_a_replayed_dead_letter_links_to_its_original_trace(
    replayed: Target, spans: InMemorySpanExporter
) -> None:
    queue = replayed.queue
    broken = {"yes": True}
    done: list[str] = []
    app = replayed.app()

    @app.consumer(queue, schema=Order)
    async def ship(job: Job[Order], tx: Tx) -> None:
        if broken["yes"]:
            raise ValidationError("the warehouse does not know this sku")
        done.append(job.job_id)

    async with app:
        with test_tracer.start_as_current_span("order placed") as root:
            await app.enqueue(queue, {"sku": "x"}, job_id="order-7")
        async with RunningWorker(app, concurrency=1, poll_interval=0.1) as worker:
            await eventually(lambda: worker.stats.handled == 1, what="the dead letter")
        original = root.get_span_context().trace_id
        (dead,) = named(in_trace(spans, original), f"dead_letter {queue}")
        assert dead.attributes["jobfence.error.category"] == "VALIDATION_ERROR"
        (process,) = named(in_trace(spans, original), f"process {queue}")
        assert process.attributes["jobfence.outcome"] == "dead"
        assert process.attributes["jobfence.error.category"] == "VALIDATION_ERROR"
        assert parent_of(dead) == process.context.span_id

        broken["yes"] = False
        (letter,) = await list_dead_letters(app.db, queue=queue)
        with test_tracer.start_as_current_span("operator replays") as operator:
            await replay(app.db, app.transport, letter.id, actor=Actor("ops"))
        async with RunningWorker(app, concurrency=1, poll_interval=0.1):
            await eventually(lambda: done == ["order-7"], what="the replayed job")

    replay_trace = in_trace(spans, operator.get_span_context().trace_id)
    (replay_span,) = named(replay_trace, f"replay {queue}")
    assert [link.context.trace_id for link in replay_span.links] == [original]
    (again,) = named(replay_trace, f"process {queue}")
    assert parent_of(again) == replay_span.context.span_id
    assert again.attributes["jobfence.outcome"] == "processed"


def test_trace_context_is_stored_in_w3c_form() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_context_of(parent) == parent
    assert trace_context_of(parent.encode(), b"a=1,b=2") == f"{parent} a=1,b=2"
    assert trace_headers(f"{parent} a=1,b=2") == {"traceparent": parent, "tracestate": "a=1,b=2"}
    # unusable input travels as no context (a new trace), never as an error
    for bad in (None, "", "has space", "x" * 200, b"\xff", "tab\there", 42):
        assert trace_context_of(bad) is None
    # a tracestate too long for the column is dropped, the traceparent kept
    assert trace_context_of(parent, "k=" + "v" * 2000) == parent
    assert trace_headers(None) == {}


NO_OTEL = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
import asyncio, jobfence.tracing as t
from jobfence import App
assert not t.AVAILABLE and t.get() is None
async def main():
    app = App(sys.argv[1], auto_migrate=True)
    done = []
    @app.consumer("q")
    async def handle(job, tx):
        done.append(job.job_id)
    async with app:
        assert app.tracing is None
        await app.enqueue("q", {"a": 1}, job_id="j1")
        worker = app.worker(poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        for _ in range(400):
            if done:
                break
            await asyncio.sleep(0.05)
        worker.request_stop()
        await task
    assert done == ["j1"], done
    assert "opentelemetry" not in sys.modules
asyncio.run(main())
print("ok")
"""


def test_without_the_extra_nothing_traces_and_jobs_run(sqlite_database: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_OTEL, sqlite_database],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_broker_headers_carry_the_trace_context() -> None:
    """Every broker adapter writes and reads its metadata through one ``Meta`` (AMQP
    headers, NATS headers, Redis fields); Pub/Sub turns it into message attributes."""
    from jobfence.core.jobs import OutgoingJob
    from jobfence.transports._broker import Meta
    from jobfence.transports.pubsub.attributes import attributes, read_meta

    context = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 vendor=x"
    job = OutgoingJob("q", "j", b"{}", trace_context=context)
    headers = Meta.new(job).headers()
    assert headers["traceparent"] == context.split(" ")[0]
    assert headers["tracestate"] == "vendor=x"
    read = Meta.read({k: v.encode() for k, v in headers.items()})
    assert read.delivery("q", b"{}", 1, token=None, ref=None).trace_context == context
    assert read_meta(attributes(Meta.new(job)), "j").trace_context == context
    assert "traceparent" not in Meta.new(OutgoingJob("q", "j", b"{}")).headers()


async def test_group_commit_gives_each_job_its_own_process_span(
    pg_database: str, spans: InMemorySpanExporter
) -> None:
    """Jobs committed together (``batch_size``) stay in their own traces: one ``process``
    span per job, a child of that job's ``send``; a failed one's retry is in its trace."""
    app = App(pg_database)
    txids: dict[str, int] = {}

    @app.consumer("q", retry=DEMO_POLICY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        (txid,) = await tx.fetchone("SELECT txid_current()") or (0,)
        txids.setdefault(job.job_id, int(txid))
        if job.job_id == "b" and job.attempt == 1:
            raise TemporaryError("flaky")

    roots = {}
    async with app:
        for job_id in ("a", "b", "c"):
            with test_tracer.start_as_current_span(f"make {job_id}") as root:
                await app.enqueue("q", {}, job_id=job_id)
            roots[job_id] = root.get_span_context().trace_id
        async with RunningWorker(app, concurrency=1, batch_size=3) as worker:
            await eventually(lambda: worker.stats.handled >= 4, what="three jobs and a retry")
    assert len({txids["a"], txids["b"], txids["c"]}) == 1  # one transaction for the three
    for job_id, trace_id in roots.items():
        found = in_trace(spans, trace_id)
        (send,) = named(found, "send q")
        processes = named(found, "process q")
        assert processes, job_id
        assert {parent_of(p) for p in processes} == {send.context.span_id}
        assert {p.attributes["jobfence.job_id"] for p in processes} == {job_id}
    (retry,) = named(in_trace(spans, roots["b"]), "retry q")
    assert retry.attributes["jobfence.job_id"] == "b"


API_ONLY = """
import asyncio, sys
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
import jobfence.tracing as t
from jobfence import App
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
async def main():
    app = App(sys.argv[1], auto_migrate=True)
    done = []
    @app.consumer("first")
    async def first(job, tx):
        await app.enqueue("second", {}, job_id="j2", connection=tx)
    @app.consumer("second")
    async def second(job, tx):
        done.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
    async with app:
        token = context.attach(TraceContextTextMapPropagator().extract({"traceparent": PARENT}))
        await app.enqueue("first", {}, job_id="j1")
        context.detach(token)
        worker = app.worker(poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        for _ in range(400):
            if done:
                break
            await asyncio.sleep(0.05)
        worker.request_stop()
        await task
    assert done == [PARENT.split("-")[1]], done
    assert not t.get().live
asyncio.run(main())
print("ok")
"""


def test_with_the_api_and_no_sdk_the_context_is_passed_on(sqlite_database: str) -> None:
    """No SDK: no spans are made, but a job enqueued inside a trace carries it, and a job its
    handler enqueues carries it on (what the API's no-op spans would do, for less)."""
    result = subprocess.run(
        [sys.executable, "-c", API_ONLY, sqlite_database],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


async def test_a_request_still_in_flight_is_marked_on_its_span(
    pg_database: str, spans: InMemorySpanExporter
) -> None:
    """A second request with the key of one still running gets 409, and its span says
    ``in_flight``."""
    import asyncio

    app = App(pg_database, auto_migrate=True)
    release = asyncio.Event()
    entered = asyncio.Event()
    api = FastAPI()

    @api.post("/slow")
    async def slow() -> dict[str, str]:
        entered.set()
        await release.wait()
        return {"ok": "yes"}

    asgi = IdempotencyMiddleware(api, database=lambda: app.db)
    async with (
        app,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as client,
    ):
        headers = {"idempotency-key": "key-9"}
        with test_tracer.start_as_current_span("client") as root:
            first = asyncio.create_task(client.post("/slow", json={}, headers=headers))
            await asyncio.wait_for(entered.wait(), timeout=30)
            second = await client.post("/slow", json={}, headers=headers)
            release.set()
            assert (await first).status_code == 200
    assert second.status_code == 409
    found = named(in_trace(spans, root.get_span_context().trace_id), "idempotency POST")
    by_outcome = {s.attributes["jobfence.idempotency.outcome"]: s for s in found}
    assert set(by_outcome) == {"executed", "in_flight"}
    assert by_outcome["in_flight"].attributes["jobfence.idempotency.in_flight"] is True
    assert by_outcome["in_flight"].kind is SpanKind.INTERNAL  # the client's span was current


def test_the_cli_logging_puts_the_ids_in_json_lines(
    spans: InMemorySpanExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    """``jobfence … --log-format json`` (logs.configure) adds trace_id and span_id."""
    import json

    from jobfence import logs

    touched = [logging.getLogger(name) for name in ("jobfence", *logs.FOREIGN_LOGGERS)]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in touched]
    try:
        logs.configure("INFO", "json")
        with test_tracer.start_as_current_span("work") as span:
            logging.getLogger("jobfence.test").info("inside")
        logging.getLogger("jobfence.test").info("outside")
    finally:
        for lg, (handlers, level, propagate) in zip(touched, saved, strict=True):
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
    inside, outside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(span.get_span_context().span_id, "016x")
    assert "trace_id" not in outside


async def test_a_recorded_call_is_a_span_under_its_jobs_with_the_key(
    sqlite_database: str, spans: InMemorySpanExporter
) -> None:
    """``job.call`` (jobfence.calls): a ``call <step>`` span, a child of the job's
    ``process`` span, with the step, its idempotency key and how it ended."""
    from jobfence.calls import default_key

    app = App(sqlite_database)
    answers: list[Any] = []

    async def send(key: str) -> dict[str, str]:
        return {"reference": "PO-1"}

    @app.consumer("q", retry=DEMO_POLICY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        answers.append(await job.call("erp.create", send))

    async with app:
        with test_tracer.start_as_current_span("make") as root:
            await app.enqueue("q", {}, job_id="j1")
        async with RunningWorker(app, poll_interval=0.05):
            await eventually(lambda: answers, what="the call")
    found = in_trace(spans, root.get_span_context().trace_id)
    (process,) = named(found, "process q")
    (call,) = named(found, "call erp.create")
    assert parent_of(call) == process.context.span_id
    assert call.kind is SpanKind.CLIENT
    assert call.attributes["jobfence.call.step"] == "erp.create"
    assert call.attributes["jobfence.call.key"] == default_key("j1", "erp.create")
    assert call.attributes["jobfence.call.outcome"] == "succeeded"
