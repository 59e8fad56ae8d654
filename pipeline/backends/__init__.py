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

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from pipeline.backends.claim_mariadb import MariaDBClaim
from pipeline.backends.claim_postgresql import PostgreSQLClaim
from pipeline.backends.claim_sqlite import SQLiteClaim
from pipeline.backends.claiming import PortableClaim
from pipeline.backends.mariadb import MARIADB, MariaDB, refuses_the_data
from pipeline.backends.portable import Backend, Bind, Portable
from pipeline.backends.postgresql import PostgreSQL
from pipeline.backends.sqlite import SQLite
from pipeline.core import errors

# By SQLAlchemy's dialect names.
_BACKENDS: dict[str, Backend] = {"postgresql": PostgreSQL(), "sqlite": SQLite(), **dict.fromkeys(MARIADB, MariaDB())}
_PORTABLE = Portable()
# Each database's claim (pipeline/backends/claiming.py).
_CLAIMS: dict[str, type[PortableClaim]] = {
    "postgresql": PostgreSQLClaim, "sqlite": SQLiteClaim, **dict.fromkeys(MARIADB, MariaDBClaim)}
T = TypeVar("T")

log = logging.getLogger(__name__)

# The pauses between attempts to reach the database again (``in_transaction``'s
# ``outlast``): doubling from the first to the longest.
REACH_AGAIN_FIRST, REACH_AGAIN_LONGEST = 0.5, 10.0


def backend_for(bind: Bind) -> Backend:
    """The backend of ``bind`` (a connection, an engine or a dialect)."""
    return backend_named(_name(bind))


def backend_named(name: str) -> Backend:
    """The backend of the database SQLAlchemy names ``name`` (a URL's backend name)."""
    return _BACKENDS.get(name, _PORTABLE)


def with_driver(url: sa.URL, shown: str) -> sa.URL:
    """``url`` with the driver the pipeline drives its database with (psycopg 3 for
    PostgreSQL, PyMySQL for MariaDB; a driver the URL names is kept); ConfigError,
    naming ``shown``, for a URL that driver cannot use."""
    if url.password is not None and url.get_backend_name() in MARIADB:
        try:
            url.password.encode("latin-1")
        except UnicodeEncodeError:  # what PyMySQL sends a password as
            raise errors.ConfigError(f"{shown}: MariaDB's driver takes a password of Latin-1 characters only") from None
    if url.drivername in ("postgres", "postgresql"):
        return url.set(drivername="postgresql+psycopg")
    if url.drivername in MARIADB:
        return url.set(drivername=f"{url.drivername}+pymysql")
    return url


def claiming_for(bind: Bind) -> type[PortableClaim]:
    """How the database of ``bind`` claims a queue's rows (made once per queue)."""
    return _CLAIMS.get(_name(bind), PortableClaim)


def _name(bind: Bind) -> str:
    """SQLAlchemy's name of the database of ``bind``."""
    return (bind if isinstance(bind, Dialect) else bind.dialect).name


def in_transaction(engine: Engine, work: Callable[[Connection], T], *, outlast: float = 0.0) -> T:
    """``work`` in a transaction of its own, run again where the database broke a
    deadlock by rolling it back (MariaDB); ``work`` must be safe to run again.

    ``outlast``: for up to this many seconds, run again while the database cannot be
    reached (``unreachable``: restarting, a connection cut, sessions refused), after
    pauses doubling from 0.5 s to 10 s; then its last error. For a write of what was
    done outside the database: a message sent whose outcome the database lost while
    restarting was sent again when its lease ran out (42 messages at the hour's restart,
    bench/RESULTS.md); written once the database is back, it is not. A fenced write is
    safe to run again: one whose commit landed before its connection broke finds its
    rows no longer held, and changes nothing."""
    backend = backend_for(engine)
    waited, pause = 0.0, REACH_AGAIN_FIRST
    while True:
        try:
            return backend.in_transaction(engine, work)
        except sa.exc.DBAPIError as exc:
            if not unreachable(exc) or waited + pause > outlast:
                raise
            log.warning("the database cannot be reached (%s); writing again in %.1f s", errors.reason(exc), pause)
            time.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, REACH_AGAIN_LONGEST)


def unreachable(exc: BaseException) -> bool:
    """``exc`` is a database error saying the database could not be reached or ended the
    session (a restart, a connection cut, sessions refused), or could not do the work for
    now (a deadlock, a statement cancelled): the DB-API's operational and interface
    errors. Not that it refused the work itself (a constraint, a value it cannot store),
    whatever class the driver gave that (MariaDB's CHECK constraints come as operational
    errors); not any other exception."""
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)) and not refuses_the_data(exc.orig)


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """Log that ``message`` (%-formatted with ``args``) failed with ``exc``: in one line,
    with the driver's reason, when the database could not be reached (an outage is
    logged once a retry, and a traceback each time buried the one line a worker ends
    with: 465 lines of stderr from one worker at a PostgreSQL restart); with its
    traceback otherwise (a bug to find)."""
    if unreachable(exc):
        logger.warning(f"{message}: the database cannot be reached: %s", *args, errors.reason(exc))
    else:
        logger.error(message, *args, exc_info=exc)


__all__ = ["Backend", "backend_for", "backend_named", "claiming_for", "in_transaction", "log_failure", "unreachable",
           "with_driver"]
