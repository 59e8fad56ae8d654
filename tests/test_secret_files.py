"""Secrets from files (pipeline/core/secret_files.py): the image's entrypoint sets each
secret from a file in PIPELINE_SECRETS_DIR, so no password is in a container's
configuration; every mistake is one line naming it. The Compose stack's use of it, run
containers included, is exercised by tests/test_docker.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.core import secret_files
from pipeline.core.errors import ConfigError

URL = "postgresql://pipeline:s3cret@db.example:5432/pipeline"


def folder(tmp_path, **files: str):
    path = tmp_path / "secrets"
    path.mkdir(mode=0o700)
    for name, text in files.items():
        (path / name).write_text(text)
        (path / name).chmod(0o600)
    return path


def test_each_file_sets_the_setting_it_is_named_after(tmp_path):
    path = folder(tmp_path, DATABASE_URL=URL + "\n", PIPELINE_OPERATOR_ALERT_SECRET="whsec_abc")
    (path / "..data").mkdir()  # Kubernetes' secret volumes hold hidden entries beside the files
    environ = {"PIPELINE_SECRETS_DIR": str(path), "PIPELINE_CONCURRENCY": "4"}
    assert secret_files.load(environ) == ["DATABASE_URL", "PIPELINE_OPERATOR_ALERT_SECRET"]
    assert environ["DATABASE_URL"] == URL, "the file's trailing newline is not part of the value"
    assert environ["PIPELINE_OPERATOR_ALERT_SECRET"] == "whsec_abc"
    assert environ["PIPELINE_CONCURRENCY"] == "4"


def test_without_a_folder_the_environment_is_left_as_it_is():
    environ = {"DATABASE_URL": URL}
    assert secret_files.load(environ) == [] and environ == {"DATABASE_URL": URL}


@pytest.mark.parametrize("files, environ, message", [
    ({"DATABSE_URL": URL}, {}, "holds 'DATABSE_URL', which is no secret setting"),
    ({"DATABASE_URL": " \n"}, {}, "DATABASE_URL is empty"),
    ({"DATABASE_URL": URL}, {"DATABASE_URL": "sqlite:///x.db"},
     "DATABASE_URL is set in the environment and in"),
    ({"DAGSTER_POSTGRES_URL": URL}, {}, "has no DATABASE_URL"),
    ({"DATABASE_URL": b"\xff\xfe"}, {}, "cannot read"),
])
def test_a_mistake_stops_with_one_line_naming_it_and_no_value(tmp_path, files, environ, message):
    """Each of these once ended elsewhere: a typo'd name or an empty file left a setting at
    its default, a missing DATABASE_URL meant an embedded SQLite file in the container."""
    path = tmp_path / "secrets"
    path.mkdir()
    for name, content in files.items():
        (path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        (path / name).chmod(0o600)
    environ = {**environ, "PIPELINE_SECRETS_DIR": str(path)}
    before = dict(environ)
    with pytest.raises(ConfigError, match=message) as raised:
        secret_files.load(environ)
    assert "s3cret" not in str(raised.value)
    assert environ == before, "nothing is set from a folder with a mistake in it"


def _hostile(tmp_path, kind: str):
    """A secrets folder whose DATABASE_URL is ``kind`` of file."""
    path = folder(tmp_path)
    target = path / "DATABASE_URL"
    outside = tmp_path / "elsewhere"
    outside.write_text(URL)
    outside.chmod(0o600)
    if kind == "a link to /dev/zero":  # read whole, it was a MemoryError
        target.symlink_to("/dev/zero")
    elif kind == "a FIFO":  # opened, it hung the start for ever
        os.mkfifo(target, 0o600)
    elif kind == "a link out of the folder":
        target.symlink_to(outside)
    elif kind == "readable by others":
        target.write_text(URL)
        target.chmod(0o644)
    elif kind == "larger than 64 KiB":
        target.write_text("x" * 70_000)
        target.chmod(0o600)
    elif kind == "a dangling link":
        target.symlink_to(path / "nowhere")
    elif kind == "a folder":
        target.mkdir()
    return path


@pytest.mark.parametrize("kind, message", [
    ("a link to /dev/zero", "links out of"),
    ("a FIFO", "is not a plain file"),
    ("a link out of the folder", "links out of"),
    ("readable by others", r"can be read by others \(mode 0644\): chmod 600 it"),
    ("larger than 64 KiB", "is larger than 64 KiB"),
    ("a dangling link", "cannot read"),
    ("a folder", "is not a plain file"),
])
def test_a_secret_that_is_not_a_plain_private_file_of_the_folder_is_one_line(tmp_path, kind, message):
    """Each was taken as it came: a link to /dev/zero died with MemoryError, a FIFO hung
    the start, a link out of the folder and a world-readable file were read silently."""
    environ = {"PIPELINE_SECRETS_DIR": str(_hostile(tmp_path, kind))}
    with pytest.raises(ConfigError, match=message) as raised:
        secret_files.load(environ)
    assert "\n" not in str(raised.value) and "s3cret" not in str(raised.value)
    assert "DATABASE_URL" not in environ


def test_a_link_inside_the_folder_is_followed_as_kubernetes_makes_them(tmp_path):
    path = folder(tmp_path)
    data = path / "..2026_12_02" / "DATABASE_URL"
    data.parent.mkdir()
    data.write_text(URL)
    data.chmod(0o400)
    (path / "..data").symlink_to(data.parent.name)
    (path / "DATABASE_URL").symlink_to("..data/DATABASE_URL")
    environ = {"PIPELINE_SECRETS_DIR": str(path)}
    assert secret_files.load(environ) == ["DATABASE_URL"] and environ["DATABASE_URL"] == URL


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"PIPELINE_SECRETS_DIR=.*nowhere: no such folder"):
        secret_files.load({"PIPELINE_SECRETS_DIR": str(tmp_path / "nowhere")})


def test_the_entrypoint_becomes_the_command_with_the_secrets_in_its_environment(tmp_path):
    """Starts the entrypoint as the image does (a process: it replaces itself with the command)."""
    path = folder(tmp_path, DATABASE_URL=URL, DAGSTER_POSTGRES_URL="postgresql+psycopg2://d:pw@h/dagster")
    env = {k: v for k, v in os.environ.items() if k not in secret_files.SECRETS}
    env["PIPELINE_SECRETS_DIR"] = str(path)
    printed = subprocess.run(
        [sys.executable, "-m", "pipeline.core.secret_files", sys.executable, "-c",
         "import os; print(os.environ['DATABASE_URL'], os.environ['DAGSTER_POSTGRES_URL'])"],
        env=env, capture_output=True, text=True, check=True).stdout.split()
    assert printed[:2] == [URL, "postgresql+psycopg2://d:pw@h/dagster"]
    (path / "DATABASE_URL").write_text("")
    failed = subprocess.run([sys.executable, "-m", "pipeline.core.secret_files", "true"],
                            env=env, capture_output=True, text=True, check=False)
    assert failed.returncode == 1 and failed.stderr.strip() == f"error: {path / 'DATABASE_URL'} is empty"
    missing = subprocess.run([sys.executable, "-m", "pipeline.core.secret_files", "no-such-command"],
                             env={**env, "PIPELINE_SECRETS_DIR": ""}, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "cannot run no-such-command" in missing.stderr
