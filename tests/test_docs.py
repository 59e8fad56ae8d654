"""The docs a newcomer reads are true where a machine can tell: every Python block of
README.md and docs/ runs, and every `pipeline ...` command they name exists with the
options they give it."""

from __future__ import annotations

import json
import re
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def python_blocks() -> dict[str, str]:
    """Each ```python block, dedented, by its file and place among the file's blocks
    ("README.md#1": the first)."""
    found = {}
    for path in DOCS:
        for n, m in enumerate(FENCE.finditer(path.read_text()), 1):
            found[f"{path.relative_to(ROOT)}#{n}"] = textwrap.dedent(m.group(2))
    return found


def test_every_python_block_is_run_here() -> None:
    """A block added to the docs gets a test below, or this fails: README's claim example
    imported a module that does not exist (``from pipeline import db``), unseen."""
    assert sorted(python_blocks()) == sorted([README_CLAIM, RUNBOOK_VERIFY]), "a new block needs a test"


README_CLAIM = "README.md#1"
RUNBOOK_VERIFY = "docs/runbook.md#1"


def test_the_claim_example_of_the_readme_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # it makes its SQLite file where it runs
    exec(compile(python_blocks()[README_CLAIM], README_CLAIM, "exec"), {})  # noqa: S102 (the README's own code)
    assert (tmp_path / "claim-example.db").exists()


def test_the_runbook_s_webhook_verification_accepts_a_delivery_and_refuses_a_forgery() -> None:
    from pipeline.notify.delivery import signed_headers
    from pipeline.notify.signing import new_secret

    secret = new_secret()  # as the pipeline makes one: the snippet takes it as given
    replies: list[int] = []
    seen_ids: set[str] = set()

    def seen(webhook_id: str) -> bool:
        was = webhook_id in seen_ids
        seen_ids.add(webhook_id)
        return was

    namespace = {"SECRET": secret, "reply": replies.append, "seen": seen}
    exec(compile(python_blocks()[RUNBOOK_VERIFY], RUNBOOK_VERIFY, "exec"), namespace)  # noqa: S102
    handle = namespace["handle"]
    body = json.dumps({"type": "listing.matched"}).encode()
    headers = signed_headers([secret], "msg_1", body, datetime.now(UTC))
    handle(body, headers)
    assert replies == [], "a delivery signed with the secret is handled"
    handle(body, headers)
    assert replies == [204], "a repeat is acknowledged and dropped"
    handle(body + b" ", {**headers, "webhook-id": "msg_2"})
    assert replies == [204, 401], "a body that is not the one signed is refused"


def _commands() -> list[tuple[str, str]]:
    """Each `pipeline ...` the docs name in code, by file."""
    span = re.compile(r"`(pipeline [^`]+)`")
    return [(str(path.relative_to(ROOT)), m.group(1)) for path in DOCS for m in span.finditer(path.read_text())]


def test_every_command_the_docs_name_exists_with_the_options_they_give_it() -> None:
    """Words in lowercase after `pipeline` are commands down the tree; each `--option`
    belongs to the command named before it."""
    from pipeline.cli import cli

    named = _commands()
    assert len(named) > 100, "the docs name the commands they teach"
    wrong = []
    for where, line in named:
        command: click.Command = cli
        for word in line.split()[1:]:
            if isinstance(command, click.Group) and re.fullmatch(r"[a-z][a-z-]*", word):
                sub = command.get_command(click.Context(command), word)
                if sub is None:
                    wrong.append(f"{where}: `{line}`: no command {word!r}")
                    break
                command = sub
            elif word.startswith("--"):
                option = re.match(r"--[a-z0-9-]+", word)
                known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
                if option and option.group() not in known:
                    wrong.append(f"{where}: `{line}`: no option {option.group()} of `{command.name}`")
    assert not wrong, "\n".join(wrong)
