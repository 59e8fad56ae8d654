"""The README's run command as a new user runs it, on the embedded default.

`python3 dev.py up` starts the Dagster UI and daemon with the offline demo; listings
arrive and notifications reach the demo's webhook receiver; a real browser (Debian's
Chromium, driven by Selenium) sees the lineage and the running sensors; Ctrl-C stops
every process; a restart carries on with the same state. Nothing leaves 127.0.0.1.

The sensors look every 10 s here (PIPELINE_SENSOR_INTERVAL_SECONDS) instead of 30, to
keep the suite short; docs/runbook.md gives what the defaults take.

Marked ``quickstart``: each test starts `dev.py up` (minutes in all), so the default
run leaves them out and CI runs them as a step of their own
(`python3 dev.py test -m "quickstart or deploy"`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import feedparser
import pytest
import sqlalchemy as sa

from pipeline.storage import db, schema
from tests.helpers import add_source, free_port, wait_until

# One worker starts `dev.py up` once for the module (dev.py runs xdist with --dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.quickstart, pytest.mark.xdist_group("quickstart")]

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ("listings_raw", "listings", "notifications")
SENSORS = ("due_sources_sensor", "unprocessed_listings_sensor", "pending_notifications_sensor")
JOBS = ("ingest", "collect", "process", "notify", "health_checks")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


class Quickstart:
    """`python3 dev.py up` in its own session (process group), with its own state folder."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ui = f"http://127.0.0.1:{free_port()}"
        self.demo_port = free_port()
        self.web_port = free_port()
        self.log = state / "dev-up.log"
        self.env = {
            k: v for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "DAGSTER_HOME", "PIPELINE_ALLOW_NETWORKS")
        }
        self.env.update(PIPELINE_STATE_DIR=str(state), PIPELINE_DEMO_PORT=str(self.demo_port),
                        PIPELINE_WEB_PORT=str(self.web_port),
                        PIPELINE_SENSOR_INTERVAL_SECONDS="10")
        self.engine = db.create_engine(f"sqlite:///{state / 'pipeline.db'}")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "dev.py"), "up", *args, "-p", self.ui.rsplit(":", 1)[1]],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.started = time.monotonic()

    def graphql(self, query: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.ui}/graphql", data=json.dumps({"query": query}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["data"]

    def location_loaded(self) -> bool:
        try:
            data = self.graphql("{ workspaceOrError { ... on Workspace { locationEntries {"
                                " locationOrLoadError { __typename } } } } }")
        except OSError:
            return False
        entries = data["workspaceOrError"]["locationEntries"]
        return bool(entries) and all(e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries)

    def runs(self) -> int:
        data = self.graphql("{ runsOrError { ... on Runs { count } } }")
        return int(data["runsOrError"]["count"])

    def lingering(self, at_least: float) -> bool:
        """Whether the one active run is an ingest run waiting between passes, its next
        source at least ``at_least`` seconds away: its newest event is the collector's
        "lingering: the next source is due in N s", logged less than N - ``at_least``
        seconds ago."""
        data = self.graphql("{ runsOrError(filter: {statuses: [QUEUED, STARTING, STARTED]}) { ... on Runs {"
                            " results { pipelineName eventConnection { events {"
                            " ... on MessageEvent { message timestamp } } } } } } }")
        active = data["runsOrError"]["results"]
        if len(active) != 1 or active[0]["pipelineName"] != "ingest":
            return False
        events = [e for e in active[0]["eventConnection"]["events"] if e]
        if not events or not (found := re.fullmatch(r"lingering: the next source is due in (\d+) s",
                                                     events[-1]["message"])):
            return False
        return int(found[1]) - (time.time() - int(events[-1]["timestamp"]) / 1000) >= at_least

    def deliveries(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.demo_port}/deliveries.json", timeout=5) as r:
            return json.loads(r.read())

    def count(self, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())
        except sa.exc.OperationalError:  # not created yet
            return 0

    def alive(self) -> bool:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def interrupt(self, timeout: float = 90, *, group: bool = True) -> int:
        """Ctrl-C, as a terminal sends it (SIGINT to the whole process group), or as
        ``kill -INT`` does (to dev.py alone, which must pass it on)."""
        assert self.process is not None
        if group:
            os.killpg(self.process.pid, signal.SIGINT)
        else:
            os.kill(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout)

    def processes(self) -> list[int]:
        """Every process started with this stack's state folder in its environment, in
        whatever process group: dagster dev's, and the runs' that its code server starts."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if f"PIPELINE_STATE_DIR={self.state}".encode() in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def kill(self) -> None:
        if self.process is not None and self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory):
    app = Quickstart(tmp_path_factory.mktemp("quickstart"))
    app.start()
    yield app
    app.kill()
    app.engine.dispose()


def test_the_run_command_serves_the_ui_and_listings_arrive(quickstart: Quickstart) -> None:
    """Processes: `dev.py up` as a new user runs it, waited on until deliveries arrive."""
    try:
        wait_until("the UI and its code location", quickstart.location_loaded, timeout=180, every=2)
        ui_after = time.monotonic() - quickstart.started
        wait_until("a notification delivered to the demo receiver",
                   lambda: quickstart.deliveries()["total"] > 0, timeout=180)
    except AssertionError:
        print(quickstart.tail())
        raise
    delivered_after = time.monotonic() - quickstart.started
    print(f"UI up after {ui_after:.0f} s, first delivery after {delivered_after:.0f} s")
    assert quickstart.count(schema.sources) == 4
    assert quickstart.count(schema.listings) > 0
    # The notifier marks a notification sent after its send returned, so the receiver
    # sees a delivery before the row says so: wait for that state, not for a moment.
    sent = wait_until(
        "a notification marked sent",
        lambda: quickstart.count(schema.notifications, schema.notifications.c.status == "sent"),
        timeout=120,
    )
    received = quickstart.deliveries()
    # The receiver keeps only deliveries whose signature verified, once per key.
    assert sent > 0 and received["total"] > 0 and received["repeats_dropped"] == 0
    # The demo user's matches as an output feed, at the URL the demo printed, answered
    # by the `pipeline serve` that dev.py started.
    atom_url = (quickstart.state / "demo" / "feed-urls.txt").read_text().split()[0]
    assert atom_url.startswith(f"http://127.0.0.1:{quickstart.web_port}/feeds/")
    with urllib.request.urlopen(atom_url, timeout=10) as response:
        feed = feedparser.parse(response.read())
    assert not feed.bozo and feed.entries, feed
    data = quickstart.graphql("{ assetNodes { assetKey { path } dependencyKeys { path } } }")
    upstream = {n["assetKey"]["path"][0]: [d["path"][0] for d in n["dependencyKeys"]] for n in data["assetNodes"]}
    assert upstream == {"listings_raw": [], "listings": ["listings_raw"], "notifications": ["listings"]}
    assert "SupersessionWarning" not in quickstart.log.read_text(errors="replace"), "dev.py runs `dg dev`"
    # The UI shows each check's result beside the latest materialisation, never "Not
    # Evaluated" (which it showed for all of them before the stage runs evaluated them).
    wait_until("every asset check evaluated for its asset's latest materialisation",
               lambda: not _unevaluated_checks(quickstart), timeout=120, every=2)


def _unevaluated_checks(quickstart: Quickstart) -> list[str]:
    """The checks the UI would show as "Not Evaluated" beside their asset's latest
    materialisation (its Checks tab reads the same field)."""
    unevaluated = []
    for asset in ASSETS:
        data = quickstart.graphql(
            f'{{ assetNodeOrError(assetKey: {{path: ["{asset}"]}}) {{ ... on AssetNode {{ assetChecksOrError {{'
            " ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } } } }")
        checks = data["assetNodeOrError"]["assetChecksOrError"]["checks"]
        assert checks, asset
        unevaluated += [f"{asset}:{c['name']}" for c in checks if c["executionForLatestMaterialization"] is None]
    return unevaluated


def _browser() -> Any:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = f"no Chromium here ({CHROMIUM}, {CHROMEDRIVER}: apt-get install chromium chromium-driver)"
        if os.environ.get("PIPELINE_REQUIRE_BROWSER"):
            pytest.fail(message + "; PIPELINE_REQUIRE_BROWSER is set")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1600,1000"):
        options.add_argument(flag)
    # The driver is given: Selenium Manager must never try to download one.
    os.environ["SE_OFFLINE"] = "true"
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def test_a_real_browser_sees_the_lineage_and_the_running_sensors(quickstart: Quickstart) -> None:
    """Processes: `dev.py up` and a headless Chromium."""
    from selenium.webdriver.common.by import By

    wait_until("the UI", quickstart.location_loaded, timeout=180)
    screenshots = Path(os.environ.get("PIPELINE_SCREENSHOT_DIR") or quickstart.state / "screenshots")
    screenshots.mkdir(parents=True, exist_ok=True)
    browser = _browser()
    try:
        browser.get(f"{quickstart.ui}/asset-groups")
        body = lambda: browser.find_element(By.TAG_NAME, "body").text
        wait_until("the lineage graph", lambda: "Global asset lineage" in body()
                   and all(name in body() for name in ASSETS), timeout=60, every=1)
        _dismiss_welcome(browser)
        browser.save_screenshot(str(screenshots / "lineage.png"))

        browser.get(f"{quickstart.ui}/automation")
        wait_until("the sensors", lambda: all(name in body() for name in SENSORS), timeout=60, every=1)
        _dismiss_welcome(browser)
        # The rows come first; each toggle shows its sensor's state once a second query has
        # answered (seconds later on a loaded machine), so wait for it rather than read it once.
        for name in SENSORS:
            try:
                wait_until(f"{name} shown as running", partial(_switched_on, browser, name),
                           timeout=60, every=1)
            except AssertionError as e:
                browser.save_screenshot(str(screenshots / "automation-failed.png"))
                states = quickstart.graphql("{ repositoriesOrError { ... on RepositoryConnection {"
                                            " nodes { sensors { name sensorState { status } } } } } }")
                raise AssertionError(f"{e}; the daemon's states: {states}; see {screenshots}") from None
        browser.save_screenshot(str(screenshots / "automation.png"))

        # Each stage runs as a job of its own name, not an anonymous asset job.
        browser.get(f"{quickstart.ui}/jobs")
        wait_until("the stage jobs by name", lambda: all(name in body() for name in JOBS), timeout=60, every=1)
        _dismiss_welcome(browser)
        browser.save_screenshot(str(screenshots / "jobs.png"))

        # The backlog the sensors observe (when it changes) is plotted over time, beside the
        # pass metadata, on the asset's page.
        browser.get(f"{quickstart.ui}/assets/listings_raw?view=overview")
        wait_until("the Plots view of the asset's metadata", partial(_click, browser, "Plots"), timeout=60, every=1)
        wait_until("the observation plots", lambda: all(
            key in body() for key in ("due_sources_waiting", "due_sources_oldest_age_seconds", "failed_timeout")
        ), timeout=60, every=1)
        browser.save_screenshot(str(screenshots / "observation-plots.png"))

        # Each asset has a freshness check, judged by how long its work has waited.
        browser.get(f"{quickstart.ui}/assets/notifications?view=checks")
        wait_until("the checks", lambda: all(
            name in body() for name in ("freshness", "expired_leases_reclaimed", "dead_notifications")
        ), timeout=60, every=1)
        _dismiss_welcome(browser)
        browser.find_element(By.XPATH, "//*[normalize-space(text())='freshness']").click()
        wait_until("the freshness check's description", lambda: "has waited at most" in body(), timeout=60, every=1)
        browser.save_screenshot(str(screenshots / "checks.png"))
    finally:
        browser.quit()
    print(f"screenshots: {screenshots}")
    for shot in ("lineage", "automation", "jobs", "observation-plots", "checks"):
        assert (screenshots / f"{shot}.png").stat().st_size > 10_000, shot


def _switched_on(browser: Any, sensor: str) -> bool:
    """Whether the on/off switch in the Automation page's row for ``sensor`` (the row's last
    checkbox) is on; False while the row is missing or being re-rendered."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        row = browser.find_element(
            By.XPATH, f"//*[normalize-space(text())='{sensor}']/ancestor::*[.//input[@type='checkbox']"
            " and count(.//input[@type='checkbox']) >= 2][1]",
        )
        return bool(row.find_elements(By.CSS_SELECTOR, "input[type=checkbox]")[-1].is_selected())
    except (NoSuchElementException, StaleElementReferenceException):
        return False


