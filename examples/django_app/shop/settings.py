"""Settings of the example shop: one database, PostgreSQL (psycopg 3) or SQLite, from
``SHOP_DATABASE_URL`` (``postgresql://user@host:5432/name`` or ``sqlite:////abs/path.db``)."""

import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "example-only"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["jobfence.integrations.django", "shop"]

# the jobfence app of this project (`manage.py jobfence_worker` runs it)
JOBFENCE_APP = "shop.jobs:app"


def _database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # workers and the web process share the file: wait for the write lock, don't fail
        name = unquote(parts.path[1:])
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "OPTIONS": {"timeout": 30},
            # `manage.py test`: a file, not memory, so jobfence's connection sees it too
            "TEST": {"NAME": f"{name}.test"},
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": parts.port or "",
        # a worker runs many short jobs: keep its connections
        "CONN_MAX_AGE": 60,
    }


DATABASES = {"default": _database(os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db"))}
if os.environ.get("SHOP_SECOND_ALIAS"):
    # the tests' second alias of the same database: what a handler must not write through
    # (on SQLite it waits for the job's own write lock; on PostgreSQL it commits on its own,
    # outside the job's fence — docs/integrations/django.md)
    DATABASES["again"] = dict(DATABASES["default"])
    if DATABASES["again"]["ENGINE"].endswith("sqlite3"):
        DATABASES["again"]["OPTIONS"] = {"timeout": 2}
