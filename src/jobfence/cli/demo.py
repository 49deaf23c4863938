"""``jobfence demo`` and ``jobfence demo purchase-orders``: the reference applications."""

from __future__ import annotations

import click

from ..errors import require_extra
from .common import (
    console,
    main_group,
    run,
    transport_option,
)


@main_group.group(invoke_without_command=True)
@click.option(
    "--database-url",
    default=None,
    help="Run on this database instead of a temporary SQLite file (the demo creates its own "
    "tables there; $JOBFENCE_DATABASE_URL is ignored on purpose).",
)
@click.option(
    "--jobs",
    type=click.IntRange(10, 100_000),
    default=300,
    show_default=True,
    help="Distinct credit jobs (duplicates and failures come on top).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 200),
    default=16,
    show_default=True,
    help="Jobs the demo's worker processes at once.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary SQLite file and print its path.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="CRITICAL",
    show_default=True,
    help="Worker logs during the demo (the summary reports every outcome anyway).",
)
@click.pass_context
def demo(
    ctx: click.Context,
    database_url: str | None,
    jobs: int,
    concurrency: int,
    keep: bool,
    log_level: str,
) -> None:
    """Run the points-crediting demo (no server needed) and check its ledger.

    Without --database-url it runs on a temporary SQLite file, ignoring
    $JOBFENCE_DATABASE_URL so the demo never touches a real database by accident.

    `jobfence demo purchase-orders` runs the purchase-order service end to end instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from jobfence_examples.points import run_demo

    from .. import logs

    logs.configure(log_level)
    ok = run(run_demo(database_url, jobs=jobs, concurrency=concurrency, keep=keep, console=console))
    if not ok:
        raise SystemExit(1)


@demo.command("purchase-orders")
@click.option(
    "--database-url",
    default=None,
    help="A PostgreSQL database the demo may use (default: a temporary database created on "
    "postgresql://postgres@127.0.0.1:5432 and dropped afterwards).",
)
@click.option(
    "--posts",
    type=click.IntRange(20, 100_000),
    default=300,
    show_default=True,
    help="Distinct purchase-order POSTs (repeats come on top).",
)
@click.option(
    "--repeat-keys",
    type=click.FloatRange(0, 0.9),
    default=0.2,
    show_default=True,
    help="Share of POSTs that repeat an earlier idempotency key (client retries).",
)
@click.option(
    "--repeat-references",
    type=click.FloatRange(0, 0.5),
    default=0.05,
    show_default=True,
    help="Share of POSTs that resend an already received document (new key).",
)
@click.option(
    "--transient",
    type=click.FloatRange(0, 0.9),
    default=0.1,
    show_default=True,
    help="Share of ERP calls failing transiently (503, 500 after creating, timeouts).",
)
@click.option(
    "--functional",
    type=click.FloatRange(0, 1),
    default=0.02,
    show_default=True,
    help="Share of requests the ERP rejects functionally (400) until the operator's fix.",
)
@click.option(
    "--erp-deduplication/--no-erp-deduplication",
    default=False,
    show_default=True,
    help="Whether the ERP stand-in de-duplicates creates by requestId; off, only the call "
    "ledger (job.call with a reconcile) stands between a timeout and a second order.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary database and print its URL.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="CRITICAL",
    show_default=True,
    help="Logs of the demo's services (the summary reports every outcome anyway).",
)
@transport_option
def demo_purchase_orders(
    database_url: str | None,
    posts: int,
    repeat_keys: float,
    repeat_references: float,
    transient: float,
    functional: float,
    erp_deduplication: bool,
    keep: bool,
    log_level: str,
    transport: str | None,
) -> None:
    """Run the purchase-order service end to end on loopback and prove no double order.

    Starts PostgreSQL database, ERP stand-in (its own process), API, worker and relay; sends
    POSTs with repeated keys and documents while the ERP fails (and, by default, does not
    de-duplicate); retries the failed requests as an operator; prints a summary with its
    checks, and how many ERP calls were in doubt and how each was resolved.
    """
    require_extra("ops", "jobfence demo purchase-orders", "fastapi", "uvicorn")
    from jobfence_examples.purchase_orders.demo import Scenario, run_demo

    from .. import logs

    logs.configure(log_level)
    scenario = Scenario(
        posts=posts,
        repeat_key_share=repeat_keys,
        repeat_reference_share=repeat_references,
        transient_share=transient,
        functional_share=functional,
        transport=transport,
        erp_deduplication=erp_deduplication,
    )
    ok = run(run_demo(database_url, scenario, keep=keep, console=console))
    if not ok:
        raise SystemExit(1)
