"""Where the databases differ for the claim queues: which claim ``Strategy`` a database
gets
and PostgreSQL's own path, a statement as psycopg runs it (``DriverStatement``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg

from pipeline.backends.mariadb import MARIADB

log = logging.getLogger(__name__)


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


class Strategy(Enum):
    POSTGRES = "postgres"  # one CTE round trip with FOR UPDATE SKIP LOCKED
    SQLITE = "sqlite"  # one UPDATE ... RETURNING under BEGIN IMMEDIATE
    PORTABLE = "portable"  # read candidates, then one guarded UPDATE per row
    # A short transaction: SELECT ... FOR UPDATE SKIP LOCKED, an UPDATE of exactly the
    # ids it locked, a read-back (MariaDB has SKIP LOCKED but no UPDATE ... RETURNING).
    MARIADB = "mariadb"

    @property
    def one_statement(self) -> bool:
        """The claim is one statement that locks the rows it takes and skips those other
        claims hold (PostgreSQL's ``FOR UPDATE SKIP LOCKED`` in CTEs); elsewhere a claim
        that must read what it decides on (the polite claim) is a few statements in one
        transaction."""
        return self is Strategy.POSTGRES

    @property
    def update_returns_rows(self) -> bool:
        """``UPDATE ... RETURNING`` hands back the rows it changed (PostgreSQL, SQLite);
        elsewhere they are read back by their new claim token."""
        return self in (Strategy.POSTGRES, Strategy.SQLITE)


def strategy_for(dialect_name: str) -> Strategy:
    if dialect_name == "postgresql":
        return Strategy.POSTGRES
    if dialect_name == "sqlite":
        return Strategy.SQLITE
    if dialect_name in MARIADB:
        return Strategy.MARIADB
    return Strategy.PORTABLE
