"""What vulture takes for dead code and is not (tests/test_layout.py runs it over the
product with this file, settings in pyproject.toml's [tool.vulture]). Each name here is
read where vulture cannot see it; one added here says why. Never executed."""

# ruff: noqa: B018 (each line names what it keeps alive, and does nothing else)
from hypercorn.config import Config

from pipeline.listings.processor import ProcessStats
from pipeline.core import secret_files
from pipeline.notify import operator
from pipeline.notify.notifier import NotifyStats
from pipeline.queue.claim import WorkQueue
from pipeline.queue.heartbeat import Heartbeat
from pipeline.storage import schema
from pipeline.web.after_push import AfterPush

# A stage's counts: reported whole (dataclasses.asdict) as its pass's metadata, the
# CLI's output and the logs.
ProcessStats.gave_up, ProcessStats.clustered
NotifyStats.notifications_created, NotifyStats.digests_made, NotifyStats.digests_sent
NotifyStats.channels_gone, NotifyStats.filters_failed
NotifyStats.source_alerts_sent, NotifyStats.source_alerts_retrying, NotifyStats.source_alerts_dead

_ = None  # an attribute of no object in particular

# The columns a queue's claim returns, typed per queue (pipeline/storage/rows.py): read
# by key, row["raw_json"].
_.raw_json, _.secret_since

# Settings a library reads: the sqlite3 module's, Hypercorn's.
_.isolation_level
Config.keep_alive_timeout, Config.read_timeout, Config.accesslog, Config.errorlog, Config.wsgi_max_body_size

# The operator's events: their one home; the CLI names two in its choices and
# tests/test_alerts.py checks they agree.
operator.MESSAGE, operator.TEST, operator.STACK_RESTARTED

# Read by the tests: what a queue would send (tests/test_golden_sql.py), the extensions a
# heartbeat sent, a push service's rounds, the tables a claim takes from.
WorkQueue.statements, Heartbeat.beats, AfterPush.rounds, schema.CLAIMABLE_TABLES
# Where the Compose stack mounts the secrets: tests/test_docker_files.py checks deploy/ agrees.
secret_files.MOUNT
