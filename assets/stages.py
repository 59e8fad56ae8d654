"""The pipeline's three assets, ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier), defined by one step that can run any of them.

One step, because an ``ingest`` run works all three in turn and, when it lingers, again
each time sources come due: with an asset per step, the collector's step had to make the
other two assets' passes itself and the steps after it were skipped, so the run view
showed neither who made what nor a healthy run. Here the step is the one op of all three
assets (a subsettable ``multi_asset``): a job selects the stages it runs (``ingest`` all
three, ``collect``/``process``/``notify`` one), and every materialisation comes from the
step that defines its asset. The passes themselves are assets/passes.py; the logic is in
``pipeline``.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Self, TypeVar

import dagster as dg

from assets import passes
from assets.policies import LINGER_TAG, STEP_RETRY, ends_when_terminated, stage_kinds
from pipeline.backends import log_failure
from pipeline.notify.notifier import FilterCatalogue
from pipeline.storage.status import next_due_in
from resources import PipelineDatabase

LISTINGS_RAW = dg.AssetKey("listings_raw")
LISTINGS = dg.AssetKey("listings")
NOTIFICATIONS = dg.AssetKey("notifications")
STAGES_OP = "stages"  # the step's name: a run's config for it is {"ops": {STAGES_OP: {"config": ...}}}

# A lingering run looks for due sources at least this often (one refreshed by hand).
POLL_SECONDS = 5.0
# While a lingering run's collector pass fetches, what it fetched is processed and
# notified this often (``FollowUps``).
FOLLOW_SECONDS = 1.0
_logger = logging.getLogger(__name__)


class StageConfig(dg.Config):
    # listings_raw
    max_sources: int | None = None  # claim at most this many sources in a pass
    concurrency: int | None = None  # fetches at once; default PIPELINE_CONCURRENCY
    # Keep taking sources as they come due for this long (ingest runs the sensor starts:
    # PIPELINE_INGEST_LINGER_SECONDS), processing and notifying after each pass.
    linger_seconds: int = 0
    # listings
    max_rows: int | None = None  # claim at most this many raw rows in this run
    # notifications
    max_listings: int | None = None  # match at most this many listings in this run
    max_notifications: int | None = None  # deliver at most this many notifications


def _spec(key: dg.AssetKey, deps: list[dg.AssetKey], description: str) -> dg.AssetSpec:
    # skippable: a pass that changes nothing records an observation (assets/passes.py).
    return dg.AssetSpec(key, deps=deps, group_name="pipeline", kinds=stage_kinds(), owners=["team:pipeline"],
                        description=description, skippable=True)


@dg.multi_asset(
    name=STAGES_OP,
    specs=[
        _spec(LISTINGS_RAW, [], "Raw items of due sources: fetches every due source once, stores new "
              "and changed items, reschedules each source (cadence or backoff). A pass that stores no "
              "item records an observation (its fetches in its metadata), not a materialisation. An "
              "ingest run lingers: while a source comes due within its linger, it processes and "
              "notifies what it collected, waits for that source and collects again, one run instead "
              "of one per fetch."),
        _spec(LISTINGS, [LISTINGS_RAW], "Listings normalised from raw rows: claims unprocessed raw rows "
              "oldest first, upserts their listings and marks them processed, batch by batch. A pass "
              "that claims no row records an observation, not a materialisation, unless it follows "
              "a collection that stored items in the same run (it has taken them in)."),
        _spec(NOTIFICATIONS, [LISTINGS], "Notifications of matching listings: matches listings not "
              "matched yet against every enabled filter (one per user and listing), then delivers the "
              "due ones. A pass that matches and delivers nothing records an observation, not a "
              "materialisation, unless it follows one that changed the listings in the same run."),
    ],
    can_subset=True,
    # Steps of the stages at once across all runs (deploy/dagster.yaml's default limit);
    # each stage's runs are capped by the run queue's pipeline/stage limits.
    pool="stages",
    retry_policy=STEP_RETRY,
)
def stage_assets(
    context: dg.AssetExecutionContext, config: StageConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    run_id = context.run.run_id
    selected = context.selected_asset_keys
    after: list[Callable[[], passes.Pass]] = []  # the stages after the collector, in order
    # The same while a lingering run's collector pass fetches, each on a thread of its
    # own (``FollowUps``): matching apart from delivering.
    alongside: list[Callable[[], passes.Pass]] = []
    if LISTINGS in selected:
        after.append(lambda: passes.process(database, run_id, max_rows=config.max_rows))
        alongside.append(after[-1])
    if NOTIFICATIONS in selected:
        filters = FilterCatalogue(database.engine)  # read once per run, kept between its passes

        def notify(*, matching: bool = True, delivering: bool = True) -> passes.Pass:
            return passes.notify(database, run_id, max_listings=config.max_listings,
                                 max_notifications=config.max_notifications, catalogue=filters,
                                 matching=matching, delivering=delivering)

        after.append(notify)
        alongside += [lambda: notify(delivering=False), lambda: notify(matching=False)]
    carried = CarriedPasses()  # follow-ups made while a lingering run's collector pass fetched
    follow = [carried.into(stage) for stage in after]
    with ends_when_terminated():
        chain: list[passes.Pass] = []
        if LISTINGS_RAW in selected:
            try:
                done = _collect(context, config, database, follow, FollowUps(alongside, carried))
            except TerminatedBetweenPasses as stopped:
                context.log.info("terminated while lingering between passes: the run ends here, its work done")
                if stopped.in_hand is not None:
                    yield from passes.results(context, [stopped.in_hand], database)
                return
            if done is None:
                return  # a lingering run's last pass was recorded and followed as it ended
            chain.append(done)
        chain += [stage() for stage in follow]
        yield from passes.results(context, chain, database)


def _collect(
    context: dg.AssetExecutionContext, config: StageConfig, database: PipelineDatabase,
    follow: list[Callable[[], passes.Pass]], following: "FollowUps",
) -> passes.Pass | None:
    """A collector pass; in a run that lingers, a pass each time sources come due until its
    linger ends, each but the last recorded and followed by ``follow`` (process, notify)
    at once. A lingering run's pass claims until the linger ends, ``following`` taking
    what it fetched meanwhile. The pass left for the step to record as its result, or
    None when every pass was recorded already."""
    run_id = context.run.run_id
    deadline = time.monotonic() + config.linger_seconds
    if until := context.run.tags.get(LINGER_TAG):
        # Requested by the sensor: linger no longer than the tag it reads says. A run that
        # starts after that still takes what is due then (pipeline/queue/workpool.py).
        deadline = min(deadline, time.monotonic() + datetime.fromisoformat(until).timestamp() - time.time())

    def collect() -> passes.Pass:
        began = time.monotonic()
        done = one_pass()
        if done.worked:  # when each pass ran: lanes of runs in step show here
            context.log.info(f"collector pass: {done.metadata.get('claimed', 0)} sources claimed in "
                             f"{time.monotonic() - began:.1f} s")
        return done

    def one_pass() -> passes.Pass:
        if config.linger_seconds <= 0:
            return passes.collect(database, run_id, max_sources=config.max_sources, concurrency=config.concurrency)
        # Lingering: under a steady stream of due sources a pass never runs out of work.
        # It claims until the linger ends, and the stages after it take what it fetched
        # meanwhile (it ran for as long as sources came due, and processing and
        # notifying waited for it: on the simulated internet, for ever).
        with following:
            return passes.collect(database, run_id, max_sources=config.max_sources,
                                  concurrency=config.concurrency, claim_until=deadline)

    done: passes.Pass | None = collect()
    while config.linger_seconds > 0 and (wait := _between_passes(done, lambda: _due_within(database, deadline))) is not None:
        if done is not None:
            # Lingering: this pass's items go through now, before the run waits for the
            # next source.
            began = time.monotonic()
            passes.log(context, [done, *(stage() for stage in follow)], database)
            context.log.info(f"follow-ups after the pass, recorded in {time.monotonic() - began:.1f} s")
            done = None
            if wait > 0:
                context.log.info(f"lingering: the next source is due in {wait:.0f} s")
        if wait > 0:
            _between_passes(None, lambda: time.sleep(min(wait, POLL_SECONDS)))
            continue
        done = collect()
        if not done.worked:  # it was due, but another worker took it first
            _between_passes(done, lambda: time.sleep(POLL_SECONDS))
    return done


class CarriedPasses:
    """Follow-up passes made while a collector pass fetched (``FollowUps``), carried to
    the run's next follow-up of the same stage and recorded as part of it (their counts
    added): the run's record has the same passes in the same order however its fetching
    and its follow-ups interleaved in time."""

    def __init__(self) -> None:
        self._passes: dict[dg.AssetKey, list[passes.Pass]] = {}
        self._lock = threading.Lock()

    def add(self, done: passes.Pass) -> None:
        with self._lock:
            self._passes.setdefault(done.asset, []).append(done)

    def into(self, stage: Callable[[], passes.Pass]) -> Callable[[], passes.Pass]:
        """``stage``, its result with the passes carried for its asset added in."""
        def run() -> passes.Pass:
            done = stage()
            with self._lock:
                earlier = self._passes.pop(done.asset, [])
            return passes.merged([*earlier, done])
        return run


class FollowUps:
    """While a lingering run's collector pass fetches, the stages after it (``after``:
    process, match, deliver) run each on a thread of its own, so what the pass has
    fetched goes out within seconds, not when the pass ends; their passes that worked
    are ``carried`` to the run's record. A stage's pass starts at most every ``every``
    seconds, and at once after one that took longer: on a busy machine (the hour at
    100,000 sources) the stages took turns on one thread and waited a second after
    each round, and each item waited for the slowest stage's round, twice (fetch to
    delivery p95 14 s). A follow-up that fails (the database restarting) is tried again a
    round later, logged when it starts failing and when it works again (a traceback each
    second of a database outage buried everything else in the run's log); the run's own
    follow-up after the pass reports a failure that lasts, and a step retry is told
    (``retry_alerts``)."""

    clock: Callable[[], float] = staticmethod(time.monotonic)  # how long a pass took

    def __init__(self, after: list[Callable[[], passes.Pass]], carried: CarriedPasses,
                 every: float = FOLLOW_SECONDS) -> None:
        self.after, self.carried, self.every = after, carried, every
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        """Follow one pass (a run makes one per pass it lingers for)."""
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(stage, self._stop), name=f"follow-collector-{i}",
                                          daemon=True) for i, stage in enumerate(self.after)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _loop(self, stage: Callable[[], passes.Pass], stop: threading.Event) -> None:
        failed = 0  # rounds failed in a row: an outage is logged once as it starts, once as it ends
        while not stop.is_set():
            began = self.clock()
            try:
                done = stage()
            except Exception as exc:  # noqa: BLE001 (tried again next round; the run's own follow-up reports one that lasts)
                if not failed:
                    log_failure(_logger, exc, "a follow-up pass during the collector's failed; trying again each "
                                "round, quietly until one works")
                failed += 1
                stop.wait(self.every)
                continue
            if failed:
                _logger.warning("a follow-up pass during the collector's works again, after %d failed rounds", failed)
                failed = 0
            if done.worked:
                self.carried.add(done)
            stop.wait(max(0.0, began + self.every - self.clock()))


class TerminatedBetweenPasses(Exception):
    """A lingering run was terminated while it waited, between passes; ``in_hand`` is the
    pass it had made and not recorded yet, if any."""

    def __init__(self, in_hand: passes.Pass | None) -> None:
        super().__init__("terminated between passes")
        self.in_hand = in_hand


T = TypeVar("T")


def _between_passes(in_hand: passes.Pass | None, wait: Callable[[], T]) -> T:
    """``wait()`` (a sleep, or a look at when the next source is due); a termination
    meanwhile (the UI's Terminate, dev.py's Ctrl-C) raises TerminatedBetweenPasses: no
    pass is under way, so the run records what it has and ends cleanly, with no failure
    event and no red run. A termination within a pass still ends the step failed
    (``ends_when_terminated``)."""
    try:
        return wait()
    except dg.DagsterExecutionInterruptedError:
        raise TerminatedBetweenPasses(in_hand) from None


def _due_within(database: PipelineDatabase, deadline: float) -> float | None:
    """Seconds until the next source comes due, when that is before ``deadline``
    (monotonic); None when none comes due before it."""
    with database.engine.connect() as conn:
        due_in = next_due_in(conn)
    return due_in if due_in is not None and due_in <= deadline - time.monotonic() else None
