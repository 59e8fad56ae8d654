"""MariaDB's claim (10.6 or later): a short transaction (READ COMMITTED: mariadb.py
``engine_options``) that locks up to ``limit`` expired leases, then free rows, with
``SELECT ... FOR UPDATE SKIP LOCKED`` (each a range of the queue's index), reading their
columns and the database's clock, then leases exactly the ids it locked until that
clock + the lease. The locks hold to the commit, so no other claim can take or change
those rows in between: the same rows, once, as PostgreSQL's one statement. MariaDB has
no ``UPDATE ... RETURNING``: the rows come back as the lease left them (its columns set
here as the UPDATE sets them). "Now" is the database's clock, read in the transaction
that uses it, so workers on hosts with skewed clocks agree."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline.backends.claiming import PortableClaim, Row
from pipeline.backends.mariadb import MariaDB


class MariaDBClaim(PortableClaim):

    def time_params_in(self, conn: Connection, lease: timedelta) -> dict[str, Any]:
        """``claim_now`` and ``claim_until`` by the database's clock, read in ``conn``'s
        transaction."""
        now = conn.execute(sa.select(sa.func.utc_timestamp(sa.literal_column("6")))).scalar_one()
        now = now.replace(tzinfo=UTC)
        return {"claim_now": now, "claim_until": now + lease}

    def build_claim(self) -> sa.Update | sa.Select[Any]:
        """``UPDATE t SET <lease> WHERE id IN (:ids)``: the ids the locking reads took in
        the same transaction (``claim``)."""
        q = self.queue
        return (
            sa.update(q.table)
            .where(q.table.c.id.in_(sa.bindparam("claim_ids", expanding=True)))
            .values(q.lease_values())
        )

    def prepare(self, claim_stmt: sa.Update | sa.Select[Any]) -> None:
        super().prepare(claim_stmt)
        # The locking reads: each branch's rows (the columns a claim returns) and the
        # database's clock, which their own conditions read too.
        # Built once per kind of queue (``Built``).
        q = self.queue
        locking = q.built.driver.get("locking")
        if locking is None:
            clock = sa.func.utc_timestamp(sa.literal_column("6"), type_=self.time_type)
            expired, free = q.candidates(lock=True, now=clock)
            locking = q.built.driver["locking"] = (expired.with_only_columns(*q.columns, clock.label("claim_clock")),
                                                   free.with_only_columns(*q.columns, clock.label("claim_clock")))
        self.locking: tuple[sa.Select[Any], sa.Select[Any]] = locking

    def named(self) -> dict[str, sa.Executable]:
        expired, free = self.locking
        return {"claim_expired": expired, "claim_free": free, **super().named()}

    def claim(self, params: dict[str, Any], limit: int) -> Sequence[Row]:
        expired, free = self.locking
        claim_stmt = self.claim_stmt

        def lease(conn: Connection) -> tuple[list[dict[str, Any]], datetime | None]:
            rows = [dict(row) for row in conn.execute(expired, params).mappings()]
            if len(rows) < limit:
                rows += [dict(row) for row in conn.execute(free, {**params, "claim_limit": limit - len(rows)}).mappings()]
            if not rows:
                return [], None
            until = rows[0]["claim_clock"] + self.queue.lease
            conn.execute(claim_stmt, {**params, "claim_until": until, "claim_ids": [r["id"] for r in rows]})
            return rows, until

        rows, until = _MARIADB.in_transaction(self.queue.engine, lease)
        if not rows:
            return []
        leased = {"locked_until": until, "claimed_by": params["claim_worker"], "claim_token": params["claim_token"]}
        attempts = self.queue.attempts
        taken = []
        for row in rows:
            found = {name: value for name, value in row.items() if name != "claim_clock"}
            found.update({name: value for name, value in leased.items() if name in found})
            if attempts is not None:
                found[attempts] += 1
            taken.append(found)
        return taken


_MARIADB = MariaDB()
