"""The dev stack's stop (sensors/shutdown.py, dev.py): once dev.py has written its stop
file, the dev instance's run launcher cancels the runs the daemon hands it instead of
starting them. Without it, a run the daemon started between the runs' termination and
the SIGINT that stops dagster dev got that SIGINT unasked for and ended FAILED (it failed
CI once in tests/test_quickstart.py). The whole stop, with a daemon, is
tests/test_quickstart.py's."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.launcher import LaunchRunContext

from sensors.shutdown import REASON, StoppableRunLauncher

ROOT = Path(__file__).resolve().parent.parent


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def dev_home(tmp_path: Path):
    """A Dagster instance with the dagster.yaml dev.py writes, and dev.py's stop file."""
    dev = _dev()
    (tmp_path / "dagster.yaml").write_text(dev.dev_instance(tmp_path))  # type: ignore[attr-defined]
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        yield instance, tmp_path / dev.STOP_FILE  # type: ignore[attr-defined]


def test_the_dev_instance_shows_no_first_visit_modal_and_sends_no_telemetry(dev_home):
    """dev.py's dagster.yaml turns off what a local instance can: the UI's community modal
    on the first visit (nux) and telemetry."""
    instance, _ = dev_home
    assert not instance.nux_enabled and instance.get_settings("telemetry") == {"enabled": False}


def _starting_run(instance: dg.DagsterInstance) -> dg.DagsterRun:
    """A run as the daemon hands it to the launcher: STARTING."""
    return instance.add_run(dg.DagsterRun(job_name="collect", run_id=str(uuid.uuid4()),
                                          status=dg.DagsterRunStatus.STARTING))


def test_once_the_stack_is_stopping_a_run_handed_to_the_launcher_is_canceled_not_started(dev_home) -> None:
    instance, stop_file = dev_home
    assert isinstance(instance.run_launcher, StoppableRunLauncher)
    stop_file.touch()
    run = _starting_run(instance)
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    ended = instance.get_run_by_id(run.run_id)
    assert ended is not None and ended.status == dg.DagsterRunStatus.CANCELED
    messages = [e.message for e in instance.all_logs(run.run_id)]
    assert any(REASON in m for m in messages), messages


def test_while_the_stack_runs_the_launcher_starts_runs_as_dagsters_default_does(dev_home) -> None:
    """No stop file: the launch goes to Dagster's DefaultRunLauncher, which needs the
    daemon's workspace to reach the code server (none here: its own error says so)."""
    instance, stop_file = dev_home
    assert not stop_file.exists()
    run = _starting_run(instance)
    with pytest.raises(dg.DagsterInvariantViolationError, match="requires a workspace"):
        instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    started = instance.get_run_by_id(run.run_id)
    assert started is not None and started.status == dg.DagsterRunStatus.STARTING


def test_a_run_terminated_while_it_lingers_between_passes_ends_without_a_failure(dev_home, engine, db_url):
    """An `ingest` run waiting for its next source has nothing in hand: a termination then
    (Ctrl-C, the UI's Terminate) ends it cleanly, with no failure event and no ERROR line;
    every Ctrl-C of the dev stack once added a red run with a stack trace. Starts the job
    in a process of its own (`dagster job execute`, which turns a SIGINT into Dagster's
    interrupt as a run worker does) and waits for the state where it lingers."""
    import os
    import signal
    import subprocess
    import sys
    from datetime import timedelta

    from tests.helpers import add_source, now, wait_until

    instance, _ = dev_home
    with engine.begin() as conn:  # due within the linger, not now: the run waits for it
        add_source(conn, "http://127.0.0.1:9/feed", next_fetch_at=now() + timedelta(minutes=10))
    config = instance.root_directory + "/ingest.yaml"
    Path(config).write_text("ops:\n  stages:\n    config:\n      linger_seconds: 1800\n")
    env = {**os.environ, "DATABASE_URL": db_url, "DAGSTER_HOME": instance.root_directory}
    job = subprocess.Popen([sys.executable, "-m", "dagster", "job", "execute", "-m", "pipeline.definitions",
                            "-j", "ingest", "-c", config], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def messages() -> list[str]:
            return [e.user_message or e.message or "" for run in instance.get_runs()
                    for e in instance.all_logs(run.run_id)]

        wait_until("the run to linger", lambda: any(m.startswith("lingering: the next source is due")
                                                    for m in messages()), timeout=120, every=0.5)
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    [run] = instance.get_runs()
    events = instance.all_logs(run.run_id)
    failures = [e.message for e in events if (e.dagster_event and e.dagster_event.is_failure) or e.level >= 40]
    assert not failures, (failures, stderr[-2000:])
    assert run.status == dg.DagsterRunStatus.SUCCESS, stderr[-2000:]
    assert any("terminated while lingering" in (e.user_message or "") for e in events)
