"""The purchase-order path end to end (SPEC A2): 1 000 POSTs with 20 % repeated keys and 5 %
repeated external references while the ERP stand-in — which does not de-duplicate — fails 10 %
of calls transiently and 2 % of requests functionally; then an operator retries every failed
request."""

from __future__ import annotations

from collections import Counter

from jobfence_examples.purchase_orders.demo import Scenario, run_scenario


async def test_1000_posts_end_as_one_order_each_or_a_failed_request_with_its_dead_letter(
    pg_database: str,
) -> None:
    """Every accepted request ends as exactly one ERP order or as a failed request with its
    dead letter; the ERP's created-order count equals the completed requests (no double
    order); repeated keys get the original answer, repeated documents a 409 naming the
    request, never a 5xx; the operator's retry completes each failed request once."""
    scenario = Scenario(posts=1000)
    result = await run_scenario(pg_database, scenario)

    kinds = Counter(send.kind for send in result.sends)
    assert kinds == {"original": 750, "repeat": 200, "reference": 50}
    assert all(send.status < 500 and send.first_status < 500 for send in result.sends)
    # every original and every repeat ends 202 with its operation's single request
    for send in result.sends:
        if send.kind in ("original", "repeat"):
            assert send.status == 202
            assert send.body["requestId"] == result.request_of_op[send.op]
    replays = sum(1 for send in result.sends if send.replayed)
    assert replays == 200
    # repeated references: 409 naming an accepted request
    for send in result.sends:
        if send.kind == "reference":
            assert send.status == 409
            assert send.body["code"] == "DUPLICATE_DOCUMENT"
            assert send.body["existingRequestId"] in result.requests
    assert result.extras == {
        "no key": (400, "IDEMPOTENCY_KEY_MISSING"),
        "same key, other body": (409, "IDEMPOTENCY_KEY_MISMATCH"),
        "key of 256 characters": (400, "IDEMPOTENCY_KEY_MALFORMED"),
        "another partner, same key": (202, "RECEIVED"),
    }
    # 750 operations + the other partner's request
    assert len(result.requests) == 751
    states = Counter(row["state"] for row in result.requests.values())
    assert states == {"COMPLETED": 751}
    orders = result.erp_orders
    assert result.erp_stats["orders_created"] == 751
    assert set(orders) == set(result.requests)
    for request_id, row in result.requests.items():
        assert row["erp_order_id"] == orders[request_id]["OrderNumber"]
    # the functional failures: failed with a dead letter, retried by the operator once
    assert result.erp_stats["rejected_functional"] == len(result.retried) > 0
    assert set(result.retried.values()) == {202}
    for request_id in result.retried:
        assert result.requests[request_id]["operator_retries"] == 1
    retried_rows = [r for r in result.requests.values() if r["operator_retries"]]
    assert len(retried_rows) == len(result.retried)
    assert result.retry_refusals == [
        ("retry while running", 409, "RETRY_ALREADY_RUNNING"),
        ("retry of a completed request", 409, "REQUEST_NOT_RETRYABLE"),
    ]
    # transient failures happened and were absorbed without a second order, by an ERP that
    # does not de-duplicate (the default scenario): each doubt was looked up by its key
    assert result.erp_stats["unavailable"] > 0
    assert result.erp_stats["ambiguous"] + result.erp_stats["timeouts"] > 0
    assert (result.erp_stats["deduplicated"], result.erp_stats["duplicates"]) == (0, 0)
    assert result.reconciled["found"] >= result.erp_stats["ambiguous"] > 0
    assert result.reconciled.get("not_found", 0) > 0  # the 503s: sent again, same key
    assert "pending" not in result.ledger_states
    assert "in_doubt" not in result.ledger_states
    assert result.outbox_counts["PUBLISH_FAILED_RETRY"] == 0
    assert [name for name, ok, _ in result.checks if not ok] == []
