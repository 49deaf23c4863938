"""The Django app ``jobfence.integrations.django``: ``manage.py migrate`` also brings
jobfence's own tables up to date, and ``manage.py jobfence_worker`` runs a worker."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class JobfenceConfig(AppConfig):  # type: ignore[misc]
    name = "jobfence.integrations.django"
    label = "jobfence"
    verbose_name = "jobfence"

    def ready(self) -> None:
        post_migrate.connect(migrate_jobfence, sender=self, dispatch_uid="jobfence.migrate")


def migrate_jobfence(sender: Any, using: str = "default", verbosity: int = 1, **_: Any) -> None:
    """After ``manage.py migrate`` on jobfence's database (the test database too): apply
    jobfence's pending migrations, with its own bookkeeping and lock, as ``jobfence
    migrate`` would (``JOBFENCE_MIGRATE = False`` leaves that to ``jobfence migrate``)."""
    from django.conf import settings

    from .app import project_app, run_sync

    if not getattr(settings, "JOBFENCE_MIGRATE", True):
        return
    app = project_app()
    if app.using != using:
        return
    applied = run_sync(app.migrate())
    if verbosity >= 1 and applied:
        print(f"  jobfence: applied schema migrations {', '.join(map(str, applied))}")
