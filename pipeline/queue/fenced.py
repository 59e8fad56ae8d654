"""The fenced writes of a claim queue: complete (one set of values, or each row its own),
defer, release and extend. Each is fenced by the claim's token and worker: a worker
whose lease ran out and whose rows were claimed again changes nothing, and hears which
rows it lost (``Fenced.lost``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline.backends import in_transaction
from pipeline.queue.base import QueueBase
from pipeline.queue.spec import Claim, Fenced, R, RowCompletion

log = logging.getLogger(__name__)


class FencedWrites(QueueBase[R]):
    """A queue's fenced writes (``WorkQueue`` claims as well)."""

    def fenced_statement(self, columns: tuple[str, ...], *, extend: bool = False) -> sa.Update:
        """``UPDATE t SET ... WHERE id IN <ids> AND token AND worker RETURNING id``.

        One statement for the whole batch (the ids as the database's claim binds them:
        ``claiming.ids_in``). Completion and release set ``columns`` and clear the lease; extension
        moves ``locked_until`` only. Built once per kind.
        """
        key = (*columns, "+extend") if extend else columns
        stmt = self._fenced.get(key)
        if stmt is None:
            t = self.spec.table
            values: dict[str, Any]
            fence = [
                self.claiming.ids_in(t.c.id),
                t.c.claim_token == sa.bindparam("fence_token"),
                t.c.claimed_by == sa.bindparam("fence_worker"),
            ]
            if extend:
                # A lease that ran out is gone, even if nobody has claimed the row yet:
                # it may be counted as free work (or a free politeness slot) already.
                values = {"locked_until": self._lease_until()}
                fence.append(t.c.locked_until > self.now())
            else:
                values = {name: sa.bindparam(f"set_{name}", type_=t.c[name].type) for name in columns}
                values.update(locked_until=None, claimed_by=None, claim_token=None)
            stmt = sa.update(t).where(*fence).values(values)
            if self.engine.dialect.update_returning:
                stmt = stmt.returning(t.c.id)
            self._fenced[key] = stmt
        return stmt

    def _finish(
        self,
        conn: Connection | None,
        claim: Claim,
        ids: Sequence[int] | None,
        values: Mapping[str, Any],
        action: str,
        *,
        quiet: bool = False,
    ) -> Fenced:
        refuse_claim_columns(values, f"the {action} clears")
        if all(not isinstance(v, sa.ClauseElement) for v in values.values()):
            stmt = self.fenced_statement(tuple(sorted(values)))
            params = {f"set_{name}": value for name, value in values.items()}
        else:  # a SQL expression among the values: this statement is built as given
            stmt, params = self.fenced_statement(()).values(dict(values)), {}
        return self._run_fenced(conn, claim, ids, stmt, params, action, quiet=quiet)

    def _run_fenced(
        self,
        conn: Connection | None,
        claim: Claim,
        ids: Sequence[int] | None,
        stmt: sa.Update,
        params: dict[str, Any],
        action: str,
        *,
        quiet: bool = False,
    ) -> Fenced:
        wanted = list(claim.ids if ids is None else ids)
        if not wanted:
            return Fenced(done=[])
        params = {**params, "ids": wanted, "fence_token": claim.token, "fence_worker": claim.worker}
        done: Sequence[int]
        if not self.engine.dialect.update_returning:
            if conn is not None:
                done = self._fenced_locked(conn, stmt, params)
            else:
                done = in_transaction(self.engine, lambda own: self._fenced_locked(own, stmt, params))
        elif conn is not None:
            done = conn.execute(stmt, params).scalars().all()
        else:
            with self._one_statement.begin() as own:
                done = own.execute(stmt, params).scalars().all()
        return self._fenced_outcome(claim, wanted, done, action, quiet=quiet)

    def _fenced_locked(self, conn: Connection, stmt: sa.Update, params: dict[str, Any]) -> list[int]:
        """A fenced write where there is no ``UPDATE ... RETURNING`` (MariaDB): lock the
        rows the fence admits (``SELECT id ... FOR UPDATE``, the fence's own predicate),
        then run the write on exactly those ids. Held by this transaction, they cannot
        leave the fence in between; "now" (an extension's fence) is one value for both
        statements (on MariaDB, the database's)."""
        if "claim_now" in params:
            params = {**params, **self.claiming.time_params_in(conn, params["claim_until"] - params["claim_now"])}
        t = self.spec.table
        assert stmt.whereclause is not None
        done = list(conn.execute(sa.select(t.c.id).where(stmt.whereclause).with_for_update(), params).scalars())
        if done:
            conn.execute(stmt, {**params, "ids": done})
        return done

    def _fenced_outcome(
        self, claim: Claim, wanted: Sequence[int], done: Sequence[int], action: str, *, quiet: bool
    ) -> Fenced:
        lost = sorted(set(wanted) - set(done))
        if lost and not quiet:
            log.warning(
                "%s of %d %s row(s) by %s changed nothing: they are no longer held under"
                " this claim (lease expired and claimed again, or already finished;"
                " token %s, ids %s)",
                action,
                len(lost),
                self.spec.name,
                claim.worker,
                claim.token,
                lost[:20],
            )
        return Fenced(done=sorted(done), lost=lost)

    def complete(
        self,
        claim: Claim,
        values: Mapping[str, Any],
        *,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
    ) -> Fenced:
        """Finish claimed rows in one statement: clear the lease and write ``values``.

        ``values`` must take the rows out of the queue (e.g. set ``processed_at``).
        Pass ``conn`` to complete inside the transaction that writes the stage's
        results, and write results only for ``Fenced.done``: rows in ``Fenced.lost``
        belong to another worker now.
        """
        refuse_claim_columns(values, "the completion clears")  # before any statement is built
        wanted = list(claim.ids if ids is None else ids)
        if conn is None and wanted:
            done = self.claiming.complete_now(claim.token, claim.worker, wanted, values)
            if done is not None:  # sent in a round trip of its own (PostgreSQL's driver)
                return self._fenced_outcome(claim, wanted, done, "completion", quiet=False)
        return self._finish(conn, claim, ids, values, "completion")

    def complete_each(
        self, completions: Sequence[RowCompletion], *, conn: Connection
    ) -> Fenced:
        """Finish claimed rows that each take values of their own, fenced row by row.

        Rows may come from different claims. On PostgreSQL the rows that set the same
        columns go in one statement: ``UPDATE t SET c = v.c ... FROM
        jsonb_to_recordset(:rows) AS v(id, fence_token, fence_worker, c ...) WHERE t.id =
        v.id AND t.claim_token = v.fence_token AND t.claimed_by = v.fence_worker``, one
        bound JSON parameter whatever the batch size. Elsewhere, the fenced UPDATE of
        ``complete`` per row, in ``conn``'s transaction.
        """
        groups: dict[tuple[str, ...], list[RowCompletion]] = {}
        for completion in completions:
            if any(isinstance(v, sa.ClauseElement) for v in completion.values.values()):
                raise ValueError("complete_each takes plain values, not SQL expressions")
            refuse_claim_columns(completion.values, "the completion clears")
            groups.setdefault(tuple(sorted(completion.values)), []).append(completion)
        done: list[int] = []
        lost: list[int] = []
        for columns, group in groups.items():
            rows = [
                {"id": c.row_id, "fence_token": c.claim.token, "fence_worker": c.claim.worker, **c.values}
                for c in group
            ]
            changed = self.claiming.complete_rows(conn, columns, rows)
            if changed is None:
                changed = set()
                for c in group:
                    fenced = self._finish(conn, c.claim, [c.row_id], c.values, "completion",
                                          quiet=True)
                    changed.update(fenced.done)
            for c in group:
                (done if c.row_id in changed else lost).append(c.row_id)
        if lost:
            log.warning(
                "completion of %d %s row(s) changed nothing: they are no longer held under"
                " the claims that took them (lease expired and claimed again, or already"
                " finished; ids %s)", len(lost), self.spec.name, sorted(lost)[:20],
            )
        return Fenced(done=sorted(done), lost=sorted(lost))

    def defer_each(
        self, completions: Sequence[RowCompletion], *, seconds: int, conn: Connection
    ) -> Fenced:
        """Write each row's values and keep it out of every claim for ``seconds``: its lease
        is pushed to now + ``seconds`` under the same claim, so it is claimable again, by
        anyone, once that runs out (a retry later, e.g. a row that failed to process).
        One fenced UPDATE per row: deferrals are the exception, not the hot path."""
        done: list[int] = []
        lost: list[int] = []
        params = self._time_params(timedelta(seconds=seconds))
        for c in completions:
            refuse_claim_columns(c.values, "defer_each sets")
            columns = tuple(sorted(c.values))
            key = (*columns, "+defer")
            stmt = self._fenced.get(key)
            if stmt is None:
                t = self.spec.table
                values: dict[str, Any] = {
                    name: sa.bindparam(f"set_{name}", type_=t.c[name].type) for name in columns
                }
                # The extension's statement (it moves locked_until only), plus the values.
                stmt = self.fenced_statement((), extend=True).values(values)
                self._fenced[key] = stmt
            fenced = self._run_fenced(
                conn, c.claim, [c.row_id], stmt,
                {**params, **{f"set_{k}": v for k, v in c.values.items()}}, "deferral", quiet=True,
            )
            done.extend(fenced.done)
            lost.extend(fenced.lost)
        if lost:
            log.warning("deferral of %d %s row(s) changed nothing: no longer held (ids %s)",
                        len(lost), self.spec.name, sorted(lost)[:20])
        return Fenced(done=sorted(done), lost=sorted(lost))

    def release(
        self,
        claim: Claim,
        values: Mapping[str, Any] | None = None,
        *,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
    ) -> Fenced:
        """Give claimed rows back unfinished; they are claimable again at once."""
        return self._finish(conn, claim, ids, values or {}, "release")

    def extend(
        self,
        claim: Claim,
        *,
        seconds: int | None = None,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
        quiet: bool = False,
    ) -> Fenced:
        """Push the lease of still-owned rows to now + ``seconds`` (default: the lease).
        A row whose lease has already run out is not extended: it is lost."""
        lease = self.lease if seconds is None else timedelta(seconds=seconds)
        stmt = self.fenced_statement((), extend=True)
        return self._run_fenced(
            conn, claim, ids, stmt, self._time_params(lease), "lease extension", quiet=quiet
        )


def refuse_claim_columns(values: Mapping[str, Any], who: str) -> None:
    """ValueError when ``values`` would set the lease columns that ``who`` (e.g. "the
    completion clears") manages itself."""
    if "locked_until" in values or "claim_token" in values:
        raise ValueError(f"{who} the lease itself; do not set claim columns")
