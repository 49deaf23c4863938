"""Placing an order: the order row, its credit job and its outbox event in one transaction."""

from django.db import transaction

from .jobs import app
from .models import Order


def place_order(member_id: str, points: int, *, fail: bool = False) -> int:
    """The job and the event exist only if the order does: if this block raises, all three
    roll back together."""
    with transaction.atomic():
        order = Order.objects.create(member_id=member_id, points=points)
        app.enqueue_sync(
            "points.credit",
            {"member_id": member_id, "points": points},
            job_id=f"order-{order.pk}",
        )
        app.write_event("orders.placed", {"order": order.pk}, event_id=f"placed-{order.pk}")
        if fail:
            raise RuntimeError("payment declined")
    return int(order.pk)
