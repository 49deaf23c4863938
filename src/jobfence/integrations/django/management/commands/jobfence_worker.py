"""``manage.py jobfence_worker [APP] [jobfence worker options]``: ``jobfence worker`` inside the
Django project (settings loaded, apps ready). APP defaults to ``settings.JOBFENCE_APP``; every
option of ``jobfence worker`` applies (``--queues``, ``--concurrency``, ``--metrics-port``…),
see ``jobfence worker --help``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, handle_default_options
from django.db import connections


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run a jobfence worker for APP (default: settings.JOBFENCE_APP, e.g. 'shop.jobs:app') "
        "until SIGTERM; takes every option of `jobfence worker` (see `jobfence worker --help`)."
    )

    def run_from_argv(self, argv: list[str]) -> None:
        """Django's options (``--settings``, ``--pythonpath``…) are Django's; every other
        argument goes to ``jobfence worker``."""
        self._called_from_command_line = True
        parser = self.create_parser(argv[0], argv[1])
        options, rest = parser.parse_known_args(argv[2:])
        handle_default_options(options)
        cmd_options = vars(options)
        cmd_options.pop("args", None)
        try:
            self.execute(*rest, **cmd_options)
        except CommandError as exc:
            self.stderr.write(f"{type(exc).__name__}: {exc}")
            raise SystemExit(exc.returncode) from None
        finally:
            connections.close_all()

    def handle(self, *args: str, **options: Any) -> None:
        from jobfence.cli import main

        rest = list(args)
        spec: str | None = getattr(settings, "JOBFENCE_APP", None)
        if rest and not rest[0].startswith("-"):
            spec = rest.pop(0)
        if not spec and not {"-h", "--help"} & set(rest):
            raise CommandError(
                "no jobfence app: set JOBFENCE_APP = 'yourproject.jobs:app' in settings, or "
                "pass it: manage.py jobfence_worker yourproject.jobs:app"
            )
        main(["worker", *([spec] if spec else []), *rest])
