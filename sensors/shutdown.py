"""``python -m sensors.shutdown terminate|mark``: end the runs in flight when the dev stack
stops (dev.py calls it on Ctrl-C), so that no run is left FAILED or STARTED by a shutdown.

A run's process is started by the code location server, not by ``dagster dev``: a
Ctrl-C reaches it, but the run captures the interrupt and carries on alone, after the UI
and the daemon are gone, to the end of its pass; killed, it stays STARTED in the run
records for ever (the default run launcher cannot check a run worker's health). So:

* ``terminate``, before dagster dev is stopped: asks Dagster to terminate every active
  run, as the UI's Terminate button does (a queued run is canceled at once; a started
  one is interrupted and ends CANCELED; its claims come back when their lease runs
  out), and waits for them to end, at most ``--timeout`` seconds;
* ``mark``, after dagster dev and every process of its group are gone: a run still not
  ended (launched by the daemon in between, or one that did not stop in time) is marked
  CANCELED, saying why.

Between the last look of ``terminate`` and the SIGINT that stops dagster dev, the daemon
could still start a run; that run got the SIGINT unasked for and Dagster recorded it
FAILED ("no user initiated termination request was found"). So the dev instance's run
launcher is :class:`StoppableRunLauncher`: once dev.py has written its stop file, which it
does before ``terminate``, a run the daemon dequeues is canceled instead of started.
"""

from __future__ import annotations

import argparse
import sys
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import dagster as dg

from sensors.runs import ACTIVE

REASON = "the dev stack (dev.py) stopped while this run was in flight"
IN_FLIGHT = [*ACTIVE, dg.DagsterRunStatus.CANCELING]  # not ended yet


class LaunchContext(Protocol):
    """What ``launch_run`` reads of the context Dagster passes it (Dagster does not export
    the context's class)."""

    @property
    def dagster_run(self) -> dg.DagsterRun: ...


class StoppableRunLauncher(dg.DefaultRunLauncher):
    """Dagster's default run launcher, which cancels the runs it is given instead of
    starting them once ``stop_file`` exists (dev.py writes it when the stack is stopping,
    and removes it when the stack starts). The daemon marks a run STARTING before it calls
    the launcher, so once the file exists every run that is or will be in flight is one
    ``terminate`` sees, or one this cancels."""

    def __init__(self, stop_file: str, inst_data: Any = None) -> None:
        super().__init__(inst_data=inst_data)
        self.stop_file = Path(stop_file)
        self.instance: weakref.ref[dg.DagsterInstance] | None = None

    def register_instance(self, instance: dg.DagsterInstance) -> None:
        """The instance this launcher serves (Dagster calls this when it loads it), kept
        weakly, as Dagster keeps it: the instance holds the launcher."""
        super().register_instance(instance)
        self.instance = weakref.ref(instance)

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"stop_file": dg.Field(str, description="a file whose existence means: start no run")}

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> StoppableRunLauncher:
        return cls(stop_file=config_value["stop_file"], inst_data=inst_data)

    def launch_run(self, context: LaunchContext) -> None:
        instance = self.instance() if self.instance is not None else None
        if self.stop_file.exists() and instance is not None:
            instance.report_run_canceled(context.dagster_run, message=REASON)
            return
        super().launch_run(context)  # type: ignore[arg-type]


def runs_in_flight(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT)))


def terminate(instance: dg.DagsterInstance, timeout: float) -> list[str]:
    """Ask every active run to stop, and any the daemon starts meanwhile; wait until none
    is in flight or ``timeout`` passes. Returns the ids of the runs still in flight."""
    asked: set[str] = set()
    deadline = time.monotonic() + timeout
    while True:
        for run in instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE)):
            if run.run_id not in asked:
                asked.add(run.run_id)
                try:
                    instance.run_coordinator.cancel_run(run.run_id)
                except Exception as error:  # noqa: BLE001 -- one we cannot reach is marked after the stop
                    print(f"could not terminate run {run.run_id}: {error}", file=sys.stderr)
        left = runs_in_flight(instance)
        if not left or time.monotonic() >= deadline:
            return [run.run_id for run in left]
        time.sleep(0.2)


def mark(instance: dg.DagsterInstance) -> list[str]:
    """Mark every run still in flight as CANCELED: call only once no run process is left."""
    left = runs_in_flight(instance)
    for run in left:
        instance.report_run_canceled(run, message=REASON)
    return [run.run_id for run in left]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sensors.shutdown", description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("terminate", "mark"))
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for runs to end")
    args = parser.parse_args(argv)
    with dg.DagsterInstance.get() as instance:
        if args.step == "terminate":
            left = terminate(instance, args.timeout)
            verb = "still in flight after the wait" if left else ""
        else:
            left = mark(instance)
            verb = "marked CANCELED" if left else ""
    if left:
        print(f"runs {verb}: {', '.join(left)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
