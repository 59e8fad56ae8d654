"""What every command shares: the engine (schema checked), the id type, a worker name,
and how totals are printed."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click

from pipeline.core.inputs import MAX_ID, utc
from pipeline.core.settings import Settings

if TYPE_CHECKING:
    import sqlalchemy as sa

# Every id a command takes: a positive 64-bit integer, refused by click (in one line)
# before the database sees it.
ID = click.IntRange(1, MAX_ID)


def engine(*, check: bool = True) -> sa.Engine:
    """The database's engine, disposed of (its connections closed) when the command
    ends: ``main(argv)`` called in a long-lived process leaves no connection open."""
    from pipeline.storage import db, migrate

    engine = db.create_engine(Settings.from_env().database_url)
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(engine.dispose)
    if check:
        migrate.check_schema(engine)
    return engine


def lazy(name: str) -> ModuleType:
    """The module ``name``, loaded on the first read of one of its names (the standard
    library's ``LazyLoader``): a command module names what its commands use at the top,
    and a command that uses none of it (``--help``) does not load it."""
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, f"no module {name}"
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def worker(stage: str) -> str:
    import os
    import socket

    return f"cli-{stage}:{socket.gethostname()}:{os.getpid()}"


class HelpGroup(click.Group):
    """A command group whose --help lists each command's first sentence whole, wrapped to
    the terminal, where click cuts it at about 45 characters ("Re-fetch, re-process or
    re-match on demand, as the...")."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def as_json(value: Any) -> str:
    """``value`` as the JSON every --json prints: times in ISO 8601, UTC
    ("2026-11-27T09:00:00.123456+00:00"), as ``status --json`` has them."""
    def encode(item: Any) -> Any:
        return utc(item).isoformat() if isinstance(item, datetime) else str(item)

    return json.dumps(value, indent=2, default=encode)


def moment(value: datetime) -> str:
    """A time as the human-readable listings print it: ISO 8601 to the second, UTC."""
    return utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: "1 source", "3 sources"."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def report(totals: dict[str, Any], as_json: bool, say: Callable[[dict[str, Any]], str]) -> None:
    click.echo(json.dumps(totals) if as_json else say(totals))


def progress(length: int, label: str) -> Any:
    """A progress bar on stderr (drawn only on a terminal), so --json output stays clean."""
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)
