"""SQLite's claim: ``UPDATE t SET <lease> WHERE id IN (<expired> UNION ALL <free> LIMIT n)
RETURNING ...``, one statement inside ``BEGIN IMMEDIATE`` (sqlite.py ``configure`` begins
every SQLite transaction so): SQLite serialises writers, so no row is claimed twice.
"Now" is this host's clock, the one the file's writers share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends.claiming import PortableClaim, Row


class SQLiteClaim(PortableClaim):

    @property
    def one_statement_engine(self) -> Engine:
        """The engine itself, not autocommit: a write that starts as a read can fail on a
        busy snapshot without waiting, where ``BEGIN IMMEDIATE`` waits for the lock."""
        return self.queue.engine

    def build_claim(self) -> sa.Update | sa.Select[Any]:
        q = self.queue
        return (
            sa.update(q.table)
            .where(q.table.c.id.in_(q.chosen_ids()))
            .values(q.lease_values())
            .returning(*q.columns)
        )

    def claim(self, params: dict[str, Any], limit: int) -> Sequence[Row]:
        with self.queue.engine.begin() as conn:
            return conn.execute(self.claim_stmt, params).mappings().all()
