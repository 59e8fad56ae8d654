"""Database names of a benchmark's own: ``<prefix>_<pid>_<random>``, made once per run of a
script and inherited by the processes it spawns (which import the script again), so
they all name the same database. Two benchmarks on one server never drop each other's
databases: they once used fixed names and dropped them ``WITH (FORCE)``, each run
killing the other's connections."""

from __future__ import annotations

import os
import secrets

_RUN = "PIPELINE_BENCH_RUN"


def unique_name(prefix: str) -> str:
    suffix = os.environ.setdefault(_RUN, f"{os.getpid()}_{secrets.token_hex(3)}")
    return f"{prefix}_{suffix}"
