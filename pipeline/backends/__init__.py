"""The driver boundary: what differs between the databases, one module per database
behind one protocol (``Backend``), the portable strategy as the reference.

``backend_for(conn)`` gives the backend of a connection or engine: ``postgresql.py``
(one statement per batch, rows as one JSON parameter: ``recordset.py``), ``sqlite.py``
(ON CONFLICT, executemany run in-process), ``mariadb.py`` (INSERT IGNORE, ON DUPLICATE
KEY UPDATE, rows created apart from the transaction that adds to them), and for any
other database ``portable.py`` (plain statements, correct for one writer at a time).
``claiming_for(conn)`` gives the database's claim: ``claiming.py`` (the protocol and the
portable reference), ``claim_postgresql.py``, ``claim_sqlite.py``, ``claim_mariadb.py``.
Code outside this package, the claim queues (pipeline/queue/) and the migrations does
not ask which database it runs on: it asks its backend (tests/test_layout.py counts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import Connection, Dialect, Engine

from pipeline.backends.claim_mariadb import MariaDBClaim
from pipeline.backends.claim_postgresql import PostgreSQLClaim
from pipeline.backends.claim_sqlite import SQLiteClaim
from pipeline.backends.claiming import PortableClaim
from pipeline.backends.mariadb import MARIADB, MariaDB
from pipeline.backends.portable import Backend, Bind, Portable
from pipeline.backends.postgresql import PostgreSQL
from pipeline.backends.sqlite import SQLite

# By SQLAlchemy's dialect names.
_BACKENDS: dict[str, Backend] = {"postgresql": PostgreSQL(), "sqlite": SQLite(), **dict.fromkeys(MARIADB, MariaDB())}
_PORTABLE = Portable()
# Each database's claim (pipeline/backends/claiming.py).
_CLAIMS: dict[str, type[PortableClaim]] = {
    "postgresql": PostgreSQLClaim, "sqlite": SQLiteClaim, **dict.fromkeys(MARIADB, MariaDBClaim)}
T = TypeVar("T")


def backend_for(bind: Bind) -> Backend:
    """The backend of ``bind`` (a connection, an engine or a dialect)."""
    return backend_named(_name(bind))


def backend_named(name: str) -> Backend:
    """The backend of the database SQLAlchemy names ``name`` (a URL's backend name)."""
    return _BACKENDS.get(name, _PORTABLE)


def claiming_for(bind: Bind) -> type[PortableClaim]:
    """How the database of ``bind`` claims a queue's rows (made once per queue)."""
    return _CLAIMS.get(_name(bind), PortableClaim)


def _name(bind: Bind) -> str:
    """SQLAlchemy's name of the database of ``bind``."""
    return (bind if isinstance(bind, Dialect) else bind.dialect).name


def in_transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
    """``work`` in a transaction of its own, run again where the database broke a
    deadlock by rolling it back (MariaDB); ``work`` must be safe to run again."""
    return backend_for(engine).in_transaction(engine, work)


__all__ = ["Backend", "backend_for", "backend_named", "claiming_for", "in_transaction"]
