"""``manage.py jobfence_worker [APP] [jobfence worker options]``: ``jobfence worker`` inside the
Django project (settings loaded, apps ready). APP defaults to ``settings.JOBFENCE_APP``; every
option of ``jobfence worker`` applies (``--queues``, ``--concurrency``, ``--metrics-port``…),
see ``jobfence worker --help``."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from ._cli import JobfenceCommand


class Command(JobfenceCommand):
    help = (
        "Run a jobfence worker for APP (default: settings.JOBFENCE_APP, e.g. 'shop.jobs:app') "
        "until SIGTERM; takes every option of `jobfence worker` (see `jobfence worker --help`)."
    )

    def handle(self, *args: str, **options: Any) -> None:
        rest = list(args)
        named = bool(rest) and not rest[0].startswith("-")
        if not (named or getattr(settings, "JOBFENCE_APP", None) or os.environ.get("JOBFENCE_APP")):
            raise CommandError(
                "no jobfence app: set JOBFENCE_APP = 'yourproject.jobs:app' in settings, or "
                "pass it: manage.py jobfence_worker yourproject.jobs:app"
            )
        self.jobfence(["worker", *rest])