def _click(browser: Any, label: str) -> bool:
    """Click the button labelled ``label``; False while it is not on the page yet, or
    is covered (by the first-visit dialog: dismissed here)."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By

    try:
        browser.find_element(By.XPATH, f"//button[normalize-space()='{label}']").click()
    except (NoSuchElementException, StaleElementReferenceException):
        return False
    except ElementClickInterceptedException:
        _dismiss_welcome(browser)
        return False
    return True


def _dismiss_welcome(browser: Any) -> None:
    """Dagster's first-visit "Join the community" dialog covers the page: skip it."""
    from selenium.webdriver.common.by import By

    for button in browser.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        if button.is_displayed():
            button.click()
            time.sleep(0.5)


def test_ctrl_c_stops_everything_and_a_restart_carries_on(quickstart: Quickstart) -> None:
    """Processes: `dev.py up`, stopped with Ctrl-C while an ingest run lingers (waited
    for: the state in which a clean stop used to leave a red run), and started again. The
    runs it leaves tell the truth: the lingering ingest run ended SUCCESS, any other run
    in flight CANCELED, no step skipped, no failure event."""
    import dagster as dg

    wait_until("the UI", quickstart.location_loaded, timeout=180)
    wait_until("an ingest run lingering between passes", lambda: quickstart.lingering(10), timeout=180, every=1)
    listings = quickstart.count(schema.listings)
    delivered = quickstart.deliveries()["total"]
    runs = quickstart.runs()

    assert quickstart.interrupt() == 0, quickstart.tail()
    assert "Dagster services shut down" in quickstart.tail()
    wait_until("every process of the group to exit", lambda: not quickstart.alive(), timeout=30, every=1)
    with dg.DagsterInstance.from_config(str(quickstart.state / "dagster")) as instance:
        ended = {f"{r.dagster_run.job_name} {r.dagster_run.run_id}": r.dagster_run.status
                 for r in instance.get_run_records()}
        failures = _failures(instance)
        skipped = [f"{e.dagster_event.step_key} in {e.run_id}" for r in instance.get_run_records()
                   for e in instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.STEP_SKIPPED)]
    assert any(name.startswith("ingest ") for name in ended), ended
    assert {status for name, status in ended.items() if name.startswith("ingest ")} == {
        dg.DagsterRunStatus.SUCCESS}, (ended, failures)
    # Another run in flight at that moment (the quarter-hourly health checks, say) is
    # terminated as the UI's Terminate does: CANCELED, never FAILURE.
    assert set(ended.values()) <= {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED}, (ended, failures)
    assert not skipped, "a healthy run has no skipped step"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{quickstart.demo_port}/", timeout=2)

    quickstart.start()
    wait_until("the UI again", quickstart.location_loaded, timeout=180)
    assert quickstart.count(schema.listings) >= listings, "the same database"
    assert quickstart.count(schema.sources) == 4, "seeding again added nothing"
    assert quickstart.deliveries()["total"] >= delivered, "the receiver kept what it got"
    assert quickstart.runs() >= runs > 0, "Dagster's run history is still there"
    assert quickstart.deliveries()["repeats_dropped"] == 0, "no notification was delivered twice"
    # SIGINT to dev.py alone (not its group) once stopped nothing: dev.py passes it on.
    assert quickstart.interrupt(group=False) == 0, quickstart.tail()
    wait_until("every process of the group to exit after a SIGINT to dev.py alone",
               lambda: not quickstart.alive(), timeout=60, every=1)


