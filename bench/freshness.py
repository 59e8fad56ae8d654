"""Freshness of the running stack: how long from an item appearing in a demo feed, and
from its fetch, to its delivery; and how many Dagster runs that takes.

Runs the README's main command, `python3 dev.py up` (the Dagster UI, daemon and sensors
on the embedded SQLite default, beside the offline demo, whose feeds gain an item every
1 to 3 minutes), in a state folder of its own for --minutes, then stops it with Ctrl-C
and reads the records it left:

* appear -> delivered: a notification's ``sent_at`` less its listing's ``published_at``
  (the demo publishes item k at a moment drawn in its k-th period and lists it from then on);
* fetch -> delivered: ``sent_at`` less the first ``fetched_at`` of the item's raw row;
* both for the pushed items (the job board, which the demo site's WebSub hub pushes to
  ``pipeline serve``) beside the polled ones (the other feeds), in the same run;
* runs: Dagster's runs in the window, per job; the sensors' runs per day at that rate
  (scheduled runs come by their schedules: one in the window says nothing of a day).

Only items that appeared after the stack had delivered its first notification count (the
feeds' backlog at start is not freshness). The demo user then gains a filter matching
every job (``category:jobs``), so every pushed job counts, not one in four. Nothing is
timed by a test: this is a benchmark, and its figures depend on the machine's load; say
it with the figures.

    .venv/bin/python bench/freshness.py --minutes 8   # the venv python3 dev.py test made
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deliveries(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/deliveries.json", timeout=5) as r:
            return int(json.loads(r.read())["total"])
    except OSError:
        return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-freshness-") as tmp:
        state = Path(tmp)
        demo_port, ui_port, web_port = free_port(), free_port(), free_port()
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "DAGSTER_HOME", "PIPELINE_ALLOW_NETWORKS")}
        # The demo's first fetches bring its backlog at once: past PIPELINE_ALERT_LIMIT (20)
        # the rest of the first window goes out as one summary ten minutes in, which is
        # flood control, not freshness. Measured here is the steady flow, the limit lifted.
        env.update(PIPELINE_STATE_DIR=str(state), PIPELINE_DEMO_PORT=str(demo_port), PIPELINE_WEB_PORT=str(web_port),
                   PIPELINE_ALERT_LIMIT="1000000")
        log = (state / "dev-up.log").open("wb")
        process = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "up", "-p", str(ui_port)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        try:
            while deliveries(demo_port) == 0:
                if process.poll() is not None or time.monotonic() - started > 600:
                    raise SystemExit(f"no delivery; see {state / 'dev-up.log'}")
                time.sleep(2)
            # Every job, not one in four: the pushed sample is the job board's whole flow.
            subprocess.run([sys.executable, "-m", "pipeline.cli", "filters", "add", "demo", "--query", "category:jobs"],
                           cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            window_start = datetime.now(UTC)
            print(f"first delivery after {time.monotonic() - started:.0f} s; measuring {args.minutes:g} min",
                  flush=True)
            time.sleep(args.minutes * 60)
            window_end = datetime.now(UTC)
        finally:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(120)
            log.close()

        import sqlalchemy as sa

        sys.path.insert(0, str(ROOT))
        from pipeline.storage import db, schema

        engine = db.create_engine(f"sqlite:///{state / 'pipeline.db'}")
        n, listing, raw, pushed = schema.notifications, schema.listings, schema.listings_raw, schema.websub_subscriptions
        first_fetch = (
            sa.select(raw.c.source_id, raw.c.source_item_id, sa.func.min(raw.c.fetched_at).label("fetched_at"))
            .group_by(raw.c.source_id, raw.c.source_item_id).subquery()
        )
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(listing.c.published_at, first_fetch.c.fetched_at, n.c.sent_at,
                          (pushed.c.state == "active").label("pushed"))
                .join(listing, listing.c.id == n.c.listing_id)
                .join(first_fetch, sa.and_(first_fetch.c.source_id == listing.c.source_id,
                                           first_fetch.c.source_item_id == listing.c.source_item_id))
                .outerjoin(pushed, pushed.c.source_id == listing.c.source_id)
                .where(n.c.sent_at.is_not(None), listing.c.published_at >= window_start,
                       listing.c.published_at < window_end)
            ).all()
        engine.dispose()

        import dagster as dg

        os.environ["DAGSTER_HOME"] = str(state / "dagster")
        with dg.DagsterInstance.get() as instance:
            runs = [record.dagster_run for record in instance.get_run_records(
                filters=dg.RunsFilter(created_after=window_start, created_before=window_end))]
        by_job = Counter(run.job_name for run in runs)

    minutes = (window_end - window_start).total_seconds() / 60
    print(f"{len(rows)} items appeared and were delivered in {minutes:.1f} min")
    # Pushed (the job board, by the demo site's WebSub hub) beside polled (the other feeds).
    for label, chosen in (("all", rows), ("pushed", [r for r in rows if r.pushed]),
                          ("polled", [r for r in rows if not r.pushed])):
        if not chosen:
            continue
        appear = [(r.sent_at - r.published_at).total_seconds() for r in chosen]
        fetch = [(r.sent_at - r.fetched_at).total_seconds() for r in chosen]
        print(f"{label} ({len(chosen)} items):")
        print(f"  appear -> delivered: median {statistics.median(appear):.1f} s, p90 {percentile(appear, 90):.1f} s,"
              f" p95 {percentile(appear, 95):.1f} s, range {min(appear):.1f}-{max(appear):.1f} s")
        print(f"  fetch -> delivered:  median {statistics.median(fetch):.1f} s, p90 {percentile(fetch, 90):.1f} s,"
              f" p95 {percentile(fetch, 95):.1f} s, range {min(fetch):.1f}-{max(fetch):.1f} s")
    # Only the sensors' runs come at a rate the window can tell: a scheduled run (the hourly
    # health checks, the daily upkeep) comes by its schedule, once in a window or not at all.
    sensed = [run for run in runs if "dagster/sensor_name" in run.tags]
    print(f"runs: {len(runs)} in the window ({', '.join(f'{j} {c}' for j, c in sorted(by_job.items()))});"
          f" the sensors' {len(sensed)}, {len(sensed) / minutes * 60 * 24:,.0f} a day at that rate,"
          f" plus the scheduled ones (by their schedules, not extrapolated)")


if __name__ == "__main__":
    main()
