"""The pipeline on the simulated internet for a while, audited (issue 36): the local setting.

Everything on this machine, in processes of its own: the simulated internet
(bench/internet.py: hosts on 127.1.x.y, realistic latency and faults, items appearing
as a Poisson process, each with keywords), a webhook receiver that logs every delivery
it gets, and the pipeline's three stages, each a loop of passes in its own process (the
collector, the processor, the notifier: what the Dagster runs do, without Dagster)
against a PostgreSQL database of its own. Users are the simulator's plan: each with a
webhook to the receiver and one filter per keyword it follows, so that who must hear
of each item is known apart from the pipeline. The notifier's matching and delivering
are two loops of their own, as a lingering run has them (assets/stages.py, a thread
each): one loop doing both in turn delivered a flood for minutes while the listings
behind it waited to be matched, and the audit counted them lost.

After ``--warmup`` minutes, for ``--minutes`` (then ``--drain`` more, for the last
items to arrive), it samples each stage's resident memory
and the database's size per table; then it audits every item that appeared in the
window against what the receiver got:

* lost: a user who follows one of the item's keywords got no delivery of it, though its
  feed listed it (a 200 answer) at least 30 s before the stages stopped (those whose
  source was not fetched again in time, being backed off, are counted apart);
* duplicated: a user got it more than once (by the message's ``webhook-id``, and by
  item);
* unexpected: a user got an item none of whose keywords they follow;
* appearance to delivery and fetch to delivery, p50 / p95 / p99;
* schedule lateness (a fetch's start less its ``next_fetch_at``), p50 / p95 / p99;
* the stages' CPU per fetch and per delivered notification.

The one-by-one alert limit is lifted (``PIPELINE_ALERT_LIMIT``): every match is a
message of its own, which is what the audit counts.

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/soak.py --database-url postgresql://postgres@127.0.0.1:5432/test   # about 8 minutes

It creates (and drops) its own database, ``bench_soak_<pid>_<random>``, and leaves its
logs and report in ``--out`` (default: a new directory under /tmp).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit, load, process_seconds, scratch_database, unique_name  # noqa: E402
from pipeline.catalogue.sources import import_sources, make_spec  # noqa: E402
from pipeline.catalogue.users import add_filter, add_user, set_delivery  # noqa: E402
from pipeline.core.settings import DEFAULT_MAX_RESPONSE_BYTES, Settings  # noqa: E402
from pipeline.storage import db, migrate, schema  # noqa: E402
from pipeline.storage.politeness_groups import set_limits  # noqa: E402

HERE = Path(__file__).resolve().parent
# An item counts as lost only if its feed listed it this long before the stages stopped.
FETCHED_BEFORE_END = 30.0
SECRET = "whsec_" + "c29hay1iZW5jaC1zZWNyZXQta2V5LTAxMjM0NTY3"  # the receiver does not check it


# -- the receiver ------------------------------------------------------------------------

def receive(port: int, log_path: str, told: Any = None) -> None:
    """A webhook receiver on 127.0.0.1:``port``: logs each delivery (time, user, the
    message's webhook-id, the listings' links) as a JSON line and answers 200. Sends
    ``told`` (a Connection) "listening" once it listens, or why it cannot; ends when
    the process that started it is gone (a run stopped before its teardown left its
    receiver holding the port, and the next run's deliveries went to the old log)."""
    import asyncio
    import socket

    parent = os.getppid()
    try:
        listener = socket.create_server(("127.0.0.1", port))  # first: a port taken is told whatever else is missing
        from aiohttp import web
    except Exception as exc:  # told, and the run stops naming it
        if told is not None:
            told.send(f"{type(exc).__name__}: {exc}")
        return
    out = open(log_path, "a", buffering=1)  # noqa: SIM115 -- open for the process's life

    async def deliver(request: web.Request) -> web.Response:
        body = await request.json()
        items = body.get("items") or [body]
        out.write(json.dumps({"at": time.time(), "user": request.match_info["user"],
                              "id": request.headers.get("webhook-id"),
                              "links": [(item.get("listing") or {}).get("url") for item in items]}) + "\n")
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/u/{user}", deliver)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.SockSite(runner, listener).start()
        if told is not None:
            told.send("listening")
        while os.getppid() == parent:
            await asyncio.sleep(1)

    asyncio.run(serve())


def start_receiver(port: int, log_path: Path) -> multiprocessing.process.BaseProcess:
    """``receive`` in a process of its own, once it listens; SystemExit naming the port
    and why when it cannot (a receiver of an earlier run on it, aiohttp missing)."""
    spawn = multiprocessing.get_context("spawn")
    heard, told = spawn.Pipe(duplex=False)
    receiver = spawn.Process(target=receive, args=(port, str(log_path), told), daemon=True)
    receiver.start()
    while not heard.poll(0.1):
        if not receiver.is_alive():
            raise SystemExit(f"the webhook receiver on 127.0.0.1:{port} ended before it listened")
    said = heard.recv()
    if said != "listening":
        receiver.join()
        raise SystemExit(f"the webhook receiver could not listen on 127.0.0.1:{port}: {said}")
    return receiver


# -- the stages ----------------------------------------------------------------------------

def stage(name: str, url: str, threads: int, window: tuple[float, float], stop_at: float, record: str) -> None:
    """One stage's loop of passes until ``stop_at``; a pass that found nothing is followed
    by a second's pause (a sensor's look, sooner). Writes to ``record`` (JSON) the CPU
    seconds of the passes that began in ``window``, apart for those that did something
    and those that found nothing: a pass's fixed cost is not a fetch's."""
    from pipeline.fetching.collector import Collector
    from pipeline.listings.processor import Processor
    from pipeline.notify.notifier import Notifier

    settings = Settings(database_url=url, allow_networks=("127.0.0.0/8",), concurrency=threads,
                        alert_limit=1_000_000)
    engine = db.create_engine(url)
    worker = f"soak-{name}-{os.getpid()}"
    passes = {"busy": [0, 0.0], "empty": [0, 0.0]}  # passes, CPU seconds
    while time.time() < stop_at:
        began, cpu = time.time(), time.process_time()
        if name == "collect":
            did = Collector(engine, settings, worker=worker).run().claimed
        elif name == "process":
            did = Processor(engine, settings, worker).run().claimed
        else:  # "match" or "deliver": the notifier's two halves, each in a loop of its own
            stats = Notifier(engine, settings, worker).run(matching=name == "match", delivering=name == "deliver")
            did = stats.listings_matched + stats.sent + stats.retrying
        if window[0] <= began < window[1]:
            kind = passes["busy" if did else "empty"]
            kind[0] += 1
            kind[1] += time.process_time() - cpu
        if not did:
            time.sleep(1.0)
    engine.dispose()
    Path(record).write_text(json.dumps(passes))


def resident_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentiles(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return f"p50 {at(0.5):.1f} s, p95 {at(0.95):.1f} s, p99 {at(0.99):.1f} s (n={len(ordered)})"


def stop_internet(internet: subprocess.Popen[bytes]) -> None:
    """Stop the simulator: SIGINT (it writes its log out and ends), then, when an answer
    it holds past clients' deadlines (``--hold-seconds``, 120) keeps it past 30 s, kill
    it. It never raises: the run's report is written after it (an hour's report was
    lost to a TimeoutExpired here)."""
    internet.send_signal(signal.SIGINT)
    try:
        internet.wait(30)
    except subprocess.TimeoutExpired:
        internet.kill()
        internet.wait()


def start_internet(args: argparse.Namespace, log: Path, plan: Path, *extra: str) -> subprocess.Popen[bytes]:
    """bench/internet.py with the run's hosts, feeds, users and seed, once it serves."""
    internet = subprocess.Popen(
        [sys.executable, str(HERE / "internet.py"), "--hosts", str(args.hosts), "--feeds-per-host",
         str(args.feeds_per_host), "--port", str(args.port), "--seed", str(args.seed), "--users", str(args.users),
         "--items-per-hour", str(args.items_per_hour), "--history", str(args.history), "--log", str(log),
         "--plan", str(plan), *extra],
        stderr=subprocess.PIPE,
    )
    assert internet.stderr is not None
    line = internet.stderr.readline().decode()
    if "hosts on" not in line:
        internet.kill()
        raise SystemExit(f"the simulated internet did not start: {line}{internet.stderr.read().decode()}")
    return internet


def seed(engine: sa.Engine, plan: dict[str, Any], interval: int, receiver: str,
         delivery: dict[str, dict[str, str]] | None = None) -> None:
    """The plan's sources (every ``interval`` minutes, each host's group at the
    production defaults, not loopback's) and users (a webhook to ``receiver``/u/<name>,
    one filter per keyword; ``delivery``: a user's digest or quiet hours)."""
    with engine.begin() as conn:
        import_sources(conn, [make_spec(u, source_type="rss", interval=interval) for u in plan["sources"]])
        for (group,) in conn.execute(sa.select(schema.politeness_groups.c.name)):
            if group != "*":
                set_limits(conn, group, reset=True)  # the production defaults, not loopback's
        for user in plan["users"]:
            add_user(conn, user["name"], webhook=f"{receiver}/u/{user['name']}", secret=SECRET)
            for keyword in user["keywords"]:
                add_filter(conn, user["name"], keyword)
            if delivery and user["name"] in delivery:
                wanted = delivery[user["name"]]
                set_delivery(conn, user["name"], digest=wanted.get("digest"), quiet=wanted.get("quiet"))


# -- the run ---------------------------------------------------------------------------------

def main() -> int:  # noqa: PLR0915 -- one run, in order
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL server where a database may be created")
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--feeds-per-host", type=int, default=5)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--items-per-hour", type=float, default=6.0, help="per feed")
    # As the hour's (bench/soak_stack.py). The simulator's own default, 20, made the first
    # fetches a flood the warm-up could not deliver at this size (every match is a message
    # here): 161,625 messages, the window's items waiting behind them, all "lost".
    parser.add_argument("--history", type=float, default=1.0, help="items a feed has before the start, on average")
    parser.add_argument("--interval", type=int, default=1, help="each source's fetch interval, minutes")
    parser.add_argument("--warmup", type=float, default=1.5, help="minutes before the measured window")
    parser.add_argument("--minutes", type=float, default=5.0, help="the measured window")
    parser.add_argument("--drain", type=float,
                        help="minutes the stages run on after the window, for its last items to be delivered"
                             " (default: the interval and a minute)")
    parser.add_argument("--threads", type=int, default=16, help="the collector's threads")
    parser.add_argument("--port", type=int, default=18300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    if args.drain is None:
        args.drain = args.interval + 1.0
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    internet_log, plan_path, received = out / "internet.jsonl", out / "plan.json", out / "received.jsonl"
    receiver_port = args.port + 1
    internet = start_internet(args, internet_log, plan_path)
    spawn = multiprocessing.get_context("spawn")
    receiver = start_receiver(receiver_port, received)
    admin = sa.create_engine(args.database_url.replace("postgresql://", "postgresql+psycopg://", 1),
                             isolation_level="AUTOCOMMIT")
    stages: dict[str, multiprocessing.process.BaseProcess] = {}
    samples: list[dict[str, Any]] = []
    try:
        with scratch_database(admin, unique_name("bench_soak")) as name:
            url = admin.url.set(database=name).render_as_string(hide_password=False)
            engine = db.create_engine(url)
            migrate.upgrade(engine)
            plan = json.loads(plan_path.read_text())
            seed(engine, plan, args.interval, f"http://127.0.0.1:{receiver_port}")
            began = time.time()
            window_start = began + args.warmup * 60
            window_end = window_start + args.minutes * 60
            stages_end = window_end + args.drain * 60
            threads = {"collect": args.threads, "process": 1, "match": 1, "deliver": 8}
            for stage_name, n in threads.items():
                stages[stage_name] = spawn.Process(target=stage, args=(stage_name, url, n, (window_start, window_end), stages_end, str(out / f"{stage_name}.passes.json")),
                    name=stage_name)
                stages[stage_name].start()
                print(f"{stage_name}: pid {stages[stage_name].pid}", flush=True)  # for a profiler (py-spy)
            cpu_at_start: dict[str, float] = {}
            cpu: dict[str, float] = {}
            while time.time() < stages_end:
                now = time.time()
                if now >= window_start and not cpu_at_start:
                    cpu_at_start = {k: process_seconds(p.pid or 0) or 0.0 for k, p in stages.items()}
                if now >= window_end and not cpu:
                    cpu = {k: (process_seconds(p.pid or 0) or 0.0) - cpu_at_start.get(k, 0.0)
                           for k, p in stages.items()}
                with engine.connect() as conn:
                    sizes: dict[str, int] = dict(conn.execute(sa.text(
                        "SELECT relname, pg_total_relation_size(oid) FROM pg_class"
                        " WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace")).all())
                samples.append({"at": now, "rss_mb": {k: resident_mb(p.pid or 0) for k, p in stages.items()},
                                "table_bytes": sizes})
                # Every 15 s, and once at the window's end (the CPU is read then).
                wake = now + 15.0
                if now < window_end < wake:
                    wake = window_end
                time.sleep(max(0.0, min(wake, stages_end) - time.time()))
            if not cpu:  # no drain: the window's end is the stages' end
                cpu = {k: (process_seconds(p.pid or 0) or 0.0) - cpu_at_start.get(k, 0.0) for k, p in stages.items()}
            for process in stages.values():
                process.join(300 + args.drain * 60)
            passes = {k: json.loads((out / f"{k}.passes.json").read_text()) for k in stages
                      if (out / f"{k}.passes.json").exists()}
            report = audit(engine, args, plan, internet_log, received, (window_start, window_end, stages_end),
                           cpu, samples, passes)
            engine.dispose()
    finally:
        for process in stages.values():
            if process.is_alive():
                process.kill()
        receiver.kill()
        stop_internet(internet)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "samples.json").write_text(json.dumps(samples))
    plot(report, samples, out / "soak.png")
    print(f"report and logs: {out}")
    return 0 if not report["lost"] and not report["duplicated"] and not report["unexpected"] else 1


def audit(engine: sa.Engine, args: argparse.Namespace, plan: dict[str, Any], internet_log: Path, received: Path,
          times: tuple[float, float, float], cpu: dict[str, float], samples: list[dict[str, Any]],
          passes: dict[str, dict[str, list[float]]],
          held: dict[str, Callable[[float], float]] | None = None, *, built_from: str | None = None) -> dict[str, Any]:
    """Every item that appeared in the window against the deliveries; lateness and CPU;
    printed, and returned as a dict.

    ``held``: for a user whose messages wait (a digest, quiet hours), when an item listed
    at a time may be delivered at the earliest; such a user's deliveries count in the
    audit, not in the delays (they wait by design). ``built_from``: the commit whose code
    ran, where it is not the checkout's (a stack's image, built at the start).

    An item a user follows and never got is *lost* when its feed answered 200 after it
    appeared (the answer listed it) at least ``FETCHED_BEFORE_END`` seconds before the
    stages stopped; otherwise it is *not fetched by the end*: its source was not due
    again, or backing off after a failure (a held answer, a 5xx, a 429's wait), which is
    the pipeline keeping its promises to the hosts, not losing the item. An answer longer
    than the pipeline reads (PIPELINE_MAX_RESPONSE_BYTES: the simulator's oversized
    hosts) lists nothing: the fetch fails as ``too_large`` and its source's owner hears of
    it; the items of such a feed are counted apart, *refused as too large*."""
    window_start, window_end, stages_end = times
    followers: dict[str, set[str]] = defaultdict(set)
    for user in plan["users"]:
        for keyword in user["keywords"]:
            followers[keyword].add(user["name"])
    items: dict[str, dict[str, Any]] = {}  # by link
    listed_at: dict[str, list[float]] = defaultdict(list)  # a feed's 200 answers, when each ended
    too_large: set[str] = set()  # feeds whose 200 answers the pipeline refuses to read
    requests = 0
    for line in internet_log.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "item":
            items[record["link"]] = record
        else:
            requests += 1
            if record["status"] == 200:
                feed = f"http://{record['host']}:{args.port}{record['path']}"
                if record["bytes"] > DEFAULT_MAX_RESPONSE_BYTES:
                    too_large.add(feed)
                else:
                    listed_at[feed].append(record["at"])
    got: dict[tuple[str, str], list[float]] = defaultdict(list)
    ids: Counter[str] = Counter()
    window_messages = 0  # every message the receiver got in the window, whatever its item
    for line in received.read_text().splitlines() if received.exists() else []:
        record = json.loads(line)
        ids[record["id"]] += 1
        window_messages += window_start <= record["at"] < window_end
        for link in record["links"]:
            got[(record["user"], link)].append(record["at"])
    audited = [item for item in items.values() if window_start <= item["at"] < window_end]
    lost, unfetched, refused, appear_to_sent = [], [], [], []
    expected = 0
    held = held or {}
    for item in audited:
        answered = [at for at in listed_at[item["feed"]] if at > item["at"]]
        for user in set().union(*(followers[k] for k in item["keywords"])):
            expected += 1
            sent = got.get((user, item["link"]))
            waits = held.get(user)
            if sent:
                if waits is None:
                    appear_to_sent.append(min(sent) - item["at"])
            elif answered and (waits or float)(min(answered)) <= stages_end - FETCHED_BEFORE_END:
                lost.append((user, item["link"]))
            elif item["feed"] in too_large:
                refused.append((user, item["link"]))
            else:
                unfetched.append((user, item["link"]))
    duplicated = sorted(key for key, at in got.items() if len(at) > 1)
    repeated_ids = sorted(i for i, n in ids.items() if n > 1)
    unexpected = sorted((user, link) for (user, link) in got
                        if link in items and not any(user in followers[k] for k in items[link]["keywords"]))
    with engine.connect() as conn:
        raw, events = schema.listings_raw, schema.ingestion_events
        first_fetch = dict(conn.execute(
            sa.select(raw.c.url, sa.func.min(raw.c.fetched_at)).group_by(raw.c.url)).all())
        started = conn.execute(
            sa.select(events.c.occurred_at, events.c.scheduled_at)
            .where(events.c.event == schema.EVENT_STARTED, events.c.scheduled_at.is_not(None))
        ).all()
        sent_total = conn.execute(sa.select(sa.func.count()).select_from(schema.notifications)
                            .where(schema.notifications.c.sent_at.is_not(None))).scalar_one()
        fetches = conn.execute(sa.select(sa.func.count()).select_from(events)
                               .where(events.c.event == schema.EVENT_STARTED)).scalar_one()
    fetch_to_sent = []
    timed: dict[tuple[str, str], float] = {}  # the deliveries fetch -> delivery counts: when each first arrived
    for (user, link), delivered in got.items():
        fetched = first_fetch.get(link)
        if (fetched is not None and link in items and window_start <= items[link]["at"] < window_end
                and user not in held):
            fetch_to_sent.append(min(delivered) - fetched.timestamp())
            timed[(user, link)] = min(delivered)
    start_dt, end_dt = (datetime.fromtimestamp(t, UTC) for t in (window_start, window_end))
    lateness = [(at - due).total_seconds() for at, due in started if start_dt <= at < end_dt]
    series = sorted((at.timestamp(), (at - due).total_seconds()) for at, due in started)
    window_fetches = len(lateness)
    report = {
        "commit": built_from or commit(), "load": load(), "hosts": args.hosts, "feeds": args.hosts * args.feeds_per_host,
        "users": len(plan["users"]), "interval_minutes": args.interval, "window_minutes": args.minutes,
        "items_audited": len(audited), "deliveries_expected": expected, "lost": len(lost),
        "not_fetched_by_the_end": len(unfetched), "refused_as_too_large": len(refused),
        "duplicated": len(duplicated), "repeated_webhook_ids": len(repeated_ids), "unexpected": len(unexpected),
        "appear_to_delivery": percentiles(appear_to_sent), "fetch_to_delivery": percentiles(fetch_to_sent),
        "fetch_to_delivery_by_stage": {name: percentiles(v) for name, v in by_stage(engine, timed).items()},
        "lateness": percentiles(lateness), "fetches_in_window": window_fetches, "fetches_total": fetches,
        "notifications_sent_total": sent_total, "requests_total": requests,
        "cpu_seconds_in_window": {k: round(v, 1) for k, v in cpu.items()},
        "collector_cpu_ms_per_fetch": round(1000 * cpu.get("collect", 0) / max(window_fetches, 1), 2),
        # The notifier's CPU in the window over the messages it delivered then: those of
        # items that appeared before the window (the first fetches' histories) too, not
        # the window's items' deliveries alone, which made it 15.7 ms a message, not 3.4.
        "messages_in_window": window_messages,
        "notifier_cpu_ms_per_delivery": round(
            1000 * (cpu.get("match", 0) + cpu.get("deliver", 0)) / max(window_messages, 1), 2),
        # The passes that fetched, alone (the thread CPU of the stage's whole process in them).
        "collector_cpu_ms_per_fetch_in_passes": round(
            1000 * passes.get("collect", {}).get("busy", [0, 0.0])[1] / max(window_fetches, 1), 2),
        "passes": passes,
        "rss_mb": {k: [s["rss_mb"][k] for s in samples] for k in (samples[0]["rss_mb"] if samples else {})},
        "database_mb": {k: round(v / 2**20, 1) for k, v in (samples[-1]["table_bytes"].items() if samples else ())
                        if v > 2**20},
        "started": series, "deliveries": sorted((min(at), min(at) - items[link]["at"]) for (user, link), at in got.items()
                                                 if link in items and user not in held),
        "times": {"window_start": window_start, "window_end": window_end, "stages_end": stages_end},
        "examples": {"lost": lost[:5], "duplicated": duplicated[:5], "unexpected": unexpected[:5],
                     "not_fetched_by_the_end": unfetched[:5]},
    }
    traced = trace(engine, lost)
    report["lost_by_stage"] = dict(Counter(stage for stage, _ in traced.values()).most_common())
    # The rows' times as text: the report is written as JSON.
    report["lost_traced"] = json.loads(json.dumps([[user, link, *traced[(user, link)]] for user, link in lost],
                                                  default=str))
    print(f"{report['feeds']} feeds on {args.hosts} hosts, {report['users']} users, every {args.interval} min;"
          f" {args.minutes:g} min measured after {args.warmup:g} min; commit {report['commit']}, load {report['load']}")
    print(f"  audited {len(audited)} items, {expected} deliveries expected: lost {len(lost)}, duplicated"
          f" {len(duplicated)} (webhook-ids repeated {len(repeated_ids)}), unexpected {len(unexpected)};"
          f" {len(unfetched)} not fetched by the end (their sources not due again, or backing off);"
          f" {len(refused)} on feeds whose answers are longer than the pipeline reads (refused as too large)")
    for stage_name, n in report["lost_by_stage"].items():
        print(f"    lost, {stage_name}: {n}")
    print(f"  appearance -> delivery: {report['appear_to_delivery']}")
    print(f"  fetch -> delivery: {report['fetch_to_delivery']}")
    for name, figures in report["fetch_to_delivery_by_stage"].items():
        print(f"    {name}: {figures}")
    print(f"  schedule lateness: {report['lateness']}")
    if cpu:
        print(f"  CPU in the window: {report['cpu_seconds_in_window']} s; collector"
              f" {report['collector_cpu_ms_per_fetch']} ms per fetch, notifier"
              f" {report['notifier_cpu_ms_per_delivery']} ms per delivery ({window_messages} in the window)")
    for k, kinds in passes.items():
        (busy, busy_cpu), (empty, empty_cpu) = kinds["busy"], kinds["empty"]
        print(f"  {k} passes in the window: {busy:.0f} that worked ({busy_cpu:.1f} s CPU), {empty:.0f} that found"
              f" nothing ({1000 * empty_cpu / max(empty, 1):.0f} ms CPU each)")
    if passes:
        print(f"  collector CPU per fetch in the passes that fetched: {report['collector_cpu_ms_per_fetch_in_passes']}"
              " ms")
    for k, values in report["rss_mb"].items():
        known = [v for v in values if v is not None]
        if known:
            print(f"  {k} resident: {known[0]:.0f} MB at the first sample, {statistics.median(known):.0f} median,"
                  f" {known[-1]:.0f} at the last")
    return report


STAGES = ("stored -> processed", "processed -> matched", "matched -> sent", "sent -> received")


def by_stage(engine: sa.Engine, received: dict[tuple[str, str], float]) -> dict[str, list[float]]:
    """Where fetch -> delivery goes, per delivery ((user, item link) -> when it first
    arrived): from the item's first raw row stored (``listings_raw.fetched_at``, the
    collector's write) to its processing (``processed_at``), to its listing's matching
    (``listings.matched_at``), to the user's notification recorded sent (``sent_at``,
    written after the receiver answered), to the receiver's arrival (negative: the
    receiver had it before the sending was recorded). Each time is its database's clock
    at the writing transaction's start, the receiver's its own (the same machine)."""
    raw, t, n, u = schema.listings_raw, schema.listings, schema.notifications, schema.users
    out: dict[str, list[float]] = {name: [] for name in STAGES}
    if not received:
        return out
    links = {link for _, link in received}
    stored: dict[str, Any] = {}  # rows
    sent: dict[tuple[str, str], Any] = {}
    with engine.connect() as conn:  # whole tables, read once (an IN list of every link is too many parameters)
        for raw_row in conn.execute(sa.select(raw.c.url, raw.c.fetched_at, raw.c.processed_at)
                                    .order_by(raw.c.fetched_at.desc())):
            if raw_row.url in links:
                stored[raw_row.url] = raw_row  # the item's first raw row wins: its fetch is where the time starts
        for told in conn.execute(
            sa.select(u.c.name, t.c.url, t.c.matched_at, sa.func.min(n.c.sent_at).label("sent_at"))
            .select_from(n.join(t, n.c.listing_id == t.c.id).join(u, n.c.user_id == u.c.id))
            .group_by(u.c.name, t.c.url, t.c.matched_at)
        ):
            if (told.name, told.url) in received:
                sent[(told.name, told.url)] = told
    for (user, link), arrived in received.items():
        first, last = stored.get(link), sent.get((user, link))
        if first is None or last is None or None in (first.processed_at, last.matched_at, last.sent_at):
            continue
        times = (first.fetched_at, first.processed_at, last.matched_at, last.sent_at)
        for name, (start, end) in zip(STAGES, itertools.pairwise(times), strict=False):
            out[name].append((end - start).total_seconds())
        out[STAGES[-1]].append(arrived - last.sent_at.timestamp())
    return out


def trace(engine: sa.Engine, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """Where each (user, item link) of ``pairs`` stopped on its way, read from the
    database: the stage it did not pass, with the rows that say so."""
    raw, t, n, u = schema.listings_raw, schema.listings, schema.notifications, schema.users
    out: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    if not pairs:
        return out
    links = sorted({link for _, link in pairs})
    with engine.connect() as conn:
        raws: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in conn.execute(sa.select(raw.c.url, raw.c.id, raw.c.fetched_at, raw.c.processed_at, raw.c.last_error)
                                .where(raw.c.url.in_(links))).mappings():
            raws[row["url"]].append(dict(row))
        listed = {row["url"]: dict(row) for row in conn.execute(
            sa.select(t.c.url, t.c.id, t.c.source_id, t.c.cluster_id, t.c.ingested_at, t.c.matched_at, t.c.item_key)
            .where(t.c.url.in_(links))).mappings()}
        user_ids = dict(conn.execute(sa.select(u.c.name, u.c.id).where(u.c.name.in_(sorted({p[0] for p in pairs})))).all())
        for user, link in pairs:
            listing = listed.get(link)
            facts: dict[str, Any] = {"raw": raws.get(link, []), "listing": listing}
            if not raws.get(link):
                out[(user, link)] = "no raw row (the fetch that listed it stored nothing)", facts
                continue
            if listing is None:
                out[(user, link)] = "raw row, no listing", facts
                continue
            if listing["matched_at"] is None:
                out[(user, link)] = "listing not matched", facts
                continue
            cluster = listing["cluster_id"] or listing["id"]
            told = [dict(row) for row in conn.execute(
                sa.select(n.c.id, n.c.listing_id, n.c.cluster_id, n.c.status, n.c.created_at, n.c.sent_at,
                          n.c.digest_id, n.c.event)
                .where(n.c.user_id == user_ids.get(user),
                       sa.or_(n.c.listing_id == listing["id"], n.c.cluster_id == cluster,
                              # (an item key of NULL would find every notification without one)
                              n.c.item_key == listing["item_key"] if listing["item_key"] else sa.false()))
            ).mappings()]
            facts["notifications"] = told
            own = [row for row in told if row["listing_id"] == listing["id"]]
            if own:
                out[(user, link)] = f"notification {own[0]['status']}", facts
            elif told:
                out[(user, link)] = "told under another listing of its story or item", facts
            else:
                out[(user, link)] = "matched, no notification", facts
    return out


def plot(report: dict[str, Any], samples: list[dict[str, Any]], path: Path,
         events: dict[str, float] | None = None) -> None:
    """Four panels over the run's time (minutes from the window's start): fetches started
    per 10 s, schedule lateness per minute (p50, p95), each stage's resident memory, the
    largest tables' size; the window shaded, ``events`` (name: time) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = float(report["times"]["window_start"])

    def minutes(at: float) -> float:
        return (at - t0) / 60

    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    started = report["started"]
    if started:
        first, last = started[0][0], started[-1][0]
        bins = int((last - first) // 10) + 1
        counts = [0] * bins
        for at, _ in started:
            counts[int((at - first) // 10)] += 1
        axes[0].step([minutes(first + 10 * i) for i in range(bins)], [c / 10 for c in counts], where="post")
        per_minute: dict[int, list[float]] = defaultdict(list)
        for at, late in started:
            per_minute[int((at - t0) // 60)].append(late)
        keys = sorted(per_minute)
        for q, label in ((0.5, "p50"), (0.95, "p95")):
            axes[1].plot([k + 0.5 for k in keys],
                         [sorted(per_minute[k])[min(len(per_minute[k]) - 1, round(q * (len(per_minute[k]) - 1)))]
                          for k in keys], marker="o", label=label)
        axes[1].legend()
    axes[0].set_ylabel("fetches started / s")
    axes[1].set_ylabel("lateness (s)")
    for stage_name in (samples[0]["rss_mb"] if samples else {}):
        axes[2].plot([minutes(s["at"]) for s in samples], [s["rss_mb"][stage_name] for s in samples], label=stage_name)
    axes[2].set_ylabel("resident (MB)")
    axes[2].legend()
    if samples:
        largest = sorted(samples[-1]["table_bytes"], key=lambda k: -samples[-1]["table_bytes"][k])[:6]
        for table in largest:
            axes[3].plot([minutes(s["at"]) for s in samples],
                         [s["table_bytes"].get(table, 0) / 2**20 for s in samples], label=table)
        axes[3].legend(fontsize="small")
    axes[3].set_ylabel("table size (MB)")
    axes[3].set_xlabel("minutes from the measured window's start")
    for ax in axes:
        ax.axvspan(0, minutes(report["times"]["window_end"]), color="0.93", zorder=0)
        ax.grid(True, alpha=0.3)
        for name, at in (events or {}).items():
            ax.axvline(minutes(at), color="tab:red", linestyle="--", linewidth=0.8)
            if ax is axes[0]:
                ax.annotate(name, (minutes(at), 1), xycoords=("data", "axes fraction"), rotation=90,
                            va="top", ha="right", fontsize="small", color="tab:red")
    fig.suptitle(f"{report['feeds']} feeds, {report['users']} users, commit {report['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plots: {path}")


if __name__ == "__main__":
    sys.exit(main())