def test_ctrl_c_during_a_run_ends_it_canceled_and_leaves_no_process(quickstart: Quickstart) -> None:
    """A run in flight when Ctrl-C comes (its fetch hangs here) is terminated as the UI's
    Terminate does: it ends CANCELED, not FAILED, and not STARTED for ever; its process
    does not outlive dev.py; a restart fetches the source again."""
    import dagster as dg

    from tests.http_server import LocalServer
    from tests.test_collector import rss

    gate = threading.Event()
    server = LocalServer().start()
    body = rss([("slow-1", "Slow item")])

    def slow(handler: Any) -> None:
        gate.wait(120)  # until the test ends: the fetch is in flight when Ctrl-C comes
        handler.reply(200, body, {"Content-Type": "application/rss+xml"})

    server.routes["/slow"] = slow
    try:
        quickstart.start()
        wait_until("the UI", quickstart.location_loaded, timeout=180)
        with quickstart.engine.begin() as conn:
            add_source(conn, server.url("/slow"))
        wait_until("the slow source's fetch to start", lambda: any(r["path"] == "/slow" for r in server.requests),
                   timeout=120)
        assert quickstart.interrupt(timeout=120) == 0, quickstart.tail()
        wait_until("every process the stack started to exit (the run's too)",
                   lambda: not quickstart.alive() and not quickstart.processes(), timeout=60, every=1)
        with dg.DagsterInstance.from_config(str(quickstart.state / "dagster")) as instance:
            statuses = {r.dagster_run.run_id: r.dagster_run.status for r in instance.get_run_records()}
            failures = _failures(instance)
        assert dg.DagsterRunStatus.CANCELED in statuses.values(), statuses
        assert set(statuses.values()) <= {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED}, failures
        with quickstart.engine.connect() as conn:
            fetched = conn.execute(sa.select(schema.sources.c.last_fetched_at)
                                   .where(schema.sources.c.url == server.url("/slow"))).scalar_one()
        assert fetched is None, "the interrupted fetch stored nothing: its claim comes back"
    finally:
        gate.set()
        server.stop()


