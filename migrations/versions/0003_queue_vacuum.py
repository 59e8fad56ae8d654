"""Queue tables are vacuumed early (PostgreSQL): dead row versions from claims and
completions are reclaimed after 1% of a table changed, not PostgreSQL's default 20%.

Every claim and every completion writes a new version of each row it touches (neither is
a HOT update: the queues' partial indexes depend on the lease and state columns), so a
busy queue makes dead versions at twice its throughput. With the default scale factor a
table of a million sources waits for 200,000 of them before autovacuum looks; at 1% it
waits for 10,000, and the space is reused before the table and its indexes grow
(bench/scale.py measures both). Fillfactor is left at 100: it only helps HOT updates.
SQLite has no autovacuum settings; nothing changes there.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

QUEUE_TABLES = ("sources", "listings_raw", "listings", "notifications")
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    # Insert-mostly tables (raw rows, notifications) get their visibility map set early,
    # so the index-only scans of counts and claims stay index-only.
    "autovacuum_vacuum_insert_scale_factor": "0.05",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    options = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    for table in QUEUE_TABLES:
        op.execute(f"ALTER TABLE {table} SET ({options})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in QUEUE_TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")
