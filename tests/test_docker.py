"""The production shape, run: deploy/docker-compose.yaml (the code location, Dagster's
webserver and daemon, all from deploy/Dockerfile's image) against PostgreSQL, every run
a container that the daemon's DockerRunLauncher starts (deploy/docker/dagster.yaml).

(a) the runs that collect, process and notify are containers of the image; (b) with the
collector's run limit at 3 and 600 sources, three collector runs hold claims at once
and every source is fetched exactly once, counted at the feed server, while every
service reports itself healthy and Prometheus scrapes the pipeline's metrics and holds
its alert rules (deploy/prometheus); (c) a run
container killed mid-pass (``docker kill``) loses nothing: its claims are taken again
after their lease, every item is stored and notified once, and Dagster marks the run
failed; (d) nothing is left running afterwards.

Marked ``docker``: CI runs it as a step of its own (`python3 dev.py test -m docker`).
It needs a Docker daemon (tests/docker_stack.py finds or starts one) and skips, saying
why, where none can be had, unless PIPELINE_REQUIRE_DOCKER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from assets.policies import run_worker
from pipeline.catalogue import feeds
from pipeline.storage import db, schema
from tests import docker_stack
from tests.docker_stack import Docker, NoDocker
from tests.fault_proxy import FaultProxy, postgres_upstream
from tests.helpers import add_source, free_port, wait_until
from tests.http_server import Handler
from tests.test_chaos import FILTERS, UNLIMITED, Site, check, seed, wait_done

# The suite's 600 s per test counts fixtures too: building the base and project images
# on a machine that has neither took 281 s on two busy cores (162 + 119), and the test
# itself about as long again, so the item ran past 600 s in its teardown. The build is
# work, not a wait; the test's own waits each wait for a state with their own limits.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
SOURCES = 600  # (b): fetched by three collector runs at once
LATE = 40  # (c): added later; one run holding some of them is killed
MAX_RUNS = 3
LEASE_SECONDS = 15
CONCURRENCY = 4  # fetches at once per run: 600 sources keep three runs busy
LOGIN = ("operator", "the-ui-password")  # the proxy's (deploy/proxy/Caddyfile)
OPERATOR_SECRET = "the-operator-alerts-secret-0123"  # signs what the operator is told


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    try:
        found = docker_stack.connect()
    except NoDocker as e:
        if os.environ.get("PIPELINE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"PIPELINE_REQUIRE_DOCKER=1 but {e}")
        pytest.skip(f"no Docker daemon: {e}")
    yield found
    found.stop()
    assert not docker_stack._alive(found.pid), "the dockerd this test started is gone"


@pytest.fixture(scope="module")
def image(docker: Docker) -> str:
    try:
        base, base_seconds = docker_stack.base_image(docker)
        docker_stack.wheelhouse(docker, base)
    except NoDocker as e:
        if os.environ.get("PIPELINE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"PIPELINE_REQUIRE_DOCKER=1 but {e}")
        pytest.skip(str(e))
    build_seconds = docker_stack.build_image(docker, base)
    print(f"base image {base}: {base_seconds:.1f} s; project image: {build_seconds:.1f} s")
    return docker_stack.IMAGE


@pytest.fixture(scope="module")
def service_images(docker: Docker, image: str) -> dict[str, str]:
    """The images of the prometheus, alertmanager and proxy services (tests/docker_stack.py)."""
    base = docker_stack.base_image(docker)[0]
    try:
        return {"PIPELINE_PROMETHEUS_IMAGE": docker_stack.prometheus_image(docker, base),
                "PIPELINE_ALERTMANAGER_IMAGE": docker_stack.alertmanager_image(docker, base),
                "PIPELINE_PROXY_IMAGE": docker_stack.caddy_image(docker, base)}
    except NoDocker as e:
        if os.environ.get("PIPELINE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"PIPELINE_REQUIRE_DOCKER=1 but {e}")
        pytest.skip(str(e))


def prometheus_config(folder: Path, metrics_port: int, alertmanager_port: int) -> Path:
    """deploy/prometheus, its scrape target on ``metrics_port`` and its Alertmanager on
    ``alertmanager_port`` (what PIPELINE_PROMETHEUS_CONFIG is for), scraping and
    evaluating every 5 s: an alert's path is waited for, not 30 s of intervals twice."""
    folder.mkdir()
    source = ROOT / "deploy" / "prometheus"
    (folder / "alerts.yml").write_text((source / "alerts.yml").read_text())
    config = (source / "prometheus.yml").read_text()
    for old, new in (('"127.0.0.1:9464"', f'"127.0.0.1:{metrics_port}"'),
                     ('"127.0.0.1:9093"', f'"127.0.0.1:{alertmanager_port}"'),
                     ("scrape_interval: 30s", "scrape_interval: 5s"), ("evaluation_interval: 30s", "evaluation_interval: 5s")):
        assert old in config, old
        config = config.replace(old, new)
    (folder / "prometheus.yml").write_text(config)
    return folder


