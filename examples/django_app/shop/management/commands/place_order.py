"""``manage.py place_order MEMBER POINTS [--fail]``: what the shop's checkout view would do."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from shop.services import place_order


class Command(BaseCommand):
    help = "Place an order (and enqueue its credit job) in one transaction."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("member")
        parser.add_argument("points", type=int)
        parser.add_argument("--fail", action="store_true", help="raise inside the transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            order = place_order(options["member"], options["points"], fail=options["fail"])
        except RuntimeError as exc:
            self.stderr.write(f"order not placed: {exc}")
            raise SystemExit(1) from None
        self.stdout.write(f"order {order} placed")
