"""The command-line and environment reference of ``docs/configuration.md``, generated from
the command tree itself so that it cannot drift (``tests/test_configuration_doc.py`` fails
when the page and the commands disagree).

    python -m jobfence.cli.reference docs/configuration.md     # rewrite the generated part
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from . import main_group

BEGIN = "<!-- BEGIN GENERATED: python -m jobfence.cli.reference docs/configuration.md -->"
END = "<!-- END GENERATED -->"

#: environment variables read by code rather than by a flag: name → meaning
ENV_ONLY: dict[str, str] = {
    "JOBFENCE_BETTERSTACK_TOKEN": "BetterStack Uptime API token: turns the BetterStack alert "
    "sink on (workers and `jobfence alerts deliver`)",
    "JOBFENCE_BETTERSTACK_URL": "BetterStack incidents endpoint (default: the public API)",
    "JOBFENCE_BETTERSTACK_EMAIL": "`requester_email` of BetterStack incidents",
    "JOBFENCE_ALERT_WEBHOOK_URL": "turns the webhook alert sink on: alerts are POSTed here",
    "JOBFENCE_ALERT_WEBHOOK_TOKEN": "bearer token sent with webhook alerts",
    "PUBSUB_EMULATOR_HOST": "host:port of the Pub/Sub emulator for `pubsub://` transports "
    "(Google's own variable)",
    "COLUMNS": "width of the CLI's tables when set; without it, a table piped to another "
    "program is 160 columns wide (ids never wrap) and one on a terminal fits the terminal",
}


def commands() -> Iterator[tuple[str, click.Command]]:
    """Every command that runs, as ``(path, command)``, in order."""

    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, click.Command]]:
        if path and (not isinstance(cmd, click.Group) or cmd.invoke_without_command):
            yield " ".join(path), cmd
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])

    yield from walk(main_group, [])


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "off"
    value = param.default
    if type(value).__name__ == "Sentinel":  # click's "no default given"
        return "—"
    if value is None or callable(value):
        return "—" if value is None else "(computed)"
    return f"`{value}`"


def _usage(path: str, cmd: click.Command) -> str:
    args = " ".join(
        p.make_metavar(click.Context(cmd)) for p in cmd.params if isinstance(p, click.Argument)
    )
    return f"jobfence {path}" + (f" {args}" if args else "")


def environment() -> dict[str, list[str]]:
    """Each environment variable a flag reads → the commands whose flag reads it."""
    found: dict[str, list[str]] = {}
    for path, cmd in commands():
        for param in cmd.params:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
            for name in names:
                found.setdefault(name, []).append(path)
    return found


def render() -> str:
    lines = [BEGIN, "", "## Environment variables", ""]
    lines += ["| variable | read by |", "|---|---|"]
    for name, paths in sorted(environment().items()):
        lines.append(f"| `{name}` | " + ", ".join(f"`{p}`" for p in paths) + " |")
    for name, meaning in sorted(ENV_ONLY.items()):
        lines.append(f"| `{name}` | {_cell(meaning)} |")
    lines += ["", "## Commands and flags", ""]
    lines.append(
        "Every flag of every command, with the environment variable that sets it (a flag on the "
        "command line wins over its variable). Durations take one grammar everywhere: `250ms`, "
        "`30s`, `5m`, `12h`, `7d` or plain seconds."
    )
    for path, cmd in commands():
        summary = _cell((cmd.help or "").strip().split("\n\n")[0])
        lines += ["", f"### `{_usage(path, cmd)}`", "", summary, ""]
        rows = [p for p in cmd.params if isinstance(p, click.Option) and p.name != "help"]
        if not rows:
            continue
        lines += ["| flag | environment | default | meaning |", "|---|---|---|---|"]
        for opt in rows:
            flags = ", ".join(f"`{o}`" for o in [*opt.opts, *opt.secondary_opts])
            env = f"`{opt.envvar}`" if isinstance(opt.envvar, str) else ""
            lines.append(f"| {flags} | {env} | {_default(opt)} | {_cell(opt.help or '')} |")
    lines += ["", END]
    return "\n".join(lines)


def apply(page: str) -> str:
    """``page`` with its generated part replaced by :func:`render`."""
    if BEGIN not in page or END not in page:
        raise SystemExit(f"the page has no generated part ({BEGIN} … {END})")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + render() + tail


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    target = Path(sys.argv[1])
    target.write_text(apply(target.read_text(encoding="utf-8")), encoding="utf-8")
