"""The suite keeps its own rules, read from its source (no test here starts anything).

* A test that starts a process, creates a database or waits says why in its docstring:
  those are what make a suite slow, and a reader deciding whether one is needed should
  not have to guess.
* Which databases a test runs on has one home, tests/conftest.py (``backend`` and the
  ``conformance`` marker): a module never redefines the ``backend`` fixture.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What starts a process, creates a database or waits, written in a test's own body.
COSTLY = re.compile(r"subprocess\.|Popen\(|\bconsole\(|\.migrated\(\)|\.create\(\)|wait_until\(|time\.sleep\(")


def functions_of_tests() -> list[tuple[Path, ast.FunctionDef, str]]:
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.append((path, node, "\n".join(lines[node.lineno - 1 : node.end_lineno])))
    return found


def test_a_test_that_starts_a_process_creates_a_database_or_waits_says_why() -> None:
    silent = [f"{path.name}:{node.lineno} {node.name}" for path, node, body in functions_of_tests()
              if COSTLY.search(body) and not ast.get_docstring(node)]
    assert not silent, "say why in the docstring:\n" + "\n".join(silent)


def test_which_databases_a_test_runs_on_is_decided_in_one_place() -> None:
    overriding = [path.name for path in sorted(TESTS.glob("test_*.py"))
                  if re.search(r"^def backend\(", path.read_text(), re.MULTILINE)]
    assert not overriding, f"use the conformance marker (tests/conftest.py) instead: {overriding}"
