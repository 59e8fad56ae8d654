"""Where the databases differ for the claim queues: which claim ``Strategy`` a database
gets, "now" by whose clock (``sql_now``), MariaDB's deadlock retries (``in_transaction``)
and PostgreSQL's own path, a statement as psycopg runs it (``DriverStatement``).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

# SQLAlchemy's names of the MySQL family: MariaDB through a ``mysql+`` URL is "mysql".
MARIADB = ("mysql", "mariadb")
# InnoDB's "deadlock found" and "lock wait timeout": it rolled the transaction back.
_INNODB_ROLLED_BACK = (1213, 1205)
_TRIES = 8

T = TypeVar("T")


def in_transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
    """``work`` in a transaction of its own; on MariaDB, run again when InnoDB rolled it
    back to break a deadlock (up to 8 times, a few ms apart, doubling), as its manual
    asks of every application. Seen between claims and completions of due
    notifications: that queue's pending predicate is two ranges of its index, so a
    claim's locking read sorts what it found and holds every row it locked, not only
    those it returns, to its commit (tests/test_claim_concurrency.py). ``work`` must be
    safe to run again: everything it did was rolled back."""
    for attempt in range(_TRIES):
        try:
            with engine.begin() as conn:
                return work(conn)
        except sa.exc.OperationalError as exc:
            code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
            if engine.dialect.name not in MARIADB or code not in _INNODB_ROLLED_BACK or attempt == _TRIES - 1:
                raise
            log.debug("transaction rolled back by InnoDB (%s): run again", exc.orig)
            time.sleep(random.uniform(0.001, 0.005) * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class DriverStatement:
    """A statement as psycopg runs it (PostgreSQL's hot path): its SQL with PostgreSQL's
    own ``$n`` placeholders, the parameter each one takes (``order``), the values of its
    fixed parameters, and for a fenced write each set column's conversion (None when the
    driver takes the value as it is).

    ``$n`` placeholders make it a raw query (``psycopg.RawCursor``): psycopg parses a
    ``%(name)s`` statement's placeholders at every execution when the statement is over
    4 KB (its cache's limit), as the polite claim is: 3.8% of the collector's samples
    in a profile of its passes (bench/RESULTS.md, "The claim as a raw query")."""

    sql: str
    order: tuple[str, ...]
    fixed: dict[str, Any]
    convert: Mapping[str, Callable[[Any], Any] | None] = field(default_factory=dict)

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The values of ``$1``, ``$2`` ...: from ``params``, else the fixed ones."""
        fixed = self.fixed
        return [params[name] if name in params else fixed[name] for name in self.order]

    def execute(self, pg: Any, params: Mapping[str, Any]) -> Any:
        """Run on the psycopg connection ``pg`` (prepared on the server); its cursor."""
        return psycopg.RawCursor(pg).execute(self.sql, self.arguments(params), prepare=True)


# The placeholders of SQL compiled for psycopg (``%(name)s``) and its escaped percent sign.
_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")


def dollar_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's ``$n`` placeholders instead of psycopg's ``%(name)s``
    (a name used twice is one placeholder), and the name each ``$n`` stands for."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PYFORMAT.sub(number, sql), tuple(order)


def sql_now(
    type_: sa.types.TypeEngine[datetime], *, database_clock: bool, minus: timedelta = timedelta(0),
    bind: str | None = None,
) -> sa.ColumnElement[datetime]:
    """"Now" (less ``minus``) for SQL that compares with stored times (leases, due times,
    ages): the one rule. With ``database_clock`` (PostgreSQL) the database's own clock,
    the truth that hosts with skewed clocks share; otherwise (SQLite, whose file is on
    this host) this host's clock: the bound parameter ``bind``, whose value the caller
    gives at each execution of a statement built once, or else a literal of now."""
    if database_clock:
        now = sa.func.now(type_=type_)
        return now if not minus else now - sa.literal(minus, sa.Interval())
    if bind is not None:
        return sa.bindparam(bind, type_=type_)
    return sa.literal(datetime.now(UTC) - minus, type_)


class Strategy(Enum):
    POSTGRES = "postgres"  # one CTE round trip with FOR UPDATE SKIP LOCKED
    SQLITE = "sqlite"  # one UPDATE ... RETURNING under BEGIN IMMEDIATE
    PORTABLE = "portable"  # read candidates, then one guarded UPDATE per row
    # A short transaction: SELECT ... FOR UPDATE SKIP LOCKED, an UPDATE of exactly the
    # ids it locked, a read-back (MariaDB has SKIP LOCKED but no UPDATE ... RETURNING).
    MARIADB = "mariadb"


def strategy_for(dialect_name: str) -> Strategy:
    if dialect_name == "postgresql":
        return Strategy.POSTGRES
    if dialect_name == "sqlite":
        return Strategy.SQLITE
    if dialect_name in MARIADB:
        return Strategy.MARIADB
    return Strategy.PORTABLE
