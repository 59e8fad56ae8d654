"""Every exception the pipeline raises on purpose: one hierarchy under ``PipelineError``.

Two families. An *operator error* stops a command and the CLI prints it as one line:
``ConfigError``, ``DatabaseUnavailable``, ``SchemaMismatch``, ``SourceError``,
``UserError``. A *work failure* ends one piece of work (a fetch, a raw row, a delivery),
is recorded on that work's row and never stops the others: ``FetchError`` (with a failure
code of pipeline/core/failures.py), ``BlockedAddress``, ``NormaliseError``,
``DeliveryError``. Anything that is not a ``PipelineError`` is a bug and keeps its traceback.
"""

from __future__ import annotations

from datetime import datetime

from pipeline.core import redact
from pipeline.core.failures import PERMANENT, FailureReason


class PipelineError(Exception):
    """Base class: a problem described in one sentence, that the user or the work can act on."""


# -- operator errors -------------------------------------------------------------------------


class ConfigError(PipelineError):
    """A setting (an environment variable or a resource field) is malformed."""


class DatabaseUnavailable(PipelineError):
    """The database named by DATABASE_URL could not be reached."""


class SchemaMismatch(PipelineError):
    """The database schema is not the revision this code was written for."""


class SourceError(PipelineError):
    """A source entry, or a request about a source, that cannot be accepted."""


class UserError(PipelineError):
    """A user, filter or notification request that cannot be accepted."""


class QueryError(UserError):
    """A filter that does not parse or cannot be matched (pipeline/notify/query.py);
    ``position`` (1-based) is where, when there is one place to point at."""

    def __init__(self, message: str, position: int | None = None) -> None:
        self.position = position
        super().__init__(f"at position {position}: {message}" if position is not None else message)


# -- work failures ---------------------------------------------------------------------------


class WorkFailure(PipelineError):
    """One piece of work failed; its stage records why on the work's row and carries on."""


class FetchError(WorkFailure):
    """A fetch failed for ``reason``; ``retry_after`` is the server's floor, if it gave one."""

    def __init__(
        self,
        reason: FailureReason,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: datetime | None = None,
        body: bytes | None = None,
    ) -> None:
        message = redact.userinfo(message)  # kept and shown: a URL in it never with its password
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.http_status = http_status
        self.retry_after = retry_after
        self.body = body  # the start of an error response's body, for adapters to read

    @property
    def permanent(self) -> bool:
        return self.reason in PERMANENT


class BlockedAddress(WorkFailure):
    """The address guard refused a connection. Raised where the socket would be opened;
    deliberately not an OSError, so httpcore passes it through instead of calling it a
    connection failure."""


class NormaliseError(WorkFailure, ValueError):
    """A raw row that cannot become a listing; the message says why."""


class DeliveryError(WorkFailure):
    """A send that failed; ``code`` is one of pipeline/core/failures.py's DELIVERY_CODES,
    ``retry_after`` the receiver's floor, if it named one, ``http_status`` its answer's
    status, if it answered one."""

    def __init__(self, message: str, *, code: str, retry_after: datetime | None = None,
                 http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after = retry_after
        self.http_status = http_status


class NotPlainFeed(PipelineError):
    """A feed document outside what pipeline/fetching/quickfeed.py reads exactly as
    feedparser does; the message names what. Never leaves the parser: feedparser then
    reads the document."""


def reason(exc: BaseException) -> str:
    """What ``exc`` says, on one line, for a log, a check or an operator: a database
    error's driver message (its first line only: later lines, such as PostgreSQL's
    CONTEXT, can quote a bound value, and the statement never shows), else the
    exception's text, or its type when it has none; a URL's password never shows."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return redact.userinfo(text.splitlines()[0] if text else type(exc).__name__)
