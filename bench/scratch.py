"""What every benchmark here shares: databases of its own, and CPU accounting.

* Database names ``<prefix>_<pid>_<random>``, made once per run of a script and inherited
  by the processes it spawns (which import the script again), so they all name the same
  database. Two benchmarks on one server never drop each other's databases: they once
  used fixed names and dropped them ``WITH (FORCE)``, each run killing the other's
  connections. ``scratch_database`` drops its database however the run ends.
* CPU per unit of work, from the processes' own accounting: a client's
  ``time.process_time()``, and the PostgreSQL server's from ``/proc`` (every process of
  the cluster, the backends and the background writers alike, plus what the postmaster
  reaped from backends that exited). CPU per row holds on a busy machine, where
  throughput swings; it needs the server on this host, and is ``None`` otherwise.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

_RUN = "PIPELINE_BENCH_RUN"
_TICK = os.sysconf("SC_CLK_TCK")


def unique_name(prefix: str) -> str:
    suffix = os.environ.setdefault(_RUN, f"{os.getpid()}_{secrets.token_hex(3)}")
    return f"{prefix}_{suffix}"


@contextmanager
def scratch_database(admin: sa.Engine, name: str, *, template: str | None = None) -> Iterator[str]:
    """Create database ``name`` (a copy of ``template`` if given) on ``admin``'s server
    and drop it on the way out, whatever happened; yields the name."""
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield name
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _stat(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from 3 (state) on


def process_seconds(pid: int | str) -> float | None:
    """CPU seconds (user and system, every thread) a process on this host has spent."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICK


def tree_seconds(pid: int) -> float:
    """CPU seconds (user and system) of process ``pid`` and every process under it (a
    server's workers), from /proc."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)):
            parents[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, grown = {pid}, True
    while grown:
        more = {child for child, (parent, _) in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return sum(parents[p][1] for p in tree if p in parents) / _TICK


class ServerCpu:
    """CPU seconds spent by one PostgreSQL cluster on this host, read from /proc."""

    def __init__(self, engine: sa.Engine) -> None:
        with engine.connect() as conn:
            backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        fields = _stat(backend)
        self.postmaster = int(fields[1]) if fields else None  # field 4: ppid

    @property
    def available(self) -> bool:
        return self.postmaster is not None and _stat(self.postmaster) is not None

    def seconds(self) -> float | None:
        if not self.available:
            return None
        assert self.postmaster is not None
        own = _stat(self.postmaster)
        assert own is not None
        # utime, stime, cutime, cstime: fields 14-17; the reaped backends are in c*.
        ticks = sum(int(v) for v in own[11:15])
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = _stat(entry.name)
                if fields and fields[1] == str(self.postmaster):
                    ticks += int(fields[11]) + int(fields[12])
        return ticks / _TICK


def wait_for_backends_gone(engine: sa.Engine, database: str, timeout: float = 60.0) -> None:
    """Wait until no session but ours is connected to ``database``: the workers'
    backends have exited and been reaped, so their CPU is in the postmaster's account."""
    deadline = time.monotonic() + timeout
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while True:
            left = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %(d)s AND pid <> pg_backend_pid()",
                {"d": database},
            ).scalar_one()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{left} session(s) still connected to {database} after {timeout:g} s")
            time.sleep(0.05)


def load() -> str:
    """``uptime``'s load averages, to print beside a figure."""
    out = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    return out.strip().split("load average:")[-1].strip()


def commit() -> str:
    """The commit the benchmark ran (``+dirty`` when the tree had changes)."""
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (head or "unknown") + ("+dirty" if dirty else "")
