"""``manage.py jobfence COMMAND …``: any ``jobfence`` command inside the Django project, on
``settings.JOBFENCE_APP`` (``manage.py jobfence dead-letters list``, ``… relay``,
``… ops serve``); see ``jobfence --help``."""

from __future__ import annotations

from typing import Any

from ._cli import JobfenceCommand


class Command(JobfenceCommand):
    help = (
        "Run a `jobfence` command inside this project on settings.JOBFENCE_APP, e.g. "
        "`manage.py jobfence dead-letters list` (see `jobfence --help`)."
    )

    def handle(self, *args: str, **options: Any) -> None:
        self.jobfence(list(args))
