"""The shop's own tests (`manage.py test shop`): Django's test database gets jobfence's tables
from `migrate`, so code that enqueues inside `atomic()` is tested as it runs in production."""

from django.db import connection
from django.test import TestCase

from .services import place_order


def queued() -> list[tuple[str, str]]:
    table = "core.jobs" if connection.vendor == "postgresql" else "core_jobs"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT queue, job_id FROM {table}")
        return [tuple(row) for row in cursor.fetchall()]


class PlaceOrderTests(TestCase):
    def test_an_order_enqueues_its_credit_job(self) -> None:
        order = place_order("m-1", 10)
        self.assertEqual(queued(), [("points.credit", f"order-{order}")])

    def test_a_failed_order_enqueues_nothing(self) -> None:
        with self.assertRaises(RuntimeError):
            place_order("m-1", 10, fail=True)
        self.assertEqual(queued(), [])
