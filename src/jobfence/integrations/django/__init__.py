"""jobfence in a Django project (``pip install 'jobfence[django]'``; Django ≥ 4.2, PostgreSQL
with psycopg 3, or SQLite). Add ``"jobfence.integrations.django"`` to ``INSTALLED_APPS``.

- :class:`DjangoApp` takes its database from ``DATABASES``; its ``def`` handlers run inside
  ``transaction.atomic()`` on Django's connection with the job's fence in the same
  transaction, so ORM writes and the fence commit or roll back together.
- ``app.enqueue_sync(...)`` and ``app.write_event(...)`` write on Django's connection: inside
  the caller's ``atomic()`` block the job (or event) exists only if the block commits.
- ``manage.py migrate`` brings jobfence's tables up to date too; ``manage.py jobfence_worker``
  runs a worker. See docs/integrations/django.md.
"""

from __future__ import annotations

from ...errors import extra_needed

with extra_needed("django", "jobfence.integrations.django"):
    import django  # noqa: F401

from .app import DjangoApp, database_url
from .work import DjangoHost, DjangoTx

__all__ = ["DjangoApp", "DjangoHost", "DjangoTx", "database_url"]
