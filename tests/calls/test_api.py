"""``/v1/calls`` of the ops API on a real loopback server, both stores: viewers list and show,
operators settle; a partner-scoped token sees and settles only its partner's calls (404 for
another's); refusals are problem+json; the OpenAPI document describes the routes."""

from __future__ import annotations

from jobfence.calls import default_key

from ..deadletters.conftest import OpsServer, ops
from ..helpers import query, table
from .support import STEP, Orders
from .test_ledger import ledger_of

__all__ = ["ops"]  # the fixture


async def test_list_show_and_settle_with_roles_and_partner_scope(ops: OpsServer) -> None:
    url = ops.database_url
    orders = Orders(url)
    async with orders.app:
        await orders.park({"po-1": "acme", "po-2": "globex"})
    t = ops.tokens
    async with (
        ops.client(t.viewer) as vera,
        ops.client(t.operator) as otto,
        ops.client(t.partner_a) as acme,
        ops.client(t.partner_b_viewer) as globex,
    ):
        listed = (await vera.get("/v1/calls")).json()
        ids = {c["job_id"]: c["id"] for c in listed["items"]}
        mine = (await acme.get("/v1/calls")).json()
        shown = (await vera.get(f"/v1/calls/{ids['po-1']}")).json()
        hidden = await acme.get(f"/v1/calls/{ids['po-2']}")
        bad_state = await vera.get("/v1/calls", params={"state": "doubtful"})
        bad_age = await vera.get("/v1/calls", params={"older_than": -1})
        old = (await vera.get("/v1/calls", params={"older_than": 3600})).json()
        body = {"outcome": "applied", "reference": "PO-1", "reason": "found in the ERP"}
        as_viewer = await vera.post(f"/v1/calls/{ids['po-1']}/settle", json=body)
        as_scoped_viewer = await globex.post(f"/v1/calls/{ids['po-2']}/settle", json=body)
        other_partner = await acme.post(f"/v1/calls/{ids['po-2']}/settle", json=body)
        blank = await otto.post(f"/v1/calls/{ids['po-1']}/settle", json={**body, "reason": " "})
        no_ref = await otto.post(
            f"/v1/calls/{ids['po-1']}/settle", json={"outcome": "applied", "reason": "x"}
        )
        extra = await otto.post(f"/v1/calls/{ids['po-1']}/settle", json={**body, "force": True})
        settled = await acme.post(f"/v1/calls/{ids['po-1']}/settle", json=body)
        again = await otto.post(
            f"/v1/calls/{ids['po-1']}/settle", json={"outcome": "not_applied", "reason": "hm"}
        )
        missing = await vera.get("/v1/calls/999999")
        spec = (await vera.get("/openapi.json")).json()
    assert sorted(ids) == ["po-1", "po-2"]
    assert listed["next_cursor"] is None
    assert [c["job_id"] for c in mine["items"]] == ["po-1"]
    assert shown["key"] == default_key("po-1", STEP)
    assert shown["state"] == "in_doubt"
    assert shown["dead_letter_id"] is not None
    assert "read timeout" in shown["last_error"]
    assert hidden.status_code == 404
    assert hidden.headers["content-type"].startswith("application/problem+json")
    assert bad_state.status_code == 422
    assert "unknown call state 'doubtful'" in bad_state.json()["detail"]
    assert bad_age.status_code == 422
    assert old["items"] == []
    assert (as_viewer.status_code, as_scoped_viewer.status_code) == (403, 403)
    assert other_partner.status_code == 404
    assert (blank.status_code, no_ref.status_code, extra.status_code) == (422, 422, 422)
    assert "needs a reason" in blank.json()["detail"]
    assert "needs the downstream's reference" in no_ref.json()["detail"]
    assert settled.status_code == 200, settled.text
    done = settled.json()
    assert done["call"]["state"] == "applied"
    assert done["call"]["reference"] == "PO-1"
    assert done["call"]["settled_by"] == "acme-ops"
    assert done["replay"]["outcome"] == "published"
    assert done["replay"]["dead_letter_id"] == shown["dead_letter_id"]
    assert again.status_code == 409
    assert "already settled as applied by acme-ops" in again.json()["detail"]
    assert missing.status_code == 404
    assert {"/v1/calls", "/v1/calls/{call_id}", "/v1/calls/{call_id}/settle"} <= set(spec["paths"])
    # only po-2 is still in doubt; po-1's job is back in the queue
    still = await query(
        ledger_of(url), f"SELECT job_id, state FROM {table(url, 'calls')} ORDER BY job_id"
    )
    assert still == [("po-1", "applied"), ("po-2", "in_doubt")]
    assert await query(url, f"SELECT job_id FROM {table(url, 'jobs')}") == [("po-1",)]
