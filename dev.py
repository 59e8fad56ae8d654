#!/usr/bin/env python3
"""Set up and run the project with nothing but Python 3.11+ and the package index.

    python3 dev.py up      # the Dagster UI and daemon on the embedded default (SQLite),
                           # with the offline demo (a local feed site and webhook receiver)
    python3 dev.py test    # the test suite (TEST_DATABASE_URL, else a throwaway PostgreSQL)

Both create .venv/ on first use and reinstall the project when pyproject.toml changes.
Extra arguments go to pytest (``test``) or to ``dg dev`` (``up``); ``up --no-demo``
leaves the demo out. ``up`` starts ``dg dev`` again when it exits on its own (one of its
services died), telling the operator's channel.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import venv
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STATE = Path(os.environ.get("PIPELINE_STATE_DIR") or ROOT / ".state")


# The dev instance's dagster.yaml, written on every start (.state/ is dev.py's): runs
# whose process died are marked failed, so the sensors do not wait on them for ever
# (a hard kill once left two STARTING runs and every sensor skipped), and old ticks
# are purged. Runs themselves are purged by the upkeep job (PIPELINE_RUN_RETENTION_DAYS).
DEV_INSTANCE = """\
# Written by dev.py on every start; edits are lost. Production: deploy/dagster.yaml.
telemetry:
  enabled: false
nux:  # the UI's first-visit community modal: not for an operator's local instance
  enabled: false
run_monitoring:
  enabled: true
  start_timeout_seconds: 60
  cancel_timeout_seconds: 60
  max_runtime_seconds: 3600
  poll_interval_seconds: 15
  free_slots_after_run_end_seconds: 60
retention:
  schedule:
    purge_after_days: 7
  sensor:
    purge_after_days:
      skipped: 1
      failure: 7
      success: 7
