"""The ``jobfence`` command line: one root group, one module per command group.

Every command takes ``--database-url`` (or ``$JOBFENCE_DATABASE_URL``). Bad flags, bad URLs
and unreachable databases are reported in one line, never with a traceback.
"""

from __future__ import annotations

import click

from ..errors import JobfenceError
from . import (  # noqa: F401  (they add their commands)
    calls,
    deadletters,
    demo,
    jobctl,
    jobs,
    operations,
    outbox,
    schedules,
    stats,
)
from .common import NotConfirmed, err_console, main_group

__all__ = ["main", "main_group"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jobfence`` console script."""
    try:
        main_group.main(args=argv, prog_name="jobfence", standalone_mode=False)
    except NotConfirmed as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    except click.exceptions.Abort:
        err_console.print("aborted")
        raise SystemExit(130) from None
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        click.echo(f"jobfence: error: {exc.format_message()}{hint}", err=True)
        raise SystemExit(2) from None
    except click.ClickException as exc:
        click.echo(f"jobfence: error: {exc.format_message()}", err=True)
        raise SystemExit(exc.exit_code) from None
    except JobfenceError as exc:
        click.echo(f"jobfence: error: {exc}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
