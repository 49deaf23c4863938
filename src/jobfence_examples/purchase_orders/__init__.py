"""The purchase-order reference service (SPEC A2, seed 004): HTTP POST with an idempotency key
→ request row + outbox event in one transaction → relay → consumer → ERP adapter (with an ERP
stand-in server) → request states → dead letters, and the operator retry.

PostgreSQL only. See ``README.md`` in this package and ``jobfence demo purchase-orders``.
"""

from .adapter import CallRetry, ErpClient, ErpOrder, ErpSettings
from .models import QUEUE, RETRYABLE, RUNNING, OrderEvent, PurchaseOrderRequest, State
from .service import PO_POLICY, PurchaseOrderService, dead_letter_attributes, migrate

__all__ = [
    "PO_POLICY",
    "QUEUE",
    "RETRYABLE",
    "RUNNING",
    "CallRetry",
    "ErpClient",
    "ErpOrder",
    "ErpSettings",
    "OrderEvent",
    "PurchaseOrderRequest",
    "PurchaseOrderService",
    "State",
    "dead_letter_attributes",
    "migrate",
]
