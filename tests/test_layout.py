"""The architecture holds: the import contracts in pyproject.toml ([tool.importlinter]),
checked by import-linter over the real import graph (function-level imports included)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import parse_python

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    """Layers import only downwards, only the Dagster layer imports Dagster, the pure rules
    open no connection, the politeness policy holds no SQL, and no package or module
    imports in a circle: every contract pyproject.toml declares is checked and kept."""
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    declared = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert declared >= 6 and f"{declared} kept, 0 broken" in result.stdout, result.stdout[-2000:]


def test_no_code_is_dead() -> None:
    """vulture (a process of its own) finds nothing unused in the product: a name only a
    framework calls is in [tool.vulture]'s lists, one read where vulture cannot see it in
    tests/dead_code_allowlist.py with why. Constants no code read (TEXT_FIELDS,
    FIELD_WORDS), a fetch's elapsed_ms never read, and a module only a test imported
    (pipeline/claim.py) had gathered unseen."""
    vulture = Path(sys.executable).parent / "vulture"
    result = subprocess.run([str(vulture)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and not result.stdout, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_file_sends_the_reader_outside_the_repository() -> None:
    """Fifteen comments sent the reader to a design file beside the checkout, which a
    reader of the repository does not have: each rule is explained where it lives or in
    docs/. (The benchmarks' corpus beside the checkout is an input, named as one.)"""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"DESIGN\.md")
    found = [f"{path}:{n}" for path in tracked if path.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".sql"))
             for n, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
             if outside.search(line)]
    assert found == []


def test_no_module_imports_a_private_name_of_a_dependency_but_its_one_wrapper() -> None:
    """Private APIs of feedparser and Dagster were imported where they were used; each is
    now imported once, in a module that says why and has a test that fails by name when
    the dependency changes it (pipeline/fetching/feedparser_private.py)."""
    import ast

    wrappers = {"pipeline/fetching/feedparser_private.py"}
    ours = ("pipeline", "assets", "sensors", "resources", "tests")
    found = []
    for folder in ("pipeline", "assets", "sensors", "resources"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name in wrappers:
                continue
            for node in ast.walk(parse_python(path.read_text(), name)):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                        and not node.module.startswith(ours) and node.module != "__future__":
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    if any(part.startswith("_") for part in node.module.split(".")) or private:
                        found.append(f"{name}:{node.lineno} from {node.module} import {', '.join(private) or '...'}")
                elif isinstance(node, ast.Import):
                    found += [f"{name}:{node.lineno} import {a.name}" for a in node.names
                              if any(part.startswith("_") for part in a.name.split(".")) and not a.name.startswith(ours)]
    assert found == []


def test_every_exception_the_pipeline_defines_is_a_pipeline_error() -> None:
    """One hierarchy under one base, defined in one module (pipeline/core/errors.py), so a
    caller can tell an operator error or a work failure from a bug by its type."""
    import importlib
    import inspect
    import pkgutil

    import pipeline
    from pipeline.core import errors

    defined: list[tuple[str, type]] = []
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        defined += [
            (info.name, cls) for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == info.name
        ]
    assert {cls.__name__ for _, cls in defined} >= {
        "FetchError", "BlockedAddress", "DeliveryError", "NormaliseError", "SourceError", "UserError",
    }
    assert all(issubclass(cls, errors.PipelineError) for _, cls in defined), defined
    assert {module for module, _ in defined} == {"pipeline.core.errors"}, defined


def test_the_command_line_imports_no_library_it_does_not_need_to_start() -> None:
    """A process of its own (what has been imported shows only in a fresh one): each
    `pipeline` command starts without importing Apprise (0.2 s), which only sending
    through it, or checking an Apprise URL, needs."""
    code = ("import sys, pipeline.cli, pipeline.notify.notifier, pipeline.catalogue.users; "
            "print(sorted(m for m in ('apprise',) if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# Where code may ask which database it runs on: the backends (one module per database:
# their sessions, storage, claims and locks, the migration lock among them).
_DIALECT_HOMES = ("pipeline/backends/",)
_DIALECT_NAMES = {"postgresql", "sqlite", "mysql", "mariadb"}
# What still asks outside them, per file: nothing (issue 35; the collector's item storage,
# the polite claim, the claim queues' strategies and the engine's set-up were the last).
# A new question belongs in a backend.
_STILL_ASKING: dict[str, int] = {}


def _asks_for_the_database(node: ast.AST) -> bool:
    """``x.dialect.name``; a comparison with a database's name or with ``MARIADB``; a
    variable named ``dialect`` compared."""
    if isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "dialect":
        return True
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    for side in sides:
        if isinstance(side, ast.Constant) and side.value in _DIALECT_NAMES:
            return True
        if isinstance(side, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and e.value in _DIALECT_NAMES for e in side.elts):
            return True
        if isinstance(side, ast.Name) and side.id in ("MARIADB", "dialect"):
            return True
    return False


def test_no_code_outside_the_backends_asks_which_database_it_runs_on() -> None:
    """Each database's SQL lives in its backend (pipeline/backends/): a stage that asks
    which database it runs on has to be tested on every database, and a newcomer cannot
    find "the MariaDB way" of a thing in one place. Counted on the source's syntax tree;
    the files that still ask are listed above and may only ask less."""
    asking: dict[str, int] = {}
    for top in ("pipeline", "assets", "sensors", "resources"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(_DIALECT_HOMES):
                continue
            tree = parse_python(path.read_text(), name)
            # A comparison whose side is ``x.dialect.name`` is one question, not two.
            lines = {node.lineno for node in ast.walk(tree) if _asks_for_the_database(node)}
            if lines:
                asking[name] = len(lines)
    assert asking == _STILL_ASKING, "files asking which database they run on (lines per file): " + repr(asking)


@pytest.mark.xdist_group("mypy")  # one mypy at a time writes the cache they share
def test_the_package_type_checks_strictly() -> None:
    """mypy --strict over the package ([tool.mypy] in pyproject.toml): every stage's types,
    the rows each queue's claim hands out by name among them. It starts mypy (about 15 s of
    one core without its cache, a second or two with it)."""
    found = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout[-6000:] + found.stderr[-2000:]