def alertmanager_config(folder: Path, web_port: int) -> Path:
    """deploy/alertmanager, its webhook to the web service on ``web_port`` (what
    PIPELINE_ALERTMANAGER_CONFIG is for), a group sent 2 s after its first alert."""
    folder.mkdir()
    config = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    for old, new in (("http://127.0.0.1:8790/", f"http://127.0.0.1:{web_port}/"), ("group_wait: 30s", "group_wait: 2s")):
        assert old in config, old
        config = config.replace(old, new)
    (folder / "alertmanager.yml").write_text(config)
    return folder


def operator_alerts(site: Site) -> list[dict[str, Any]]:
    """What the operator's channel (the site's /operator) was told, each signed."""
    from pipeline.notify.delivery import verify

    found = []
    for request in list(site.server.requests):
        if request["path"] == "/operator":
            assert verify(OPERATOR_SECRET, request["body"], request["headers"]), "signed with the operator's secret"
            found.append(json.loads(request["body"]))
    return found


def dead_notification(engine: sa.Engine) -> list[int]:
    """A notification that gave up, on a listing of its own (already matched): what fires
    PipelineDeadNotifications. The ids of the rows made (listing, notification)."""
    with engine.begin() as conn:
        user = conn.execute(sa.select(schema.users.c.id).limit(1)).scalar_one()
        source = conn.execute(sa.select(schema.sources.c.id).limit(1)).scalar_one()
        listing = conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="dead-one", url="http://127.0.0.1/dead", content_hash="h",
            matched_at=sa.func.now()).returning(schema.listings.c.id)).scalar_one()
        note = conn.execute(sa.insert(schema.notifications).values(
            user_id=user, listing_id=listing, cluster_id=listing, channel="webhook", status="dead", attempts=8,
            last_error="HTTP 500").returning(schema.notifications.c.id)).scalar_one()
    return [listing, note]


# How long a request to a service of the stack may take to be answered: a bound for an
# answer, not a measure of speed. A check of a wrong password (bcrypt at Caddy's cost 14)
# took longer than 10 s on a loaded CI, the proxy sharing 2 busy cores with the stack.
ANSWER_SECONDS = 120