def test_a_killed_daemon_is_told_and_its_stack_started_again(tmp_path: Path) -> None:
    """Processes: `dev.py up --no-demo` with the operator's channel on a local receiver;
    its Dagster daemon is killed (SIGKILL, as the OOM killer does) once the stack has run
    the minute after which dev.py restarts what exits. dagster dev stopped everything
    when its daemon died, and dev.py exited with it: the embedded default stopped
    ingesting until someone noticed, and nobody was told."""
    from pipeline.notify.delivery import verify
    from tests.http_server import LocalServer

    receiver = LocalServer().start()
    receiver.routes["/operator"] = lambda h: h.reply(204)
    app = Quickstart(tmp_path)
    app.env.update(PIPELINE_OPERATOR_ALERT_URL=receiver.url("/operator"), PIPELINE_OPERATOR_ALERT_SECRET="s" * 24,
                   PIPELINE_ALLOW_NETWORKS="127.0.0.1/32")

    def daemons() -> list[int]:
        return [pid for pid in app.processes()
                if b"dagster._daemon" in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")]

    def restarts() -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in receiver.requests if r["path"] == "/operator"
                and verify("s" * 24, r["body"], r["headers"]) and json.loads(r["body"])["event"] == "stack_restarted"]

    try:
        app.start("--no-demo")
        wait_until("the UI and its code location", app.location_loaded, timeout=180, every=2)
        [daemon] = wait_until("the daemon", daemons, timeout=60)
        # The state dev.py's restart rule reads: dagster dev has run its first minute.
        wait_until("the stack's first minute", lambda: time.monotonic() - app.started > 65, timeout=120)
        os.kill(daemon, signal.SIGKILL)
        [told] = wait_until("the operator told of the restart", restarts, timeout=120)
        assert "dagster dev exited on its own" in told["text"] and "starting it again" in told["text"]
        wait_until("a new daemon", lambda: daemons() and daemons() != [daemon], timeout=120)
        wait_until("the UI again", app.location_loaded, timeout=180, every=2)
        assert app.alive()
        assert app.interrupt() == 0, app.tail()
        wait_until("every process of the group to exit", lambda: not app.alive(), timeout=60, every=1)
        assert len(restarts()) == 1, "Ctrl-C is a stop, not a death: no restart"
    except AssertionError:
        print(app.tail())
        raise
    finally:
        app.kill()
        app.engine.dispose()
        receiver.stop()


