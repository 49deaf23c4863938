"""``jobfence dead-letters stats``: the counts an operator looks at first — dead letters by
queue, category and status, and each queue's backlog (a queue no consumer serves shows)."""

from __future__ import annotations

import click
from rich.table import Table

from ..review import stats as counts
from ..review.deadletters import Actor
from .common import (
    console,
    database_option,
    dead_letters,
    default_actor,
    emit_json,
    json_option,
    opened_app,
    run,
)


@dead_letters.command("stats")
@database_option
@json_option
def stats(database_url: str | None, as_json: bool) -> None:
    """Dead letters by queue, category and status, and every queue's backlog: jobs waiting
    and running, the oldest waiting job's age, and (with --app) whether the app serves it."""

    async def go() -> counts.Stats:
        async with opened_app(database_url) as app:
            return await counts.stats(
                app.db,
                actor=Actor(default_actor(), "cli"),
                queue_db=app.transport.queue_db,
                served=app.consumed_queues,
            )

    found = run(go())
    if as_json:
        emit_json(
            {"letters": found.letters, "queue_depth": found.queue_depth, "queues": found.queues}
        )
        return
    table = Table(title="dead letters")
    for column in ("queue", "category", "status", "letters"):
        table.add_column(column)
    for row in found.letters:
        table.add_row(row["queue"], row["category"], row["status"], str(row["letters"]))
    console.print(table)
    if found.queues:
        known = any(q["served"] is not None for q in found.queues)
        backlog = Table(title="queues")
        columns = ["queue", "waiting", "running", "oldest waiting"] + ["served"] * known
        for column in columns:
            backlog.add_column(column, overflow="fold")
        for q in found.queues:
            cells = [q["queue"], str(q["waiting"]), str(q["running"]), _age(q["oldest_waiting_s"])]
            if known:
                cells.append("yes" if q["served"] else "NO - no consumer")
            backlog.add_row(*cells)
        console.print(backlog)
    if found.unserved:
        app_name = click.get_current_context().meta.get("jobfence.app", "the app")
        console.print(
            f"jobs wait on queue(s) no consumer of {app_name} serves: {', '.join(found.unserved)}",
            soft_wrap=True,
        )


def _age(seconds: float | None) -> str:
    """``42s``, ``5m 3s``, ``3h 12m``, ``2d 4h``; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // sub_size}{sub}"
    if whole >= 60:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole}s"
