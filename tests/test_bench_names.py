"""Benchmarks name their databases uniquely per run (bench/scratch.py): two benchmarks on
one server once dropped each other's fixed-name databases WITH (FORCE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "import sys; sys.path.insert(0, {root!r}); from bench.scratch import unique_name; print(unique_name('bench_x'))"


def name_in_a_new_process(env: dict[str, str]) -> str:
    code = NAME.format(root=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_two_runs_name_their_databases_apart_and_a_run_and_its_children_alike() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_BENCH_RUN"}
    first, second = name_in_a_new_process(env), name_in_a_new_process(env)
    assert first.startswith("bench_x_") and second.startswith("bench_x_") and first != second
    # A process the run spawns imports the script again, with the run's environment.
    env["PIPELINE_BENCH_RUN"] = first.removeprefix("bench_x_")
    assert name_in_a_new_process(env) == first
