"""Secrets from files: the settings that hold passwords and tokens, read from a folder
instead of the process environment.

A container's environment is readable by anyone who may run ``docker inspect`` (and is
copied into every run container Dagster starts), so the Compose stack keeps its secrets
in files: ``PIPELINE_SECRETS_DIR`` names a folder holding one file per secret, named
after its variable (``DATABASE_URL``, ``DAGSTER_POSTGRES_URL``, ...), mounted read-only.
The project's image runs every command through this module (its ENTRYPOINT): it sets
each secret from its file, then becomes the command (``exec``), so Dagster, which reads
``DAGSTER_POSTGRES_URL`` from its environment itself, and the pipeline's settings see
the values without them ever being in the container's configuration.

    python -m pipeline.core.secret_files dagster-daemon run -w workspace.yaml

With ``PIPELINE_SECRETS_DIR`` unset the command runs unchanged (plain environment, as in
development). Every mistake stops the command with one line naming it: a folder that is
missing, a file that is empty or unreadable, not a plain file of the folder (a link out of
it, a device, a FIFO), larger than 64 KiB or readable by others (mode 600, as ssh asks of
a key), a file whose name is no secret (a typo would
otherwise leave a setting at its default), a secret set both in the environment and in a
file, and a folder without ``DATABASE_URL`` (the pipeline would otherwise quietly use
an embedded SQLite file inside the container).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from pipeline.core.errors import ConfigError

FOLDER_SETTING = "PIPELINE_SECRETS_DIR"
# The settings that hold credentials: database URLs with their passwords, the operator
# alert channel (Apprise URLs carry tokens), its signing secret, and the token Alertmanager
# brings to it.
SECRETS = (
    "DATABASE_URL",
    "DAGSTER_POSTGRES_URL",
    "PIPELINE_OPERATOR_ALERT_URL",
    "PIPELINE_OPERATOR_ALERT_SECRET",
    "PIPELINE_ALERTMANAGER_TOKEN",
)
REQUIRED = ("DATABASE_URL",)
# Where the Compose stack mounts the folder in every container, run containers too
# (tests/test_docker_files.py checks deploy/ agrees).
MOUNT = "/run/secrets/listings-pipeline"


def load(environ: MutableMapping[str, str]) -> list[str]:
    """Set each secret found in ``environ[PIPELINE_SECRETS_DIR]`` in ``environ``; the names set.

    Hidden entries (Kubernetes' ``..data`` links, editors' dotfiles) are not secrets and are
    passed over.
    """
    configured = environ.get(FOLDER_SETTING, "").strip()
    if not configured:
        return []
    folder = Path(configured)
    if not folder.is_dir():
        raise ConfigError(f"{FOLDER_SETTING}={configured}: no such folder")
    found: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.name not in SECRETS:
            raise ConfigError(
                f"{FOLDER_SETTING}={configured} holds {path.name!r}, which is no secret setting"
                f" (the files are named after their settings: {', '.join(SECRETS)})")
        value = _read(folder, path)
        if not value:
            raise ConfigError(f"{path} is empty")
        if environ.get(path.name, "").strip():
            raise ConfigError(
                f"{path.name} is set in the environment and in {path}: set it in one place")
        found[path.name] = value
    missing = [name for name in REQUIRED if name not in found and not environ.get(name, "").strip()]
    if missing:
        raise ConfigError(f"{FOLDER_SETTING}={configured} has no {', '.join(missing)}")
    environ.update(found)
    return sorted(found)


MAX_BYTES = 64 * 1024  # a secret is a URL, a password or a token: a file past this is a mistake


def _read(folder: Path, path: Path) -> str:
    """The text of the secret ``path`` in ``folder``, stripped; ConfigError, in one line,
    for a file that is not a plain file of the folder's (a link out of it, a device such
    as /dev/zero, a FIFO that would hang the start), is larger than MAX_BYTES, is
    readable by others (as ssh refuses a key that is), or is not UTF-8. A link inside the
    folder is followed: Kubernetes' secret volumes link each file to ``..data/``."""
    try:
        real = path.resolve(strict=True)
        inside = real.is_relative_to(folder.resolve(strict=True))
    except (OSError, RuntimeError) as exc:  # a dangling link, or a loop of links
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not inside:
        raise ConfigError(f"{path} links out of {folder}: a secret's file lies in the folder")
    try:
        # Non-blocking: a FIFO opens at once (and is refused below) instead of hanging.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a plain file (a device, a FIFO or a folder): a secret is a file")
    with os.fdopen(fd, "rb") as file:
        if found.st_mode & 0o077:
            raise ConfigError(f"{path} can be read by others (mode {stat.S_IMODE(found.st_mode):04o}):"
                              f" chmod 600 it, as ssh asks of a key")
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_BYTES // 1024} KiB: no secret is")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read {path}: it is not UTF-8 text") from None


def main(argv: Sequence[str] | None = None) -> None:
    """Load the secrets into this process's environment, then become ``argv``."""
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        sys.exit("usage: python -m pipeline.core.secret_files COMMAND [ARG...]")
    try:
        load(os.environ)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.exit(f"error: cannot run {command[0]}: {exc.strerror}")


if __name__ == "__main__":
    main()
