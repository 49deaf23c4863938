"""The purchase-order API (jobfence_examples.purchase_orders) served by uvicorn for the HTTP
ingestion workload (runs in the project's virtualenv).

    python bench/systems/http_server.py URL

Migrates, creates one partner, prints ``{"ready": true, "port": …, "token": …}`` and serves on
127.0.0.1 until SIGTERM. Only the API runs (no worker, no relay): the workload measures the
POST — idempotency key claimed, request row and outbox event written in one transaction, the
response stored for replays. The ERP is never called on this path.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import uvicorn

from jobfence_examples.purchase_orders.adapter import ErpSettings
from jobfence_examples.purchase_orders.api import create_api
from jobfence_examples.purchase_orders.service import PurchaseOrderService, migrate


async def main(url: str) -> None:
    await migrate(url)
    service = PurchaseOrderService(url, erp=ErpSettings("http://127.0.0.1:9"))
    await service.open(pool_size=20)
    token = await service.create_partner("bench", "Bench partner")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            create_api(service, manage_service=False),
            log_level="critical",
            access_log=False,
            lifespan="on",
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn has no event for this)
        await asyncio.sleep(0.05)
    print(json.dumps({"ready": True, "port": sock.getsockname()[1], "token": token}), flush=True)
    await task
    await service.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
