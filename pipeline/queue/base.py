"""What every claim queue's statements stand on (``QueueBase``): the queue's engine,
spec, lease and columns, and its database's way of claiming (``claiming``, from the
backends: pipeline/backends/claiming.py and one module per database), which also says
what "now" and the lease's end are there. The claim is pipeline/queue/claim.py, the
fenced writes pipeline/queue/fenced.py.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable
from datetime import datetime, timedelta
from typing import Any, Generic, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from pipeline.backends import claiming_for
from pipeline.backends.claiming import Built, ClaimQueue, PortableClaim
from pipeline.core.settings import DEFAULT_LEASE_SECONDS
from pipeline.queue.spec import QueueSpec, R


class QueueBase(Generic[R]):
    """A queue's engine, spec, lease and columns, and its database's claim; its claims
    hand out rows of type ``R`` (``row``)."""

    def __init__(
        self,
        engine: Engine,
        spec: QueueSpec,
        *,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        claiming: type[PortableClaim] | None = None,
        columns: Iterable[str] | None = None,
        row: type[R] | None = None,
    ) -> None:
        """``columns``: what a claim returns besides what the queue itself reads (``id``,
        the columns of its order, its attempts); every column when None. ``claiming``:
        the way to claim (a backend's; its database's when None). ``row``: the TypedDict
        of what a claim returns, whose keys must be those columns (ValueError names the
        difference)."""
        if lease_seconds < 1:
            raise ValueError(f"lease_seconds must be at least 1, got {lease_seconds}")
        self.engine = engine
        self.spec = spec
        self.lease = timedelta(seconds=lease_seconds)
        self.columns = self._returned(columns)
        names = tuple(c.name for c in self.columns)
        if row is not None:
            _check_row_type(row, spec, list(names))
        kind = claiming or claiming_for(engine)
        dialect = engine.dialect
        # The statements of this kind of queue, shared with every queue of its kind.
        self.built = built_for((type(self), kind, type(dialect), dialect.server_version_info, spec, names,
                                self._statement_key()))
        # The queue a claim reads: a WorkQueue (claim.py), the kind of queue there is.
        self.claiming = kind(cast("ClaimQueue", self))
        self._autocommit = self.claiming.autocommit
        self._one_statement = self.claiming.one_statement_engine
        # The fenced writes' statements, built once per set of columns (fenced.py), shared.
        self._fenced = self.built.fenced
        self._build_statements()

    def _statement_key(self) -> Hashable:
        """What else of this queue its statements depend on, beyond its class, its
        database's claim and dialect, its spec and its columns: a kind of queue whose
        statements read its own attributes says which (``PoliteQueue``: whether its
        claim records started events). Two queues with the same key share their
        statements (``built_for``)."""
        return ()

    def _build_statements(self) -> None:
        """What a kind of queue builds once, when it is made (``WorkQueue``: its claim)."""

    def _returned(self, columns: Iterable[str] | None) -> tuple[sa.Column[Any], ...]:
        t, spec = self.spec.table, self.spec
        if columns is None:
            return tuple(t.c)
        names = ["id", *(name for term in spec.order for name in term.names)]
        if spec.attempts is not None:
            names.append(spec.attempts.name)
        for name in columns:
            if name not in t.c:
                raise ValueError(f"{t.name} has no column {name!r} for a claim to return")
            names.append(name)
        return tuple(t.c[name] for name in dict.fromkeys(names))

    # -- what the database's claim reads (pipeline/backends/claiming.py ClaimQueue) ------

    @property
    def table(self) -> sa.Table:
        return self.spec.table

    @property
    def attempts(self) -> str | None:
        return self.spec.attempts.name if self.spec.attempts is not None else None

    # -- time ---------------------------------------------------------------------------

    def now(self) -> sa.ColumnElement[datetime]:
        """"Now" in this queue's statements: the database's clock, or the bound parameter
        ``claim_now``, set per execution (``_time_params``)."""
        return self.claiming.now()

    def _lease_until(self) -> sa.ColumnElement[datetime]:
        return self.claiming.lease_until()

    def _time_params(self, lease: timedelta) -> dict[str, Any]:
        return self.claiming.time_params(lease)

    def _time_params_in(self, conn: Connection) -> dict[str, Any]:
        """The time parameters of statements sent in ``conn``'s transaction: this host's
        clock, or on MariaDB the database's, read in that transaction."""
        return self.claiming.time_params_in(conn, self.lease)


@functools.lru_cache(maxsize=256)
def built_for(key: Hashable) -> Built:
    """The statements of the kind of queue ``key`` names (``QueueBase.__init__``): one
    ``Built`` a process, filled as each statement is first needed."""
    return Built()


def _check_row_type(row: type[Any], spec: QueueSpec, columns: list[str]) -> None:
    """ValueError unless the TypedDict ``row`` names exactly the ``columns`` a claim of
    ``spec`` returns: the type a stage reads its rows by is the rows it gets."""
    named = set(getattr(row, "__annotations__", {}))
    missing, extra = sorted(set(columns) - named), sorted(named - set(columns))
    if missing or extra:
        raise ValueError(
            f"{row.__name__} is not what a claim of {spec.table.name}.{spec.name} returns:"
            + (f" it lacks {', '.join(missing)}" if missing else "")
            + (";" if missing and extra else "")
            + (f" it has {', '.join(extra)}, which the claim does not return" if extra else "")
        )
