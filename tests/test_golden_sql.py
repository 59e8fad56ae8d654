"""Every hot statement as a named artefact: each queue's claim, completion and lease
extension, rendered per dialect into pipeline/queue/sql/, each with the index that serves
it, and the collector's item storage on PostgreSQL. A change to the SQL fails here until the golden file is rewritten, so it is reviewed
as a diff of SQL. Rewrite them with:

    PIPELINE_WRITE_GOLDEN=1 .venv/bin/pytest tests/test_golden_sql.py

(tests/test_claim_plans.py checks on real data that the named indexes are used.)
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.backends.postgresql import PostgreSQL
from pipeline.fetching.collector import STORE_ITEMS
from pipeline.fetching.decide import SourceDecision
from pipeline.fetching.politeness import PoliteQueue
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import QueueSpec
from pipeline.storage import schema

GOLDEN = Path(__file__).resolve().parent.parent / "pipeline" / "queue" / "sql"
DIALECTS = {"postgresql": "postgresql+psycopg://", "sqlite": "sqlite://", "mariadb": "mysql+pymysql://"}
_T = datetime(2026, 1, 1, tzinfo=UTC)
# The columns each stage's completion sets (its usual case).
COMPLETES = {
    "sources.due": tuple(SourceDecision(_T, _T, 0).values()),  # a successful fetch
    "listings_raw.unprocessed": ("processed_at", "last_error"),
    "listings.unmatched": ("matched_at",),
    "notifications.due": ("status", "sent_at", "last_error"),  # a delivery sent
    "source_alerts.due": ("status", "sent_at", "last_error"),  # an owner's alert sent
    "websub_subscriptions.due": ("state", "requested_at", "due_at", "last_error"),  # a hub asked
}


def _serves(spec: QueueSpec, name: str, dialect: str) -> str:
    t = spec.table.name
    if name in ("claim_expired", "claim_free"):
        return (f"ix_{t}_{spec.name}_free (MariaDB: the pending columns and the lease lead it), a range;"
                " locking the rows taken, skipping those other claims hold")
    if name == "claim" and dialect == "mariadb":
        return f"pk_{t} (the ids the locking reads took, in the same transaction)"
    if name == "claim" and dialect == "postgresql" and spec.aged is not None:
        return (f"ix_{t}_{spec.name}_levels (the priorities in use, then each level's rows never leased, in"
                f" its order) and ix_{t}_{spec.name}_leased (expired leases, oldest first); the update by pk_{t}")
    if name == "claim":
        return (f"ix_{t}_{spec.name}_free (rows never leased, in the queue's order) and"
                f" ix_{t}_{spec.name}_leased (expired leases, oldest first); the update by pk_{t}")
    return f"pk_{t} (the ids held), fenced by claim_token and claimed_by"


def render(spec: QueueSpec, dialect: str, queue: WorkQueue, label: str = "") -> str:
    t = spec.table.name
    completes = COMPLETES[f"{t}.{spec.name}"]
    lines = [
        f"-- Queue {t}.{spec.name}{label} on {dialect}: the statements pipeline/queue/claim.py sends,",
        "-- rendered by tests/test_golden_sql.py (which fails when they change).",
    ]
    for name, statement in queue.statements(completes).items():
        what = f"{name} (sets {', '.join(completes)})" if name.startswith("complete") else name
        serves = _serves(spec, name, dialect)
        if label and name == "claim":
            serves += "; each group's fetches in flight counted over ix_sources_politeness_leased"
        compiled = "\n".join(
            line.rstrip() for line in str(statement.compile(dialect=queue.engine.dialect)).strip().splitlines()
        )
        lines += ["", f"-- {what}", f"-- served by {serves}", compiled + ";"]
    return "\n".join(lines) + "\n"


def cases() -> list[tuple[str, str, QueueSpec, bool]]:
    out = []
    for spec in schema.QUEUES:
        for dialect in DIALECTS:
            out.append((f"{spec.table.name}.{spec.name}.{dialect}.sql", dialect, spec, False))
    # The due-source claim with its politeness conditions; SQLite runs it as several
    # statements in Python (PoliteQueue._claim_in_steps), so only PostgreSQL has one.
    out.append(("sources.due.polite.postgresql.sql", "postgresql", schema.SOURCES_DUE, True))
    return out


@pytest.mark.parametrize(("file", "dialect", "spec", "polite"), cases(), ids=[c[0] for c in cases()])
def test_the_rendered_sql_matches_its_golden_file(file: str, dialect: str, spec: QueueSpec, polite: bool) -> None:
    engine = sa.create_engine(DIALECTS[dialect])  # never connects: the dialect compiles
    # The polite claim as the collector sends it: writing its sources' started events.
    queue = PoliteQueue(engine, record_started=True) if polite else WorkQueue(engine, spec)
    _check_golden(file, render(spec, dialect, queue, " (polite: per-host limits)" if polite else ""))


def _check_golden(file: str, text: str) -> None:
    path = GOLDEN / file
    if os.environ.get("PIPELINE_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} is missing: rewrite the golden files (see this module's docstring)"
    assert path.read_text(encoding="utf-8") == text, (
        f"the SQL of {file} changed: review the difference, then rewrite the golden files"
        " (see this module's docstring)"
    )


STORE_FILE = "listings_raw.store.postgresql.sql"


def test_the_item_store_statement_matches_its_golden_file() -> None:
    """The collector's item storage on PostgreSQL: one statement per batch."""
    sql, *_ = PostgreSQL.store_statement(STORE_ITEMS, sa.create_engine(DIALECTS["postgresql"]).dialect)
    text = "\n".join([
        "-- The collector's item storage on postgresql (pipeline/fetching/collector.py store_items):",
        "-- the statement pipeline/backends/postgresql.py store_changed sends, rendered by",
        "-- tests/test_golden_sql.py (which fails when it changes). The batch's items are one",
        "-- JSON array of arrays, %(rows)s.",
        "-- served by pk_source_items (source_id, source_item_id), the ON CONFLICT target;",
        "-- listings_raw takes plain inserts.",
        sql + ";",
    ]) + "\n"
    _check_golden(STORE_FILE, text)


def test_every_golden_file_is_rendered() -> None:
    """No stale golden file is left for a queue or dialect that no longer exists."""
    assert sorted(p.name for p in GOLDEN.glob("*.sql")) == sorted([*(c[0] for c in cases()), STORE_FILE])
