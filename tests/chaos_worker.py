"""A worker process for the chaos tests: one stage's passes in a loop, as a deployment's
run workers would run them, until the stop file exists.

    python -m tests.chaos_worker collect|process|notify STOP_FILE

Settings come from the environment (DATABASE_URL, PIPELINE_*). A pass that fails (the
database went away) is logged and tried again a moment later, as a step retry would;
the supervisor may SIGKILL this process at any moment.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from pipeline.core.errors import PipelineError
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier
from pipeline.storage import db

log = logging.getLogger("chaos_worker")


def main(stage: str, stop: Path) -> int:
    logging.basicConfig(level=logging.WARNING, format=f"{stage}[{os.getpid()}] %(levelname)s %(message)s")
    settings = Settings.from_env()
    worker = f"chaos-{stage}:{socket.gethostname()}:{os.getpid()}"
    engine = db.create_engine(settings.database_url)
    passes = {
        "collect": lambda: Collector(engine, settings, worker).run(max_sources=50),
        "process": lambda: Processor(engine, settings, worker, batch_size=100).run(max_rows=500),
        "notify": lambda: Notifier(engine, settings, worker, match_batch=100, delivery_batch=8).run(
            max_listings=500, max_notifications=50),
    }
    while not stop.exists():
        try:
            stats = passes[stage]()
        except (sa.exc.SQLAlchemyError, PipelineError) as exc:  # the database restarting
            log.warning("pass failed, retrying: %s", str(exc).splitlines()[0])
            time.sleep(0.5)
            continue
        if not (stats.claimed or getattr(stats, "listings_matched", 0)):
            time.sleep(0.2)  # nothing to do right now
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
