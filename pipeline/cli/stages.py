"""`pipeline collect`, `process`, `notify`, `run --once` and `backfill`: one pass of a stage, or a backfill."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from pipeline.cli import common
from pipeline.core.errors import UserError
from pipeline.core.failures import FailureReason
from pipeline.core.inputs import WHEN_FORMATS, window
from pipeline.core.settings import Settings


def _collect(max_sources: int | None, concurrency: int | None) -> dict[str, Any]:
    from pipeline.fetching.collector import Collector

    settings = Settings.from_env()
    stats = Collector(common.engine(), settings, common.worker("collect")).run(
        max_sources=max_sources, concurrency=concurrency
    )
    blocked = stats.failed.get(FailureReason.BLOCKED_ADDRESS, 0)
    if blocked:
        # Said on stderr (--json output stays clean): otherwise a demo or a local feed
        # just goes quiet, backed off, with nothing saying why.
        allowed = ", ".join(settings.allow_networks) or "none"
        click.echo(
            f"pipeline: {blocked} sources were refused by the address guard (blocked_address):"
            " loopback, private and link-local addresses are fetched only from networks in"
            f" PIPELINE_ALLOW_NETWORKS (now: {allowed}); the demo's sources need"
            " PIPELINE_ALLOW_NETWORKS=127.0.0.1/32 (python3 dev.py up sets it), then"
            " `pipeline sources refresh ID...` to fetch them now",
            err=True,
        )
    return stats.as_dict()


def _process(max_rows: int | None) -> dict[str, Any]:
    from pipeline.listings.processor import Processor

    return Processor(common.engine(), Settings.from_env(), common.worker("process")).run(max_rows=max_rows).as_dict()


def _notify(max_rows: int | None) -> dict[str, Any]:
    from pipeline.notify.notifier import Notifier

    stats = Notifier(common.engine(), Settings.from_env(), common.worker("notify")).run(
        max_listings=max_rows, max_notifications=max_rows
    )
    return stats.as_dict()


def _say_collect(totals: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in sorted(totals["failed_by_reason"].items())) or "none"
    return (
        f"{totals['claimed']} sources claimed, {totals['fetched']} fetched"
        f" ({totals['not_modified']} unchanged), {totals['items_new']} new items; failed: {failed}"
    )


def _say_process(totals: dict[str, Any]) -> str:
    return (
        f"{totals['claimed']} raw rows: {totals['inserted']} new listings, {totals['updated']} updated,"
        f" {totals['unchanged']} unchanged, {totals['failed']} failed (to retry),"
        f" {totals['gave_up']} given up"
    )


def _say_notify(totals: dict[str, Any]) -> str:
    return (
        f"{totals['listings_matched']} listings matched, {totals['notifications_created']} notifications"
        f" created; {totals['sent']} sent, {totals['retrying']} to retry, {totals['dead']} dead"
    ) + (f"; {totals['filters_failed']} filters left out: they failed (`pipeline filters list` says why)"
         if totals["filters_failed"] else "")




@click.command("collect")
@click.option("--max-sources", type=click.IntRange(min=1), help="Claim at most this many sources.")
@click.option("--concurrency", type=click.IntRange(min=1),
              help="Fetches at once in this process; default: PIPELINE_CONCURRENCY.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def collect(max_sources: int | None, concurrency: int | None, as_json: bool) -> None:
    """One collector pass: fetch due sources until none is due or the cap is hit."""
    common.report(_collect(max_sources, concurrency), as_json, _say_collect)


@click.command("process")
@click.option("--max-rows", type=click.IntRange(min=1), help="Claim at most this many raw rows.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def process(max_rows: int | None, as_json: bool) -> None:
    """One processor pass: raw rows become listings until none is left or the cap is hit."""
    common.report(_process(max_rows), as_json, _say_process)


@click.command("notify")
@click.option("--max", "max_rows", type=click.IntRange(min=1),
              help="Match at most this many listings and deliver at most this many notifications.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def notify(max_rows: int | None, as_json: bool) -> None:
    """One notifier pass: match new listings against filters, deliver due notifications."""
    common.report(_notify(max_rows), as_json, _say_notify)


@click.command("run")
@click.option("--once", is_flag=True, required=True, help="One pass of each stage, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print each stage's totals as JSON.")
def run_once(once: bool, as_json: bool) -> None:
    """Collect, process and notify once, in this process (the Dagster UI runs them on
    their sensors instead)."""
    stages: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        ("collect", lambda: _collect(None, None), _say_collect),
        ("process", lambda: _process(None), _say_process),
        ("notify", lambda: _notify(None), _say_notify),
    ]
    for stage, run_stage, say in stages:
        totals = run_stage()
        click.echo(json.dumps({"stage": stage, **totals}) if as_json else f"{stage}: {say(totals)}")


_WHEN = click.DateTime(list(WHEN_FORMATS))


def _window(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    try:
        return window(since, until)
    except UserError as exc:
        raise click.BadParameter(f"--{exc}".replace(" until ", " --until ")) from None




@click.group("backfill", cls=common.HelpGroup)
def backfill_group() -> None:
    """Re-fetch, re-process or re-match on demand, as the Dagster backfill jobs do.

    Times are UTC. Nothing is ever notified twice: notifications are unique per user
    and listing.
    """


@backfill_group.command("reprocess")
@click.option("--since", type=_WHEN, required=True, help="Raw rows fetched at or after this time (UTC).")
@click.option("--until", type=_WHEN, help="...and before this time; default: now.")
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
def backfill_reprocess(since: datetime, until: datetime | None, as_json: bool) -> None:
    """Process again the raw rows fetched in a window (after a normaliser change)."""
    from pipeline.listings.processor import Processor, reopen_window

    start, end = _window(since, until)
    engine = common.engine()
    reopened = reopen_window(engine, start, end)  # then a pass, as the reprocess_window job does
    with common.progress(reopened, f"reprocessing {reopened:,} raw rows") as bar:
        stats = Processor(engine, Settings.from_env(), common.worker("backfill")).run(progress=bar.update)
    totals = {"reopened": reopened, **stats.as_dict()}
    common.report(totals, as_json, lambda t: f"{t['reopened']} reopened; {_say_process(t)}")


@backfill_group.command("rematch")
@click.option("--since", type=_WHEN, required=True, help="Listings that arrived at or after this time (UTC).")
@click.option("--until", type=_WHEN, help="...and before this time; default: now.")
@click.option("--any-age", is_flag=True, help="Also apply filters created after those listings arrived.")
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
def backfill_rematch(since: datetime, until: datetime | None, any_age: bool, as_json: bool) -> None:
    """Match again the listings that arrived in a window; new matches become pending
    notifications (the next `pipeline notify` sends them)."""
    from pipeline.notify.notifier import Notifier

    start, end = _window(since, until)
    notifier = Notifier(common.engine(), Settings.from_env(), common.worker("backfill"))
    total = notifier.count_window(start, end)
    with common.progress(total, f"re-matching {total:,} listings") as bar:
        created = notifier.rematch(start, end, any_age=any_age, progress=bar.update)
    common.report({"listings": total, "notifications_created": created}, as_json,
            lambda t: f"{t['listings']} listings matched again: {t['notifications_created']} new notifications")


@backfill_group.command("refetch")
@click.argument("source_ids", type=common.ID, nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the collector's totals as JSON.")
def backfill_refetch(source_ids: tuple[int, ...], as_json: bool) -> None:
    """Make the chosen sources due now and run a collector pass."""
    from pipeline.catalogue.sources import refetch_sources

    due, stats = refetch_sources(common.engine(), Settings.from_env(), source_ids, worker=common.worker("backfill"))
    skipped = sorted(set(source_ids) - set(due))
    if skipped:
        click.echo(f"not re-fetched (disabled): {skipped}", err=True)
    common.report(stats.as_dict(), as_json, _say_collect)
