"""The purchase-order service on Google Pub/Sub (the broker of seed 004), on the emulator:
the whole path, and the DLQ topic ``nexus.purchase-orders.create.dlq`` an operator reads."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta

from rich.console import Console

from jobfence.transports.pubsub import PubSubTransport
from jobfence_examples.purchase_orders import QUEUE
from jobfence_examples.purchase_orders.demo import Scenario, print_summary, run_scenario

from ..contract.support import PUBSUB_HOST, pubsub_cleanup
from ..helpers import query


async def test_the_purchase_order_path_runs_on_pubsub_and_mirrors_dead_letters(
    pg_database: str,
) -> None:
    """200 POSTs, the ERP failing transiently and rejecting 10 % functionally, the queue on
    Pub/Sub: every check of the demo holds (no double order, each failed request retried by
    the operator once), and each dead letter is on the DLQ topic once, with the request,
    event and partner it belongs to (seed 004 §10.5)."""
    url = f"pubsub://jf-{uuid.uuid4().hex[:8]}?emulator={PUBSUB_HOST}&prefix=nexus"
    operators = PubSubTransport.from_url(url, lease=timedelta(seconds=30), worker_id="ops")
    await operators.open()
    try:
        names = await operators.declare(QUEUE)
        assert names.dlq_topic == "nexus.purchase-orders.create.dlq"
        reader = operators.subscription_path(f"{names.dlq_topic}.operators")
        await operators.subscriber.create_subscription(
            name=reader, topic=operators.topic_path(names.dlq_topic)
        )
        result = await run_scenario(
            pg_database, Scenario(posts=200, functional_share=0.1, transport=url)
        )
        on_dlq: list[dict[str, str]] = []
        while received := await operators._pull(f"{names.dlq_topic}.operators", 100, 1.0):
            on_dlq += [dict(r.message.attributes) for r in received]
            await operators._ack_ids(reader, [r.ack_id for r in received])
    finally:
        await operators.close()
        await pubsub_cleanup(url)

    assert [name for name, ok, _ in result.checks if not ok] == []
    assert len(result.retried) > 0
    assert set(result.retried.values()) == {202}
    letters = await query(
        pg_database,
        "SELECT job_id, payload, attempts, error_category, error_code FROM core.dead_letters "
        "WHERE queue = {p}",
        (QUEUE,),
    )
    assert len(letters) == len(result.retried)
    expected = set()
    for job_id, payload, attempts, category, code in letters:
        event = json.loads(bytes(payload))
        expected.add(
            (event["request_id"], job_id, event["partner_id"], str(attempts), category, code)
        )
    got = {
        (a["requestId"], a["eventId"], a["partnerId"], a["attempts"], a["error_category"],
         a["error_code"])
        for a in on_dlq
    }  # fmt: skip
    assert got == expected
    assert len(on_dlq) == len(expected)
    assert {(a["original_topic"], a["original_subscription"]) for a in on_dlq} == {
        ("nexus.purchase-orders.create", "nexus.purchase-orders.create.workers")
    }
    # the demo's summary explains the DLQ messages next to "no pending dead letter": each is
    # the letter of an event an operator retry replaced (issue 23)
    console = Console(record=True, width=400)
    print_summary(result, console)
    printed = console.export_text()
    summary = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in printed.splitlines()
        if line.count("│") == 3
    }
    assert summary["dead letters written (one per failed event)"] == str(len(on_dlq))
    assert summary["discarded: superseded by the operator's retry (a new event)"] == str(
        len(on_dlq)
    )
    assert summary["pending review: requests still failed (their current event)"] == "0"
    published = [k for k in summary if k.startswith("each also published once to the DLQ topic")]
    assert published == [
        "each also published once to the DLQ topic nexus.purchase-orders.create.dlq"
    ]
    assert "create your own subscription on it before the failures" in printed
    assert summary[published[0]] == str(len(on_dlq))


def test_demo_purchase_orders_takes_a_pubsub_transport() -> None:
    """`jobfence demo purchase-orders --transport pubsub://…` runs end to end on the emulator
    and every check of its summary holds."""
    url = f"pubsub://jf-{uuid.uuid4().hex[:8]}?emulator={PUBSUB_HOST}"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "jobfence.cli", "demo", "purchase-orders", "--posts", "40",
             "--transport", url],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        import asyncio

        asyncio.run(pubsub_cleanup(url))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "queue pubsub" in result.stdout
    assert "no double order; every request accounted for" in result.stdout
    assert result.stdout.count("│ ok │") == 9
