"""What ``manage.py jobfence …`` and ``manage.py jobfence_worker`` share: the ``jobfence``
command line, run inside the Django project (settings loaded, apps ready), on the project's
app (``settings.JOBFENCE_APP``)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, handle_default_options
from django.db import connections


class JobfenceCommand(BaseCommand):  # type: ignore[misc]
    """Django's own options (``--settings``, ``--pythonpath``…) are Django's; every other
    argument goes to the ``jobfence`` command line."""

    def run_from_argv(self, argv: list[str]) -> None:
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

    def jobfence(self, args: list[str]) -> None:
        """``jobfence ARGS``, with ``JOBFENCE_APP`` from the settings unless the environment
        names one."""
        from jobfence.cli import main

        spec = getattr(settings, "JOBFENCE_APP", None)
        if spec and not os.environ.get("JOBFENCE_APP"):
            os.environ["JOBFENCE_APP"] = str(spec)
        main(args)