def _failures(instance: Any) -> dict[str, list[str]]:
    """Each failed run's job and the messages of its failure events, for an assertion's
    message: the run's own account of why it failed."""
    import dagster as dg

    failed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    return {
        f"{run.job_name} {run.run_id}": [
            f"{e.dagster_event.event_type_value}: {e.dagster_event.message or ''} {e.user_message or ''}"[:2000]
            for e in instance.all_logs(run.run_id)
            if (e.dagster_event is not None and e.dagster_event.is_failure) or e.level >= 40
        ]
        for run in failed
    }


def test_a_dagster_home_given_from_outside_is_used_as_it_is(tmp_path: Path) -> None:
    """dev.py writes its dev dagster.yaml, and ends runs in flight on Ctrl-C, only in its
    own instance: a DAGSTER_HOME a user gives may be shared with other daemons."""
    home = tmp_path / "their-dagster-home"
    home.mkdir()
    theirs = "telemetry:\n  enabled: false\n# their own settings\n"
    (home / "dagster.yaml").write_text(theirs)
    (tmp_path / "state").mkdir()
    app = Quickstart(tmp_path / "state")
    app.env["DAGSTER_HOME"] = str(home)
    app.start()
    try:
        wait_until("the UI", app.location_loaded, timeout=180)
        assert (home / "dagster.yaml").read_text() == theirs
        assert f"using DAGSTER_HOME={home} as it is" in app.tail()
        assert app.interrupt() == 0, app.tail()
        assert "terminating the runs in flight" not in app.tail()
        wait_until("every process the stack started to exit", lambda: not app.alive() and not app.processes(),
                   timeout=60, every=1)
    finally:
        app.kill()
        app.engine.dispose()