"""
# In the dev instance's folder while the stack stops: its run launcher then starts no run
# (sensors/shutdown.py), so none starts between the runs' termination and dagster dev's stop.
STOP_FILE = "stopping"
# dagster dev that exits on its own after running this long (a service of it died) is
# started again; one that exits sooner could not start, and would fail the same way again.
RESTART_AFTER_SECONDS = 60
# The demo site's operator channel checks alerts with it (pipeline/demo/content.py).
DEMO_OPERATOR_SECRET = "demo-operator-secret-not-for-production"


def dev_instance(dagster_home: Path) -> str:
    """The dev dagster.yaml: DEV_INSTANCE, and the run launcher that heeds STOP_FILE."""
    stop_file = json.dumps(str(dagster_home / STOP_FILE))  # a JSON string is a YAML string
    return (f"{DEV_INSTANCE}run_launcher:\n  module: sensors.shutdown\n  class: StoppableRunLauncher\n"
            f"  config:\n    stop_file: {stop_file}\n")


def say(message: str) -> None:
    print(f"dev.py: {message}", flush=True)


def ensure_venv(extras: str) -> None:
    """Create .venv and install the project (editable) with ``extras`` when needed."""
    if sys.version_info < (3, 11):  # noqa: UP036 -- dev.py runs under any python3
        sys.exit(f"dev.py: Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not (BIN / "python").exists():
        say(f"creating {VENV.relative_to(ROOT)}/")
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".installed-{extras or 'base'}-{digest}"
    if stamp.exists() or (not extras and any(VENV.glob(f".installed-*-{digest}"))):
        return  # (any extras include the base install)
    target = f".[{extras}]" if extras else "."
    say(f"installing the project and its dependencies ({target}); the first time takes a few minutes")
    subprocess.run(
        [str(BIN / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-e", target],
        cwd=ROOT,
        check=True,
    )
    for old in VENV.glob(f".installed-{extras or 'base'}-*"):
        old.unlink()
    stamp.touch()


def run(
    argv: list[str], env: dict[str, str] | None = None, *,
    before_stop: Callable[[], object] | None = None, after_exit: Callable[[int], object] | None = None,
) -> int:
    """Run a command in a process group of its own and pass each SIGINT this process gets
    on to that group, once: Ctrl-C (SIGINT to dev.py's group) and ``kill -INT`` to dev.py
    alone then do the same, one clean shutdown (the command's own group never gets the
    terminal's SIGINT as well, which made dagster dev abort its shutdown). On Linux the
    command also gets SIGTERM if dev.py dies without passing anything on (SIGKILL).
    ``before_stop`` runs first, on the first SIGINT (a second one skips it); ``after_exit``
    gets the group's id once the command has exited, however it ended."""
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 -- dev.py starts no thread
    )
    try:
        return _wait(process, before_stop)
    finally:
        if after_exit is not None:
            after_exit(process.pid)


def _wait(process: subprocess.Popen[bytes], before_stop: Callable[[], object] | None) -> int:
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:
            if process.poll() is None:
                if before_stop is not None:
                    stopping, before_stop = before_stop, None
                    try:
                        stopping()
                    except KeyboardInterrupt:
                        pass  # a second Ctrl-C: stop now
                os.killpg(process.pid, signal.SIGINT)


def end_runs(step: str, env: dict[str, str]) -> None:
    """``sensors/shutdown.py``: terminate the Dagster runs in flight (before dagster dev
    stops), or mark those left as canceled (after): a shutdown leaves no run FAILED or
    STARTED, and no run process behind."""
    if step == "terminate":
        say("Ctrl-C: terminating the runs in flight, then stopping Dagster")
    subprocess.run([str(BIN / "python"), "-m", "sensors.shutdown", step], cwd=ROOT, env=env, check=False)


def stop_runs(dagster_home: Path, env: dict[str, str]) -> None:
    """On Ctrl-C, before dagster dev is stopped: no run starts any more, and the runs in
    flight are terminated."""
    (dagster_home / STOP_FILE).touch()
    end_runs("terminate", env)


def after_dagster(pgid: int, env: dict[str, str]) -> None:
    """Once dagster dev has exited: no process of its group left, no run left active."""
    kill_group(pgid)
    end_runs("mark", env)


def kill_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGKILL what is left of a process group (a run process the stop left behind) and
    wait until it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # no prctl (macOS): a dev.py killed with SIGKILL leaves the command running


def restarted(code: int, ran: float, env: dict[str, str]) -> None:
    """dagster dev exited on its own (its daemon, webserver or code server died: it stops
    them all): say so in one line, tell the operator when a channel is set, and go on to
    start it again."""
    what = (f"dagster dev exited on its own (status {code}) after {ran / 60:.0f} min: one of its services died;"
            " starting it again")
    say(what)
    if env.get("PIPELINE_OPERATOR_ALERT_URL"):
        told = subprocess.run([str(BIN / "pipeline"), "operator", "tell", "--event", "stack_restarted",
                               "dev.py restarted the Dagster stack", what], cwd=ROOT, env=env, check=False)
        if told.returncode != 0:
            say("the operator could not be told of the restart (the line above says why)")


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's workers, two per core (each with databases of its own), unless the
    arguments choose (``-n 0`` runs in this process). Tests spend much of their time
    waiting for the processes and servers they start: on 2 cores, 4 workers ran the suite
    in 410 s and 2 in 484 s, for the same CPU time."""
    if any(a in ("-n", "--numprocesses") or a.startswith(("-n", "--numprocesses=")) for a in args):
        return args
    return ["-n", str(2 * (os.cpu_count() or 1)), "--dist", "loadgroup", *args]


def test(args: list[str]) -> int:
    ensure_venv("test")
    code = run([str(BIN / "python"), "-m", "pytest", *parallel(args)])
    if code == 5:  # pytest ran nothing: never a pass
        say("pytest collected no tests")
        return 1
    return code


def answers(url: str, timeout: float = 20.0) -> bool:
    """Wait until ``url`` answers (the demo site, started in another process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.2)
    say(f"{url} did not answer within {timeout:.0f} s")
    return False


def up(args: list[str]) -> int:
    ensure_venv("")
    demo = "--no-demo" not in args
    args = [a for a in args if a != "--no-demo"]
    env = dict(os.environ)
    # dev.py's own instance (.state/dagster) gets the dev dagster.yaml, and its runs in
    # flight are ended on Ctrl-C; a DAGSTER_HOME given from outside is used as it is: its
    # dagster.yaml is its owner's, and it may hold runs that other daemons launched.
    own_instance = "DAGSTER_HOME" not in env
    dagster_home = Path(env.setdefault("DAGSTER_HOME", str(STATE / "dagster")))
    if own_instance:
        dagster_home.mkdir(parents=True, exist_ok=True)
        (dagster_home / "dagster.yaml").write_text(dev_instance(dagster_home))
        (dagster_home / STOP_FILE).unlink(missing_ok=True)  # left by a stop that was cut off
    else:
        say(f"using DAGSTER_HOME={dagster_home} as it is (its dagster.yaml, its runs)")
    code = run([str(BIN / "pipeline"), "db", "upgrade"], env=env)
    if code != 0:
        return code
    site = None
    if demo:
        # The demo's sources live on 127.0.0.1, which the SSRF guard refuses unless allowed.
        env.setdefault("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
        # The demo's feeds gain an item a minute: sensors that look every 10 s (instead
        # of production's 30) keep an item's wait for its run short (bench/freshness.py).
        env.setdefault("PIPELINE_SENSOR_INTERVAL_SECONDS", "10")
        # The demo's job board is pushed by the demo site's WebSub hub to `pipeline serve`.
        env.setdefault("PIPELINE_WEBSUB_CALLBACK_URL", f"http://127.0.0.1:{env.get('PIPELINE_WEB_PORT', '8790')}")
        # The operator's alerts (a failed run, a failing check) go to the demo site's
        # page, unless an operator channel is set: nothing that needs a person is untold.
        if "PIPELINE_OPERATOR_ALERT_URL" not in env:
            env["PIPELINE_OPERATOR_ALERT_URL"] = f"http://127.0.0.1:{env.get('PIPELINE_DEMO_PORT', '8780')}/operator"
            env["PIPELINE_OPERATOR_ALERT_SECRET"] = DEMO_OPERATOR_SECRET
    # The output feeds' web service (`pipeline serve`, http://127.0.0.1:8790/feeds/...),
    # and the WebSub callback: what a push brings, it processes and notifies at once.
    web = subprocess.Popen([str(BIN / "pipeline"), "serve"], cwd=ROOT, env=env)
    if demo:
        site = subprocess.Popen([str(BIN / "pipeline"), "demo", "serve"], cwd=ROOT, env=env)
        code = run([str(BIN / "pipeline"), "demo", "seed"], env=env)
        if code != 0 or not answers(f"http://127.0.0.1:{env.get('PIPELINE_DEMO_PORT', '8780')}/"):
            site.terminate()
            web.terminate()
            return code or 1
    try:
        port = args[args.index("-p") + 1] if "-p" in args[:-1] else "3000"  # the last -p wins
        say(f"starting the Dagster UI on http://127.0.0.1:{port} (Ctrl-C stops it)")
        stopping: list[bool] = []  # set on Ctrl-C: an exit after it is the stop asked for

        def before_stop() -> None:
            stopping.append(True)
            if own_instance:
                stop_runs(dagster_home, env)

        while True:
            started = time.monotonic()
            # `dg dev`, the supported command (`dagster dev` warns it is superseded); given
            # the workspace file, it starts what `dagster dev` started.
            code = run(
                [str(BIN / "dg"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", "3000", *args],
                env=env, before_stop=before_stop,
                after_exit=(lambda pgid: after_dagster(pgid, env)) if own_instance else kill_group,
            )
            ran = time.monotonic() - started
            if stopping or ran < RESTART_AFTER_SECONDS:
                return code  # stopped by Ctrl-C, or it could not start: a restart would fail the same way
            restarted(code, ran, env)
    finally:
        for companion in (site, web):
            if companion is not None:
                companion.terminate()  # Ctrl-C reached it too; this covers dagster dev exiting alone
                companion.wait(10)


def main() -> int:
    # Ctrl-C must reach dagster dev and the demo even when this was started from a
    # context that ignores SIGINT (a background job of a script): an ignored signal is
    # inherited by children, a handled one is reset to the default for them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    commands = {"test": test, "up": up}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