def prometheus_api(port: int, query: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{query}", timeout=ANSWER_SECONDS) as response:
        return json.loads(response.read())["data"]


def unhealthy(docker: Docker, project: str) -> dict[str, str]:
    """The project's containers whose healthcheck does not say healthy (yet), and what it says."""
    ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").split()
    states = dict(line.split(" ", 1) for line in docker(
        "inspect", "--format", "{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}",
        *ids).split("\n") if line) if ids else {}
    services = len(yaml.safe_load((ROOT / "deploy" / "docker-compose.yaml").read_text())["services"])
    return {name: state for name, state in states.items() if state != "healthy"} if len(states) == services else {
        "services": f"{len(states)} of {services} created"}


def through_proxy(port: int, path: str, login: tuple[str, str] | None, ca: str) -> int:
    """The status of a GET of ``path`` through the proxy, its certificate verified
    against ``ca`` (Caddy's own CA, PEM), with ``login`` or without one."""
    import base64
    import ssl
    import urllib.error

    request = urllib.request.Request(f"https://localhost:{port}{path}")
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_SECONDS,
                                    context=ssl.create_default_context(cadata=ca)) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def listening_addresses(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port`` on this host (/proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


class GatedSite(Site):
    """The chaos test's feeds and webhook receiver, each feed request counted and held
    until its phase's gate opens (the first SOURCES, then the LATE ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = (threading.Event(), threading.Event())
        self.requests: Counter[int] = Counter()
        self._lock = threading.Lock()

    def feed(self, h: Handler) -> None:
        n = int(h.path.split("?", 1)[1])
        with self._lock:
            self.requests[n] += 1
        self.gates[n >= SOURCES].wait(600)
        super().feed(h)


def tcp_url(url: str, proxy: FaultProxy | None, *, driver: str | None = None) -> str:
    """``url`` as a container on the host's network reaches it: over TCP (through
    ``proxy`` when the test's PostgreSQL listens on a Unix socket only)."""
    parsed = db.parse_url(url)
    if proxy is not None:
        parsed = parsed.set(host="127.0.0.1", port=proxy.port, query={})
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)


def running_run_containers(docker: Docker) -> list[str]:
    """The run containers (DockerRunLauncher labels each with its run id) still running."""
    return docker("ps", "-q", "--filter", "label=dagster/run_id").split()


def live_holders(engine: sa.Engine, *where: sa.ColumnElement[bool]) -> dict[str, int]:
    """The workers holding live leases on sources, and how many each."""
    s = schema.sources
    with engine.connect() as conn:
        rows = conn.execute(sa.select(s.c.claimed_by, sa.func.count()).where(
            s.c.locked_until > sa.func.now(), *where).group_by(s.c.claimed_by)).all()
    return {str(worker): int(n) for worker, n in rows}


def test_runs_in_containers_fetch_every_source_once_and_survive_a_killed_container(
        docker, image, service_images, pg_databases, tmp_path, monkeypatch):
    """The Compose stack and its run containers, with databases of its own (minutes)."""
    site = GatedSite()
    server_db = pg_databases.url("postgres")
    upstream = postgres_upstream(server_db)
    proxy = FaultProxy(upstream) if isinstance(upstream, str) else None
    pipeline_db = pg_databases.url(pg_databases.migrated())
    dagster_db = pg_databases.url(pg_databases.create())
    engine = db.create_engine(pipeline_db)
    seed(engine, site, SOURCES)
    # The secrets are files in a folder of their own (deploy/docker-compose.yaml), never
    # the containers' environment.
    site.server.routes["/operator"] = lambda h: h.reply(204)  # the operator's channel
    secrets = {"DATABASE_URL": tcp_url(pipeline_db, proxy),
               "DAGSTER_POSTGRES_URL": tcp_url(dagster_db, proxy, driver="postgresql+psycopg2"),
               "PIPELINE_OPERATOR_ALERT_URL": site.server.url("/operator"),
               "PIPELINE_OPERATOR_ALERT_SECRET": OPERATOR_SECRET,
               "PIPELINE_ALERTMANAGER_TOKEN": "the-alertmanager-token-0123456789"}
    (tmp_path / "secrets").mkdir(mode=0o700)
    for name, value in secrets.items():
        (tmp_path / "secrets" / name).write_text(value + "\n")
        (tmp_path / "secrets" / name).chmod(0o600)  # the entrypoint refuses a secret others can read
    env = {
        "PIPELINE_SECRETS_DIR": str(tmp_path / "secrets"),
        "PIPELINE_IMAGE": image,
        "DOCKER_SOCKET": docker.host.removeprefix("unix://"),
        "PIPELINE_CODE_LOCATION_PORT": str(free_port()),
        "PIPELINE_UI_PORT": str(free_port()),
        **service_images,
        "PIPELINE_PROXY_SITE": f"https://localhost:{(proxy_port := free_port())}",
        "PIPELINE_PUBLIC_URL": f"https://localhost:{proxy_port}",
        "PIPELINE_PROXY_HEALTH_PORT": str(free_port()),
        "PIPELINE_PROXY_PASSWORD_HASH": subprocess.run(
            ["caddy", "hash-password", "--plaintext", LOGIN[1]], capture_output=True, text=True, check=True).stdout.strip(),
        "PIPELINE_PROMETHEUS_PORT": str(prometheus_port := free_port()),
        "PIPELINE_METRICS_PORT": str(metrics_port := free_port()),
        "PIPELINE_WEB_PORT": str(web_port := free_port()),
        "PIPELINE_ALERTMANAGER_PORT": str(alertmanager_port := free_port()),
        "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
        **UNLIMITED,  # every delivery counted one by one (tests/test_chaos.py)
        "PIPELINE_SENSOR_INTERVAL_SECONDS": "5",
        "PIPELINE_COLLECTOR_MAX_RUNS": str(MAX_RUNS),
        "PIPELINE_CONCURRENCY": str(CONCURRENCY),
        "PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS),
        "PIPELINE_INGEST_LINGER_SECONDS": "20",
        "PIPELINE_HTTP_TIMEOUT_SECONDS": "600",
    }
    # Every source is on 127.0.0.1, one politeness group: let it take all three runs' fetches.
    subprocess.run([sys.executable, "-m", "pipeline.cli", "politeness", "set", "*", "--max-in-flight", "100",
                    "--interval", "0"], env={**os.environ, "DATABASE_URL": pipeline_db}, check=True)
    env["PIPELINE_PROMETHEUS_CONFIG"] = str(prometheus_config(tmp_path / "prometheus", metrics_port, alertmanager_port))
    env["PIPELINE_ALERTMANAGER_CONFIG"] = str(alertmanager_config(tmp_path / "alertmanager", web_port))
    stack = docker_stack.ComposeStack(docker, env, tmp_path / "compose.log", prefix="pltest", timeout=300)
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", secrets["DAGSTER_POSTGRES_URL"])
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "deploy" / "dagster.yaml").read_text())
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        stack.compose("up", "-d")
        # (b) three collector runs hold claims at once, while every feed is held.
        holders = wait_until(f"{MAX_RUNS} collector runs holding claims at once",
                             lambda: len(h := live_holders(engine)) >= MAX_RUNS and h, 300)
        site.gates[0].set()
        wait_done("every source fetched, processed and notified", engine, SOURCES, expected(site, SOURCES), 300,
                  also=lambda: runs_now(instance))
        assert set(site.requests) == set(range(SOURCES))
        assert set(site.requests.values()) == {1}, "every source fetched exactly once, counted at the server"
        wait_until("every service healthy", lambda: not unhealthy(docker, stack.project), 300, every=2)
        enabled = 'pipeline_sources{state="enabled"}'
        scraped = wait_until("Prometheus to have scraped the pipeline's metrics", lambda: prometheus_api(
            prometheus_port, f"query?query={urllib.parse.quote(enabled)}")["result"], 120, every=2)
        assert scraped[0]["value"][1] == str(SOURCES)
        [target] = prometheus_api(prometheus_port, "targets")["activeTargets"]
        assert target["health"] == "up" and target["labels"]["job"] == "listings-pipeline"
        loaded = {rule["name"] for group in prometheus_api(prometheus_port, "rules")["groups"] for rule in group["rules"]}
        written = {rule["alert"] for group in yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"]
                   for rule in group["rules"]}
        assert loaded == written, (loaded, written)  # every rule the file holds, loaded
        # An alert's path to a person: a notification gives up, Prometheus fires
        # PipelineDeadNotifications, Alertmanager sends it to the web service, which tells
        # the operator's channel, signed (the rules fired into the void before).
        made = dead_notification(engine)
        [told] = wait_until("the operator told of the dead notification by Alertmanager", lambda: [
            a for a in operator_alerts(site) if a["event"] == "alert_firing"
            and a["details"]["labels"]["alertname"] == "PipelineDeadNotifications"][:1], 300, every=2)
        assert told["title"].startswith("Prometheus alert PipelineDeadNotifications (warn): ")
        with engine.begin() as conn:  # gone again: the rest counts notifications exactly
            conn.execute(sa.delete(schema.notifications).where(schema.notifications.c.id == made[1]))
            conn.execute(sa.delete(schema.listings).where(schema.listings.c.id == made[0]))
        # The UI: on loopback only, and through the proxy with the login only.
        assert listening_addresses(int(env["PIPELINE_UI_PORT"])) == {"127.0.0.1"}
        [proxy] = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={stack.project}",
                         "--filter", "label=com.docker.compose.service=proxy").split()
        ca = docker("exec", proxy, "cat", "/data/caddy/pki/authorities/local/root.crt")
        assert through_proxy(proxy_port, "/server_info", None, ca) == 401
        assert through_proxy(proxy_port, "/server_info", ("operator", "wrong"), ca) == 401
        assert through_proxy(proxy_port, "/server_info", LOGIN, ca) == 200
        # Output feeds: the web service on loopback only; through the proxy without the
        # login (a reader cannot log in: the token in the URL is the key).
        assert listening_addresses(int(env["PIPELINE_WEB_PORT"])) == {"127.0.0.1"}
        with engine.begin() as conn:
            token = feeds.add_feed(conn, next(iter(FILTERS))).token
        assert through_proxy(proxy_port, f"/feeds/{token}.atom", None, ca) == 200
        assert through_proxy(proxy_port, "/feeds/" + "x" * 32 + ".atom", None, ca) == 404
        assert through_proxy(proxy_port, "/websub/" + "x" * 43, None, ca) == 404, "the WebSub callback is open"
        assert through_proxy(proxy_port, "/healthz", None, ca) == 401, "only /feeds/ and /websub/ are open"
        runs = {run_worker(r.dagster_run.run_id): r for r in instance.get_run_records()}
        assert set(holders) <= set(runs), f"the claims' holders are Dagster runs: {holders}"

        # (c) a run killed in the middle of its pass.
        with engine.begin() as conn:
            for n in range(SOURCES, SOURCES + LATE):
                add_source(conn, site.server.url(f"/feed?{n}"), fetch_interval_minutes=10080)
        late = schema.sources.c.url.in_([site.server.url(f"/feed?{n}") for n in range(SOURCES, SOURCES + LATE)])
        def fetching_victim() -> str | None:
            """A run holding late sources whose every request has reached the server (it
            is in the middle of fetching them, held there by the gate)."""
            s = schema.sources
            with engine.connect() as conn:
                rows = conn.execute(sa.select(s.c.claimed_by, s.c.url).where(
                    late, s.c.locked_until > sa.func.now())).all()
            by_worker: dict[str, list[int]] = {}
            for worker, url in rows:
                by_worker.setdefault(str(worker), []).append(int(url.rsplit("?", 1)[1]))
            return next((w for w, ns in by_worker.items() if all(site.requests[n] for n in ns)), None)

        victim_worker = wait_until("a run fetching late sources (held at the server)", fetching_victim, 300)
        victim = next(r for r in instance.get_run_records() if run_worker(r.dagster_run.run_id) == victim_worker)
        container = victim.dagster_run.tags["docker/container_id"]
        held = set(live_holders(engine, late))
        docker("kill", container)
        killed_requests = dict(site.requests)
        site.gates[1].set()
        wait_done("the killed run's sources fetched again, everything processed and notified", engine,
                  SOURCES + LATE, expected(site, SOURCES + LATE), 300, also=lambda: runs_now(instance))
        check(engine, site, SOURCES + LATE)
        wait_until("Dagster to mark the killed run failed (run monitoring)",
                   lambda: instance.get_run_by_id(victim.dagster_run.run_id).status
                   == dg.DagsterRunStatus.FAILURE, 300, every=2)
        twice = {n for n, k in site.requests.items() if k > 1}
        assert twice and twice <= {n for n in killed_requests if n >= SOURCES}, \
            "only the killed run's sources were fetched again"
        assert max(site.requests.values()) == 2
        print(f"killed run {victim.dagster_run.run_id} (holders then: {held}); re-fetched {len(twice)} sources")

        # (a) every run was a container of the image, launched by the daemon's run launcher.
        # Stop the daemon first: its sensors launch runs for as long as it lives, and a run
        # launched after the last look would still be running at (d). A run it queued but
        # never launched has no container (start_time None, checked below).
        stack.compose("stop", "-t", "30", "daemon")
        wait_until("every launched run to end (the lingering ones too)", lambda: not instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])) and not running_run_containers(docker),
                   300, every=2)
        records = instance.get_run_records()
        statuses = Counter(r.dagster_run.status.value for r in records)
        for record in records:
            print(describe(instance, record))
        failed = [r.dagster_run.run_id for r in records if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
        assert failed == [victim.dagster_run.run_id], "no run failed but the one killed"
        for record in records:
            run = record.dagster_run
            if record.start_time is None:
                # A retry that never launched carries its parent's tags (Dagster copies them).
                assert run.status != dg.DagsterRunStatus.SUCCESS
                continue
            assert "docker/container_id" in run.tags, f"run {run.run_id} ({run.job_name}) ran in a container"
            inspected = docker("inspect", "--format", "{{.Config.Image}} {{index .Config.Labels \"dagster/run_id\"}}",
                               run.tags["docker/container_id"]).split()
            assert inspected == [image, run.run_id]
            if run.status == dg.DagsterRunStatus.SUCCESS:
                # Where a run container's own output goes (docs/deployment.md): its log,
                # kept with the exited container.
                logs = subprocess.run(["docker", "logs", run.tags["docker/container_id"]], env=docker.env,
                                      capture_output=True, text=True, check=True, timeout=60)
                assert run.run_id in logs.stdout + logs.stderr, f"run {run.run_id}'s container log"
        # No container, service or run, holds a secret in its configuration (`docker
        # inspect`): each read them from the mounted folder.
        services = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={stack.project}").split()
        run_containers = [r.dagster_run.tags["docker/container_id"] for r in records if r.start_time is not None]
        assert services and run_containers
        for container in services + run_containers:
            configured = docker("inspect", container)
            assert not [name for name, value in secrets.items() if value in configured], container
        container_runs = {r.dagster_run.run_id for r in records}
        for asset in ("listings_raw", "listings", "notifications"):
            event = instance.get_latest_materialization_event(dg.AssetKey(asset))
            assert event is not None and event.run_id in container_runs, f"{asset} materialized by a container run"
        print(f"runs: {len(records)} {dict(statuses)}; jobs {Counter(r.dagster_run.job_name for r in records)}")
    finally:
        site.gates[0].set()
        site.gates[1].set()
        # What a failure is read from (pytest keeps the folders of its last runs).
        stack.keep_logs(tmp_path / "logs", timeout=120, each=60)
        print(f"the services' and run containers' logs: {tmp_path / 'logs'}")
        try:
            stack.compose("down", "-v", "-t", "30")
        finally:
            leftover = docker("ps", "-aq", "--filter", "label=dagster/run_id").split()
            running = running_run_containers(docker)
            if leftover:
                docker("rm", "-f", *leftover)
            engine.dispose()
            site.server.stop()
            print((tmp_path / "compose.log").read_text(errors="replace")[-3000:])
    # (d) nothing left running: no service, no run container.
    assert running == [], "every run container had exited"
    assert docker("ps", "-q", "--filter", f"label=com.docker.compose.project={stack.project}").split() == []


def runs_now(instance: dg.DagsterInstance) -> str:
    """Every run of ``instance`` as ``describe`` tells it, one or a few lines each."""
    return "runs:\n" + "\n".join(describe(instance, record) for record in instance.get_run_records())


def describe(instance: dg.DagsterInstance, record: dg.RunRecord) -> str:
    """A run in one line: its status, parent, container, and for a failure, why."""
    run = record.dagster_run
    line = (f"run {run.run_id[:8]} {run.job_name} {run.status.value} parent "
            f"{(run.parent_run_id or '-')[:8]} container {run.tags.get('docker/container_id', '-')[:12]}")
    if run.status == dg.DagsterRunStatus.FAILURE:
        for event in instance.all_logs(run.run_id):
            data = event.dagster_event.event_specific_data if event.dagster_event else None
            error = getattr(data, "error", None)
            if error is not None:
                line += f"\n    {event.message[:200]}\n    {error.to_string()[-1500:]}"
            elif event.dagster_event is not None and "run worker" in event.message:
                line += f"\n    {event.message[:300]}"
    return line


def expected(site: Site, sources: int) -> int:
    return len(site.expected(sources))
