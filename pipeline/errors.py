"""Exceptions the pipeline raises on purpose; the CLI prints them as one line.

Anything that is not a ``PipelineError`` is a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: a problem the user can act on, described in one sentence."""


class ConfigError(PipelineError):
    """A setting (an environment variable or a resource field) is malformed."""


class DatabaseUnavailable(PipelineError):
    """The database named by DATABASE_URL could not be reached."""


class SchemaMismatch(PipelineError):
    """The database schema is not the revision this code was written for."""
