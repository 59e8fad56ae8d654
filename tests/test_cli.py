"""The `pipeline` command as a user runs it: settings from the environment, what it prints, its exit status."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.storage import migrate, schema
from tests.conftest import conformance
from tests.helpers import add_raw_rows, add_source, now


@dataclasses.dataclass(frozen=True)
class Result:
    """What a command printed and the status it exited with."""

    returncode: int
    stdout: str
    stderr: str


def run(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
    """``pipeline ARGS`` as the console script runs it (``pipeline.cli.main``), in this
    process: the environment is the test's (without DATABASE_URL and PIPELINE_STATE_DIR)
    plus ``env``, standard input is ``stdin``, and what the command prints is captured.
    A process costs 1-3 s of imports; ``console`` starts one for the few tests that
    are about the process itself."""
    patched: dict[str, str | None] = {"DATABASE_URL": None, "PIPELINE_STATE_DIR": None, **(env or {})}
    with CliRunner().isolation(input=stdin, env=patched) as (stdout, stderr, _):
        code = main(list(args))
    return Result(code, stdout.getvalue().decode(), stderr.getvalue().decode())


def console(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
    """``pipeline ARGS`` in a process of its own (``python -m pipeline.cli``): for what
    only a process shows (its exit status, what reaches its standard error)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_STATE_DIR")}
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env={**base, **(env or {})},
                          input=stdin, capture_output=True, text=True, timeout=120, check=False)
    return Result(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_embedded_default_creates_a_sqlite_file_in_the_state_folder(tmp_path: Path):
    """A process: the console script with nothing configured creates the embedded SQLite file."""
    state = tmp_path / "state"
    result = console("db", "upgrade", env={"PIPELINE_STATE_DIR": str(state)})
    assert result.returncode == 0, result.stderr
    assert (state / "pipeline.db").exists()
    assert f"is at schema revision {migrate.head_revision()}" in result.stdout
    status = run("status", "--json", env={"PIPELINE_STATE_DIR": str(state)})
    assert status.returncode == 0, status.stderr
    assert set(json.loads(status.stdout)["totals"]) == set(schema.metadata.tables)


def test_the_default_state_folder_is_git_ignored():
    root = Path(__file__).resolve().parent.parent
    assert ".state/" in (root / ".gitignore").read_text().splitlines()


@conformance
def test_status_shows_each_queue_its_claims_in_flight_and_expired_leases(engine, db_url):
    t = schema.listings_raw
    with engine.begin() as conn:
        source_id = add_source(conn, next_fetch_at=now() + timedelta(minutes=30))
        ids = add_raw_rows(conn, source_id, 5, start=now() - timedelta(hours=2))
        conn.execute(
            sa.update(t).where(t.c.id == ids[0]).values(locked_until=now() + timedelta(minutes=5))
        )
        conn.execute(
            sa.update(t).where(t.c.id.in_(ids[1:3])).values(locked_until=now() - timedelta(minutes=5))
        )
        conn.execute(sa.update(schema.sources).values(consecutive_failures=2, last_failure_reason="timeout"))
    result = run("status", "--json", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    queues = {q["table"]: q for q in status["queues"]}
    raw = queues["listings_raw"]
    # 2 free + 2 whose lease expired are claimable; 1 is held.
    assert (raw["waiting"], raw["in_flight"], raw["expired_leases"]) == (4, 1, 2)
    assert raw["oldest_waiting"].startswith(str((now() - timedelta(hours=2)).date()))
    assert queues["sources"]["waiting"] == 0 and status["failing"] == {"timeout": 1}
    assert status["sources_enabled"] == 1 and status["totals"]["sources"] == 1
    text = run("status", env={"DATABASE_URL": db_url})
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert "failing now    timeout 1" in lines
    assert "next due in 30 min" in text.stdout
    # Which source fails, since when and why, as the UI's check lists them.
    [failing] = [line for line in lines if line.startswith(f"{source_id} ")]
    assert failing.split() == [str(source_id), "http://127.0.0.1/feed", "never", "fetched", "well", "2", "timeout", "-"]
    assert [(f["id"], f["failures"], f["reason"]) for f in status["failing_sources"]] == [(source_id, 2, "timeout")]
    [row] = [line for line in lines if line.startswith("raw rows to process")]
    assert row.split()[-6:] == ["4", "2.0", "h", "ago", "1", "2"]


def test_a_malformed_database_url_is_one_clear_line():
    """A process: nothing but the one line reaches its standard error."""
    assert_one_line_error(console("status", env={"DATABASE_URL": "not a url"}), "DATABASE_URL", "not a url")


def test_an_unreachable_database_is_one_clear_line():
    """A process: nothing but the one line reaches its standard error."""
    result = console("status", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere"})
    assert_one_line_error(result, "cannot connect to postgresql+psycopg://nobody@127.0.0.1:9/nowhere")


def test_the_password_never_appears_in_errors():
    result = run("status", env={"DATABASE_URL": "postgresql://u:s3cret-pw@127.0.0.1:9/x"})
    assert_one_line_error(result, "***")
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_a_database_newer_than_the_code_stops_the_command(engine, db_url):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'zz_future'"))
    assert_one_line_error(run("status", env={"DATABASE_URL": db_url}), "zz_future", "newer than this code")
    assert_one_line_error(run("db", "upgrade", env={"DATABASE_URL": db_url}), "newer than this code")


def test_an_unmigrated_database_asks_for_db_upgrade(empty_db_url):
    result = run("status", env={"DATABASE_URL": empty_db_url})
    assert_one_line_error(result, "run `pipeline db upgrade`")


def test_backfills_from_the_command_line_touch_their_window_only(engine, db_url):
    def day(d: int) -> str:
        return f"2026-11-{d:02d}"

    from datetime import UTC, datetime

    from pipeline.catalogue import users

    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        for d in (18, 19, 20):
            stamp = datetime(2026, 11, d, 12, tzinfo=UTC)
            conn.execute(sa.insert(schema.listings_raw).values(
                source_id=source, source_item_id=f"d{d}", url=f"http://x/{d}", content_hash=str(d),
                raw_json={"title": f"<b>Python</b> job {d}", "url": f"http://x/{d}"}, fetched_at=stamp))
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 16)
        users.add_filter(conn, "alice", "python")  # created now: after every listing
    assert run("process", env={"DATABASE_URL": db_url}).returncode == 0
    with engine.begin() as conn:  # as an older normaliser left them, on the day they arrived
        for d in (18, 19, 20):
            conn.execute(sa.update(schema.listings).where(schema.listings.c.source_item_id == f"d{d}")
                         .values(title="stale", ingested_at=datetime(2026, 11, d, 12, tzinfo=UTC)))

    result = run("backfill", "reprocess", "--since", day(19), "--until", day(20), "--json",
                 env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["reopened"] == 1
    with engine.connect() as conn:
        titles = dict(conn.execute(sa.select(schema.listings.c.source_item_id, schema.listings.c.title)).all())
    assert titles == {"d18": "stale", "d19": "Python job 19", "d20": "stale"}

    def rematch(*flags: str) -> dict:
        out = run("backfill", "rematch", "--since", day(18), "--until", day(20), "--json", *flags,
                  env={"DATABASE_URL": db_url})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[-1])

    assert rematch() == {"listings": 2, "notifications_created": 0}, "a new filter does not reach back"
    # d18 still shows "stale" (it was not re-processed): only d19 matches "python".
    assert rematch("--any-age")["notifications_created"] == 1, "on request, that window's history"
    assert rematch("--any-age")["notifications_created"] == 0, "and never a second time"
    bad = run("backfill", "rematch", "--since", day(20), "--until", day(18), env={"DATABASE_URL": db_url})
    assert bad.returncode == 2 and "is not before --until" in bad.stderr


def test_a_fetch_refused_by_the_address_guard_says_why_and_what_to_set(engine, db_url):
    """`pipeline collect` from a plain shell (no PIPELINE_ALLOW_NETWORKS) once backed the
    demo's 127.0.0.1 sources off for an hour with nothing saying why."""
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/feed")
    result = run("collect", "--json", env={"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": ""})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["failed_by_reason"] == {"blocked_address": 1}
    assert "1 sources were refused by the address guard (blocked_address)" in result.stderr
    assert "PIPELINE_ALLOW_NETWORKS=127.0.0.1/32" in result.stderr and "(now: none)" in result.stderr


@conformance
def test_status_shows_how_late_fetches_started_per_hour(engine, db_url):
    """p50 and p95 of (claim time - due time) per clock hour, from the started events;
    a never-fetched source's fetch (no due time) and completed events are not counted.
    The same figures on PostgreSQL (percentile_cont) and SQLite (in Python)."""
    recent, earlier = now() - timedelta(minutes=1), now() - timedelta(hours=3)
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/f")

        def event(at, late, kind=schema.EVENT_STARTED):
            return {"event": kind, "source_id": source, "occurred_at": at,
                    "scheduled_at": None if late is None else at - timedelta(seconds=late)}

        conn.execute(sa.insert(schema.ingestion_events), [
            *(event(recent, s) for s in (0, 60, 120, 600)), event(recent, None),
            event(recent, 5000, schema.EVENT_COMPLETED),
            *(event(earlier, s) for s in (30, 30)), event(now() - timedelta(hours=7), 1),
            # Fetches that started before their due time were not late (status once said "-0 s").
            *(event(now() - timedelta(hours=5), s) for s in (-0.4, -30)),
        ])
    data = json.loads(run("status", "--json", env={"DATABASE_URL": db_url}).stdout)["lateness"]
    assert [(h["fetches"], h["p50_seconds"], h["p95_seconds"]) for h in data] == [
        (4, 90.0, pytest.approx(528.0)), (2, 30.0, 30.0), (2, 0.0, 0.0)]
    assert data[0]["start"].startswith(recent.strftime("%Y-%m-%dT%H:00:00"))
    text = run("status", env={"DATABASE_URL": db_url}).stdout
    assert re.search(rf"{recent:%Y-%m-%d %H}:00\s+4\s+2 min\s+9 min", text), text
    assert "-0 s" not in text and re.search(r"\s2\s+0 s\s+0 s", text), text


@conformance
def test_a_feed_item_reaches_the_user_whose_filter_matches_through_the_command_line(db_url, receiver):
    """The whole pipeline on each database, as a user drives it: a source, a user and a
    filter added, one pass of each stage; a second pass delivers nothing again."""
    items = "".join(f"<item><guid>{guid}</guid><title>{title}</title><link>http://127.0.0.1/{guid}</link></item>"
                    for guid, title in (("a", "Python developer"), ("b", "Java developer")))
    feed = f"<?xml version='1.0'?><rss version='2.0'><channel><title>jobs</title>{items}</channel></rss>"
    receiver.routes["/feed"] = lambda h: h.reply(200, feed.encode(), {"Content-Type": "application/rss+xml"})
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    for command in (("sources", "add", receiver.url("/feed")),
                    ("users", "add", "alice", "--webhook", receiver.url("/hook")),
                    ("filters", "add", "alice", "--query", "python")):
        added = run(*command, env=env)
        assert added.returncode == 0, added.stderr

    def one_pass() -> dict[str, dict]:
        result = run("run", "--once", "--json", env=env)
        assert result.returncode == 0, result.stderr
        return {totals["stage"]: totals for totals in map(json.loads, result.stdout.splitlines())}

    first = one_pass()
    assert (first["collect"]["items_new"], first["notify"]["sent"]) == (2, 1), first
    [delivery] = [r for r in receiver.requests if r["path"] == "/hook"]
    assert json.loads(delivery["body"])["listing"]["title"] == "Python developer"
    again = one_pass()
    assert (again["collect"]["items_new"], again["notify"]["sent"]) == (0, 0), again
    # Each stage records its run where `pipeline status` and the metrics read it, run from
    # the command line as from Dagster (only Dagster's runs did).
    status = json.loads(run("status", "--json", env=env).stdout)
    assert {w["worker_name"]: w["last_status"] for w in status["stages"]} == {
        "collector": "ok", "processor": "ok", "notifier": "ok"}, status["stages"]


# -- operator input: one line, never a traceback --------------------------------------------

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TRICKY_URLS = ["http://[::1", "http://[::1]:99999/", "http://h:0/", "http://%zz/", "http://\x00/", "http://a b/",
                "http:///x", "ftp://h/", "http://" + "a" * 300 + ".com/", "http://h/\ud800", "//h/x", "http://-/",
                "http://[v1.x]/", "http://1.2.3.4.5/", "http://0x7f.1/", "http://h:+1/", "http://u:p@/", ""]
_ids = st.one_of(st.integers(-2**70, 2**70).map(str), st.sampled_from([str(2**63), str(2**63 - 1), "0", "-1", "1e3"]),
                 st.text(max_size=20))
_urls = st.one_of(st.sampled_from(_TRICKY_URLS), st.text(max_size=40),
                  st.text(max_size=30).map(lambda host: f"http://{host}/feed"))
_names = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "a" * 5000, "x\x00y", "\ud800"]),
                   st.integers(-2**70, 2**70).map(str))
# Apprise takes a string of several URLs, split at spaces and commas: the guard read the
# first, the sends went to all (``users add --apprise "json://x/ irc://127.0.0.1:P"``).
_apprise_strings = st.tuples(
    st.lists(st.one_of(st.sampled_from(["json://x.invalid/", "irc://127.0.0.1:9/#c", "rsyslog://127.0.0.1:9",
                                        "mailto://u:p@127.0.0.1:9", "slack://a/b/c", "windows://"]), _urls),
             min_size=2, max_size=3),
    st.sampled_from([" ", ",", ", ", "\t", "\n"]),
).map(lambda parts: parts[1].join(parts[0]))


def _commands(ids, urls, names):
    """Every command that takes an id, a URL or a name from its operator, with one drawn."""
    return st.one_of(
        st.tuples(st.just("sources"), st.just("add"), urls),
        st.tuples(st.just("sources"), st.just("add"), urls, st.just("--name"), names),
        st.tuples(st.sampled_from(["sources"]), st.sampled_from(["enable", "disable", "refresh", "show"]), ids),
        st.tuples(st.just("sources"), st.just("set"), ids, st.just("--priority"), ids),
        st.tuples(st.just("sources"), st.just("set"), ids, st.just("--interval"), ids),
        st.tuples(st.just("backfill"), st.just("refetch"), ids),
        st.tuples(st.just("politeness"), st.just("set"), names, st.just("--max-in-flight"), ids),
        st.tuples(st.just("users"), st.just("add"), names, st.just("--webhook"), urls),
        st.tuples(st.just("users"), st.just("add"), names, st.just("--apprise"), st.one_of(urls, _apprise_strings)),
        st.tuples(st.just("operator"), st.just("tell"), names, names),
        st.tuples(st.just("users"), st.just("set"), st.one_of(st.just("alice"), names), st.just("--tz"), names),
        st.tuples(st.just("users"), st.just("set"), st.one_of(st.just("alice"), names), st.just("--quiet"), names),
        st.tuples(st.just("users"), st.just("set"), st.one_of(st.just("alice"), names), st.just("--digest"), names),
        st.tuples(st.just("filters"), st.just("add"), st.one_of(ids, names), st.just("--query"), names),
        st.tuples(st.just("filters"), st.just("add"), st.just("alice"), st.just("--query"), st.just("python"),
                  st.just("--source"), ids),
        st.tuples(st.just("filters"), st.sampled_from(["enable", "disable", "remove"]), ids),
        st.tuples(st.just("users"), st.sampled_from(["enable", "disable", "test", "remove"]),
                  st.one_of(st.just("bob"), names)),
        st.tuples(st.just("users"), st.just("channel"), st.one_of(st.just("alice"), names),
                  st.sampled_from(["--webhook", "--apprise"]), st.one_of(urls, names)),
        st.tuples(st.just("notifications"), st.just("digest"), st.one_of(st.just("alice"), names)),
        st.tuples(st.just("filters"), st.just("list"), st.just("--user"), st.one_of(st.just("alice"), names)),
        st.tuples(st.just("sources"), st.just("remove"), ids),
        st.tuples(st.just("notifications"), st.just("requeue"), st.just("--id"), ids),
        st.tuples(st.just("notifications"), st.just("list"), st.sampled_from(["--user", "--since"]), names),
        st.tuples(st.just("db"), st.just("downgrade"), names),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=_commands(_ids, _urls, _names))
@example(args=("users", "add", "0", "--webhook", "0\r0"))  # the error quoted the carriage return
def test_any_id_url_or_name_an_operator_types_is_answered_in_one_line(engine, db_url, args):
    """A property test over every command's id, URL and name arguments: each ends with
    exit code 0, or 1 and one line on stderr, or 2 (click's usage error, ending in
    "Error: ..."); never a traceback (the reproductions: `filters add` for a user id over
    2**63, `users add --webhook 'http://[::1'`)."""
    with engine.begin() as conn:
        if conn.execute(sa.select(schema.users.c.id).where(schema.users.c.name == "alice")).first() is None:
            from pipeline.catalogue import users
            users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 24)
    if args[:2] == ("db", "downgrade"):
        args = (*args[:2], "--help") if args[2] in ("base",) or args[2].startswith(("-", "+")) else args
    result = run(*args, env={"DATABASE_URL": db_url})
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1, 2), result
    lines = result.stderr.strip().splitlines()
    if result.returncode == 1:
        assert len(lines) == 1, result
    elif result.returncode == 2:
        assert lines[-1].startswith("Error: "), result


# DATABASE_URLs an operator may write: any scheme, a user and password of any text (an
# "@" or ":" in it), a host or a broken one, a port of any text; hosts on this machine
# only (a connection is tried where the URL is good).
def _env_text(size: int) -> st.SearchStrategy[str]:
    """Text an environment variable can hold (no NUL, no lone surrogate)."""
    return st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=size)


_passwords = _env_text(12).map(lambda tail: f"Pw-{tail}-5ecret")
_database_urls = st.tuples(
    st.one_of(st.sampled_from(["postgresql", "postgres", "postgresql+psycopg", "mysql", "mariadb", "sqlite", "oracle",
                               "http", ""]), _env_text(8)),
    _env_text(8), _passwords,
    st.sampled_from(["127.0.0.1", "[::1", "[::1]", "", "127.0.0.1:5432:9"]),
    st.one_of(st.sampled_from(["", ":5432", ":3306", ":9", ":abc", ":99999", ":-1"]), _env_text(5).map(":".__add__)),
    st.one_of(_env_text(10), st.just("test")),
).map(lambda p: (f"{p[0]}://{p[1]}:{p[2]}@{p[3]}{p[4]}/{p[5]}", p[2]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_database_urls)
@example(drawn=("postgresql://postgres:Pw-ssw0rd@XYZ-5ecret@127.0.0.1:5432/test", "Pw-ssw0rd@XYZ-5ecret"))
@example(drawn=("postgresql://postgres:Pw--5ecret@127.0.0.1:abc/x", "Pw--5ecret"))
@example(drawn=("postgresql:///:Pw--5ecret@127.0.0.1/test", "Pw--5ecret"))  # the server echoed it as a database
@example(drawn=("mysql://:Pw-\u0100-5ecret@127.0.0.1/test", "Pw-\u0100-5ecret"))  # PyMySQL: Latin-1 only
@example(drawn=("postgresql://u:Pw--5ecret@\x80:5432/test", "Pw--5ecret"))  # the lookup's IDNA codec raised
def test_any_database_url_is_answered_in_one_line_that_shows_no_password(tmp_path, monkeypatch, drawn):
    """A property test over DATABASE_URL (the reproductions: a port that is no number
    printed a 37-line traceback; an "@" in the password showed the part after it): each
    command ends in exit 0, or 1 and one line, never a traceback, and no part of the
    password is printed. In a folder of its own: a SQLite URL names a file."""
    url = drawn[0]
    monkeypatch.chdir(tmp_path)
    result = run("sources", "list", env={"DATABASE_URL": url})
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1), result
    if result.returncode == 1:
        assert len(result.stderr.strip().splitlines()) == 1, result
    printed = result.stdout + result.stderr
    assert "Pw-" not in printed and "5ecret" not in printed, result


@pytest.mark.parametrize("command", [
    ("notifications", "requeue", "--id", "{known}", "--id", "999999"),
    ("backfill", "refetch", "{known}", "999999"),
    ("sources", "refresh", "{known}", "999999"),
    ("sources", "remove", "{known}", "999999"),
    ("sources", "enable", "999999"),
    ("sources", "disable", "999999"),
    ("sources", "set", "999999", "--priority", "1"),
    ("filters", "enable", "999999"),
    ("filters", "disable", "999999"),
])
def test_an_id_that_names_nothing_is_exit_1_one_line_and_changes_nothing(engine, db_url, command):
    """Every command that takes ids: an unknown one fails the whole command before it
    changes anything (it once said "0 notifications requeued" with exit 0, and a re-fetch
    of a known and an unknown source fetched the known one and succeeded)."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/feed", next_fetch_at=now() + timedelta(hours=1))
        from pipeline.catalogue import users
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 24)
        conn.execute(sa.insert(schema.listings).values(source_id=source, source_item_id="a", url="http://x/a",
                                                         content_hash="h"))
        notification = conn.execute(sa.insert(schema.notifications).values(
            user_id=1, listing_id=1, channel="webhook", status="dead", attempts=9)
            .returning(schema.notifications.c.id)).scalar_one()
    known = {"notifications": notification}.get(command[0], source)
    args = [part.format(known=known) for part in command]
    before = {t.name: [dict(r) for r in engine.connect().execute(sa.select(t)).mappings()]
              for t in (schema.sources, schema.notifications, schema.filters)}
    assert_one_line_error(run(*args, env={"DATABASE_URL": db_url}), "999999")
    after = {t.name: [dict(r) for r in engine.connect().execute(sa.select(t)).mappings()]
             for t in (schema.sources, schema.notifications, schema.filters)}
    assert after == before


def test_politeness_set_refuses_a_group_no_source_names_unless_told_to_create_it(engine, db_url):
    """A typo (`politeness set exmaple.com`) once created a group silently."""
    env = {"DATABASE_URL": db_url}
    assert_one_line_error(run("politeness", "set", "nosuchgroup", "--max-in-flight", "3", env=env),
                          "no politeness group named 'nosuchgroup'", "--create")
    assert run("politeness", "set", "nosuchgroup", "--max-in-flight", "3", "--create", env=env).returncode == 0
    assert run("politeness", "set", "nosuchgroup", "--interval", "2", env=env).returncode == 0, "it exists now"
    assert run("politeness", "set", "*", "--max-in-flight", "3", env=env).returncode == 0, "the defaults always exist"


def test_politeness_list_says_which_groups_ask_for_more_fetches_than_their_spacing_allows(engine, db_url):
    """A group of three hourly sources started 30 minutes apart can fetch each every 90
    minutes at best: the list says so, where it once showed only the limits and the
    count, and an operator told to look there for "a group that cannot keep its
    sources' cadence" had to work it out by hand for every group."""
    with engine.begin() as conn:
        for i in range(3):
            add_source(conn, f"http://crowded.example/{i}", fetch_interval_minutes=60)
        add_source(conn, "http://crowded.example/off", fetch_interval_minutes=15, enabled=False)  # asks nothing
        add_source(conn, "http://roomy.example/feed", fetch_interval_minutes=60)
    env = {"DATABASE_URL": db_url}
    assert run("politeness", "set", "crowded.example", "--interval", "1800", env=env).returncode == 0
    listed = run("politeness", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert "4 sources, fetches asked a minute: 0.05 (its spacing allows 0.0333: its sources start late)" in (
        lines["crowded.example"])
    assert lines["roomy.example"].endswith("1 source, fetches asked a minute: 0.0167"), lines["roomy.example"]


def test_counts_are_said_in_the_singular_for_one_and_each_bound_names_its_own_default(engine, db_url):
    env = {"DATABASE_URL": db_url}
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/feed")
    assert run("sources", "refresh", str(source), env=env).stdout.strip() == "1 source due now"
    shown = " ".join(run("sources", "add", "--help").stdout.split())
    assert "Shortest interval an adaptive cadence may take, in minutes; default: PIPELINE_ADAPTIVE_MIN_MINUTES (15)." in shown
    assert "Longest interval an adaptive cadence may take, in minutes; default: PIPELINE_ADAPTIVE_MAX_MINUTES (1440)." in shown


def test_a_webhook_that_is_no_url_is_named_as_typed(db_url):
    """`users add carol --webhook notaurl` once said "webhook … is not an http(s) URL"."""
    assert_one_line_error(run("users", "add", "carol", "--webhook", "notaurl", env={"DATABASE_URL": db_url}),
                          "webhook notaurl is not an http(s) URL")


def test_sources_list_names_each_source_says_why_a_disabled_one_waits_and_times_are_utc_iso(engine, db_url):
    """`sources list` once left names out, printed microseconds, and showed a disabled
    source as "next now, disabled"; its --json wrote "2026-11-27 09:00:00.123456+00:00"
    where `status --json` wrote ISO 8601 with a "T"."""
    env = {"DATABASE_URL": db_url}
    later = now().replace(microsecond=123456) + timedelta(hours=1)
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/a", name="Jobs board", next_fetch_at=later)
        add_source(conn, "http://127.0.0.1:9/b", enabled=False, disabled_reason="http_4xx 5 times in a row")
    lines = run("sources", "list", env=env).stdout.splitlines()
    assert f"next {later:%Y-%m-%dT%H:%M:%S}Z" in lines[0] and "Jobs board: http://127.0.0.1:9/a" in lines[0]
    assert "next" not in lines[1] and "disabled (http_4xx 5 times in a row)" in lines[1]
    listed = json.loads(run("sources", "list", "--json", env=env).stdout)
    assert listed[0]["next_fetch_at"] == later.isoformat()
    status = json.loads(run("status", "--json", env=env).stdout)
    stamps = re.findall(r'"(\d{4}-\d\d-\d\d[T ][^"]*)"', json.dumps(status) + json.dumps(listed))
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00", s) for s in stamps), stamps


def test_no_help_line_is_cut_off_in_any_group():
    """Every group's --help lists each command's first sentence whole (click cut them at
    about 45 characters: "Re-fetch, re-process or re-match on demand, as the...")."""
    from pipeline.cli import cli

    groups = [()] + [(name,) for name, command in cli.commands.items() if isinstance(command, click.Group)]
    assert len(groups) > 5
    for group in groups:
        shown = run(*group, "--help").stdout
        assert shown.count("Commands:") == 1 and "..." not in shown.split("Commands:")[1], (group, shown)


def test_notifications_list_shows_the_latest_with_their_last_error_filtered_by_user_status_and_time(engine, db_url):
    """The runbook once said to use SQL to see why a notification is dead."""
    env = {"DATABASE_URL": db_url}
    with engine.begin() as conn:
        from pipeline.catalogue import users
        source = add_source(conn, "http://127.0.0.1:9/feed")
        alice = users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 24).id
        bob = users.add_user(conn, "bob", webhook="http://127.0.0.1:9/hook", secret="s" * 24).id
        listing = conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="a", url="http://x/a", title="Python developer", content_hash="h")
            .returning(schema.listings.c.id)).scalar_one()
        n = schema.notifications
        conn.execute(sa.insert(n).values(
            user_id=alice, listing_id=listing, channel="webhook", status="dead", attempts=8,
            last_error="http_5xx: 503 from 127.0.0.1", created_at=now() - timedelta(days=2)))
        conn.execute(sa.insert(n).values(user_id=bob, listing_id=listing, channel="webhook", status="sent",
                                         attempts=1, sent_at=now()))
    lines = run("notifications", "list", env=env).stdout.splitlines()
    assert len(lines) == 2 and "sent" in lines[0] and " bob " in lines[0], lines
    assert "dead" in lines[1] and "(8 attempts): Python developer  last error: http_5xx: 503" in lines[1], lines
    dead = json.loads(run("notifications", "list", "--status", "dead", "--json", env=env).stdout)
    assert [(r["user"], r["attempts"], r["last_error"]) for r in dead] == [("alice", 8, "http_5xx: 503 from 127.0.0.1")]
    assert [r["user"] for r in json.loads(run("notifications", "list", "--user", "bob", "--json", env=env).stdout)] == ["bob"]
    since = (now() - timedelta(days=1)).date().isoformat()
    recent = json.loads(run("notifications", "list", "--since", since, "--json", env=env).stdout)
    assert [r["user"] for r in recent] == ["bob"]
    assert_one_line_error(run("notifications", "list", "--user", "carol", env=env), "no user named")
    assert run("notifications", "list", "--since", "yesterday", env=env).returncode == 2


def test_users_enable_and_disable_and_filters_remove(engine, db_url):
    """Management the peers' users take for granted: a user switched off and on, a filter
    deleted (its notifications stay); an unknown name or id is one line, exit 1."""
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    assert run("users", "add", "carol", "--webhook", "http://127.0.0.1:9/hook", env=env).returncode == 0
    filter_id = run("filters", "add", "carol", "--query", "python", env=env).stdout.strip()

    def enabled() -> bool:
        with engine.connect() as conn:
            return conn.execute(sa.select(schema.users.c.enabled).where(schema.users.c.name == "carol")).scalar_one()

    assert run("users", "disable", "carol", env=env).returncode == 0 and not enabled()
    assert run("users", "enable", "carol", env=env).returncode == 0 and enabled()
    assert_one_line_error(run("users", "disable", "nobody", env=env), "no user named (or with id) 'nobody'")
    assert run("filters", "remove", filter_id, env=env).returncode == 0
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.filters)).scalar_one() == 0
    assert_one_line_error(run("filters", "remove", filter_id, env=env), f"no filter with id {filter_id}")


def _count(engine: sa.Engine, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def test_sources_remove_deletes_what_the_source_brought_and_nothing_else(engine, db_url):
    """A removed source takes its raw rows, listings, their notifications (sent or not),
    its fetch events and the filters scoped to it; another source's keep theirs. An
    unknown id among the ids deletes nothing, exit 1, one line."""
    env = {"DATABASE_URL": db_url}
    t, li, n, f = schema.sources, schema.listings, schema.notifications, schema.filters
    with engine.begin() as conn:
        gone, kept = add_source(conn, "http://127.0.0.1/gone"), add_source(conn, "http://127.0.0.1/kept")
        user = conn.execute(sa.insert(schema.users).values(name="dora", channel="webhook",
                                                           channel_url="http://127.0.0.1:9/", secret="s" * 16)
                            .returning(schema.users.c.id)).scalar_one()
        for source in (gone, kept):
            add_raw_rows(conn, source, 2)
            listing = conn.execute(sa.insert(li).values(source_id=source, source_item_id="a", url="http://127.0.0.1/a",
                                                        content_hash="h").returning(li.c.id)).scalar_one()
            conn.execute(sa.insert(n).values(user_id=user, listing_id=listing, channel="webhook"))
            conn.execute(sa.insert(f).values(user_id=user, keywords=["a"], query="a", source_id=source))
            conn.execute(sa.insert(schema.ingestion_events).values(source_id=source, event=schema.EVENT_COMPLETED,
                                                                   success=True))
    assert_one_line_error(run("sources", "remove", str(gone), "99999", env=env), "no source with id 99999")
    assert _count(engine, t) == 2
    result = run("sources", "remove", str(gone), env=env)
    assert result.returncode == 0, result
    assert result.stdout.strip() == "1 source removed with 1 listing, 1 notification, 1 filter"
    for table in (schema.listings_raw, li, schema.ingestion_events, f):
        assert _count(engine, table, table.c.source_id == gone) == 0, table.name
        assert _count(engine, table, table.c.source_id == kept) > 0, table.name
    assert _count(engine, n) == 1 and _count(engine, t) == 1


def test_users_remove_and_channel(engine, db_url):
    """A user removed takes their filters and notifications; another channel takes what
    is not sent yet, a webhook given again keeps its secret, and a channel the address
    guard refuses, or none, is one line, exit 1, nothing changed."""
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    assert run("users", "add", "erin", "--webhook", "http://127.0.0.1:9/hook", env=env).returncode == 0
    assert run("filters", "add", "erin", "--query", "python", env=env).returncode == 0
    u = schema.users

    def channel() -> tuple[str, str, str | None]:
        with engine.connect() as conn:
            return tuple(conn.execute(sa.select(u.c.channel, u.c.channel_url, u.c.secret).where(u.c.name == "erin")).one())

    secret = channel()[2]
    moved = run("users", "channel", "erin", "--webhook", "http://127.0.0.1:10/new", env=env)
    assert moved.returncode == 0, moved
    assert moved.stdout.strip() == "webhook http://127.0.0.1/…" and "secret" not in moved.stderr  # as users list shows it
    assert channel() == ("webhook", "http://127.0.0.1:10/new", secret)
    assert run("users", "channel", "erin", "--apprise", "json://127.0.0.1:11/", env=env).returncode == 0
    assert channel() == ("apprise", "json://127.0.0.1:11/", None)
    assert_one_line_error(run("users", "channel", "erin", "--webhook", "http://10.0.0.1/", env=env), "address guard")
    assert_one_line_error(run("users", "channel", "erin", env=env), "give exactly one channel")
    assert channel() == ("apprise", "json://127.0.0.1:11/", None)
    back = run("users", "channel", "erin", "--webhook", "http://127.0.0.1:12/", env=env)
    assert "webhook secret (shown once" in back.stderr and channel()[2] not in (None, secret)
    assert [r["name"] for r in json.loads(run("filters", "list", "--user", "erin", "--json", env=env).stdout)] == ["erin"]
    with engine.begin() as conn:
        user = conn.execute(sa.select(u.c.id).where(u.c.name == "erin")).scalar_one()
        source = add_source(conn)
        listing = conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="a", url="http://127.0.0.1/a", content_hash="h")
            .returning(schema.listings.c.id)).scalar_one()
        conn.execute(sa.insert(schema.notifications).values(user_id=user, listing_id=listing, channel="webhook"))
    removed = run("users", "remove", "erin", env=env)
    assert removed.stdout.strip() == "user erin removed with 1 filter, 1 notification", removed
    assert _count(engine, u) == _count(engine, schema.filters) == _count(engine, schema.notifications) == 0
    assert _count(engine, schema.listings) == 1
    assert_one_line_error(run("users", "remove", "erin", env=env), "no user named (or with id) 'erin'")


@pytest.mark.parametrize("form", ["opml", "yaml", "csv"])
def test_sources_export_is_what_import_reads_back(engine, db_url, form, tmp_path, sqlite_template):
    """Every field an import sets survives an export and an import into another database
    (types, names, intervals, categories, groups, priorities, cadences, owners, options:
    an owner was left out, and an import into a new database lost who is told); a URL's
    password and secret options are left out unless asked for, saying so."""
    env = {"DATABASE_URL": db_url}
    for args in (
        ("http://127.0.0.1/feed", "--name", "Jobs, \"remote\" & <more>", "--category", "jobs", "--priority", "5"),
        ("http://user:pw@127.0.0.1/private", "--interval", "30", "--group", "shared"),
        ("http://127.0.0.1/page", "--type", "http", "--config", '{"item": "li.job", "title": "a"}'),
        ("http://127.0.0.1/adaptive", "--adaptive", "--min-interval", "20", "--max-interval", "600"),
        ("https://www.youtube.com/channel/UCabcdefghijklmnopqrstuv", "--config", '{"api_key": "k3y"}'),
    ):
        assert run("sources", "add", *args, env=env).returncode == 0, args
    owner = ("users", "add", "olga", "--apprise", "json://127.0.0.1:9/hook")
    assert run(*owner, env={**env, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}).returncode == 0
    assert run("sources", "owner", "1", "olga", env=env).returncode == 0
    path = tmp_path / f"sources.{form}"
    written = run("sources", "export", str(path), "--with-secrets", env=env)
    assert written.returncode == 0 and "5 sources written" in written.stderr, written
    other = tmp_path / "other.db"
    other.write_bytes(sqlite_template.read_bytes())
    other_env = {"DATABASE_URL": f"sqlite:///{other}"}
    assert_one_line_error(run("sources", "import", str(path), env=other_env),
                          "nothing imported: no user named 'olga', owner of http://127.0.0.1/feed")
    assert run(*owner, env={**other_env, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}).returncode == 0
    assert run("sources", "import", str(path), env=other_env).stdout.strip() == "5 added, 0 already present"
    before = run("sources", "export", "--format", "yaml", "--with-secrets", env=env).stdout
    assert run("sources", "export", "--format", "yaml", "--with-secrets", env=other_env).stdout == before
    assert "api_key: k3y" in before and "user:pw@" in before and "owner: olga" in before, "the owner too"
    public = run("sources", "export", "--format", form, env=env)
    assert "k3y" not in public.stdout and "pw@" not in public.stdout and "127.0.0.1/private" in public.stdout
    assert "2 sources written without a URL password or secret options" in public.stderr
    assert_one_line_error(run("sources", "export", str(tmp_path / "sources.txt"), env=env), "cannot tell the format")


def test_users_test_sends_a_signed_test_message_and_says_how_it_went(engine, db_url, receiver):
    """A test message goes through the user's channel now, signed as every delivery is,
    with event "test" and a key of its own; a channel that refuses it is exit 1, one line
    with its error. Nothing is stored."""
    from pipeline.notify.delivery import verify

    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    secret = "t" * 24
    assert run("users", "add", "finn", "--webhook", receiver.url("/hook"), "--secret-file", "-",
               stdin=secret, env=env).returncode == 0
    sent = run("users", "test", "finn", env=env)
    assert sent.returncode == 0, sent
    assert re.fullmatch(r"sent to webhook http://127\.0\.0\.1/… \(test-[0-9a-f]{16}\)", sent.stdout.strip())
    [request] = receiver.requests
    body = request["body"]
    assert verify(secret, body, request["headers"]), "signed with the user's secret"
    payload = json.loads(body)
    assert payload["event"] == "test" and payload["idempotency_key"] in sent.stdout
    receiver.routes["/hook"] = lambda h: h.reply(500, b"down")
    assert_one_line_error(run("users", "test", "finn", env=env),
                          "the test message to finn was not delivered: http_5xx: HTTP 500")
    assert _count(engine, schema.notifications) == 0
    assert_one_line_error(run("users", "test", "nobody", env=env), "no user named (or with id) 'nobody'")


def test_notifications_digest_previews_what_is_held(engine, db_url):
    """The notifications held for a user's next digest read as the digest will, with when
    it goes out; nothing held says so; nothing is changed."""
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    assert run("users", "add", "gail", "--webhook", "http://127.0.0.1:9/hook", env=env).returncode == 0
    assert run("notifications", "digest", "gail", env=env).stdout.strip() == "nothing held for gail"
    n, li = schema.notifications, schema.listings
    release = now().replace(microsecond=0) + timedelta(hours=3)
    with engine.begin() as conn:
        user = conn.execute(sa.select(schema.users.c.id).where(schema.users.c.name == "gail")).scalar_one()
        source = add_source(conn)
        for key, title in (("a", "Python developer"), ("b", "Rust <engineer>")):
            listing = conn.execute(sa.insert(li).values(source_id=source, source_item_id=key, title=title,
                                                        url=f"http://127.0.0.1/{key}", content_hash="h")
                                   .returning(li.c.id)).scalar_one()
            conn.execute(sa.insert(n).values(user_id=user, listing_id=listing, channel="webhook", status="held",
                                             next_attempt_at=release))
    shown = run("notifications", "digest", "gail", env=env)
    assert shown.returncode == 0, shown
    assert shown.stdout.startswith(f"goes out at {release:%Y-%m-%dT%H:%M:%SZ}\n\n2 new listings\n")
    assert "- Python developer\n  http://127.0.0.1/a\n- Rust <engineer>\n  http://127.0.0.1/b" in shown.stdout
    held = json.loads(run("notifications", "digest", "gail", "--json", env=env).stdout)
    assert [i["listing"]["title"] for i in held["digest"]["items"]] == ["Python developer", "Rust <engineer>"]
    with engine.connect() as conn:
        assert set(conn.execute(sa.select(n.c.status, n.c.digest_id)).all()) == {("held", None)}


# -- start-up: each command loads what it uses -----------------------------------------------

# What a command that needs none of it loaded anyway (`pipeline --help` spent 1.0 s of CPU,
# `sources list` and `status` 1.0 s, on this 2-core VM; now 0.07, 0.45 and 0.45 s).
HEAVY = ("sqlalchemy", "alembic", "httpx", "httpcore", "bs4", "feedparser", "dagster", "apprise", "psycopg",
         "pymysql", "prometheus_client", "hypercorn")
NOT_FOR_A_READ = ("alembic", "httpx", "httpcore", "bs4", "feedparser", "dagster", "apprise",
                  "prometheus_client", "hypercorn", "pipeline.fetching", "pipeline.net", "pipeline.notify.notifier")


def loaded_by(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter has loaded once ``pipeline ARGS`` is done (a
    process of its own: this one has loaded everything)."""
    program = ("import contextlib, io, json, sys\nfrom pipeline.cli import main\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n    code = main(sys.argv[1:])\n"
               "assert code == 0, code\nprint(json.dumps(sorted(sys.modules)))")
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_STATE_DIR")}
    done = subprocess.run([sys.executable, "-c", program, *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout))


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_help_loads_no_database_network_or_parsing_library():
    """Starts a process: `pipeline --help` loaded SQLAlchemy, the fetcher, BeautifulSoup
    and every command's code before it parsed its arguments. The budget is held by what
    is loaded, never by a time."""
    assert heavy(loaded_by("--help"), HEAVY) == []
    assert heavy(loaded_by("sources", "--help"), HEAVY) == []


def test_a_read_command_loads_the_database_and_nothing_of_fetching_or_sending(db_url):
    """Starts a process per command: listing sources or the status loaded the
    collector, the fetcher, WebSub, the notifier and Alembic (a check that the schema is
    current now reads the version table and the migrations' file names)."""
    env = {"DATABASE_URL": db_url}
    assert run("sources", "add", "http://127.0.0.1:9/feed", env=env).returncode == 0
    for command in (("sources", "list"), ("status",), ("users", "list")):
        assert heavy(loaded_by(*command, env=env), NOT_FOR_A_READ) == [], command


def test_every_command_that_changes_something_says_what_in_one_line(db_url, receiver):
    """`sources set`, `enable`, `disable`, `politeness set`, `users enable`, `filters
    remove` and others printed nothing on success: the operator could not tell a change
    made from a command that did nothing."""
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    for command in (("sources", "add", "http://127.0.0.1:9/feed"),
                    ("users", "add", "alice", "--webhook", receiver.url("/hook")),
                    ("filters", "add", "alice", "--query", "python")):
        assert run(*command, env=env).returncode == 0
    said = {}
    for command in (("sources", "set", "1", "--priority", "5", "--interval", "30"), ("sources", "disable", "1"),
                    ("sources", "enable", "1"), ("politeness", "set", "127.0.0.1", "--max-in-flight", "2"),
                    ("users", "disable", "alice"), ("users", "enable", "alice"), ("filters", "disable", "1"),
                    ("filters", "enable", "1"), ("filters", "remove", "1")):
        done = run(*command, env=env)
        assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, (command, done)
        said[" ".join(command[:2])] = done.stdout.strip()
    assert said["sources set"] == "source 1: priority 5, interval 30 min"
    assert said["sources disable"] == "source 1 disabled: disabled by an operator"
    assert said["politeness set"] == "politeness group 127.0.0.1: at most 2 in flight"
    assert (said["users enable"], said["filters remove"]) == ("user alice enabled", "filter 1 removed")
    refused = run("db", "downgrade", "bogusrev", env=env)
    assert refused.returncode == 1 and ",," not in refused.stderr, refused.stderr


def test_status_counts_a_table_the_database_has_no_estimate_of(engine, db_url):
    """PostgreSQL keeps no estimate of a table never analysed (reltuples -1), and one read
    as 0 showed "listings ~0" with 108 stored; a table under COUNTED_BELOW is counted."""
    with engine.begin() as conn:
        source = add_source(conn)
        conn.execute(sa.insert(schema.listings), [
            {"source_id": source, "source_item_id": str(n), "url": f"http://127.0.0.1/{n}", "content_hash": str(n)}
            for n in range(3)])
    status = json.loads(run("status", "--json", env={"DATABASE_URL": db_url}).stdout)
    assert (status["totals"]["listings"], status["totals_estimated"]) == (3, False)
    assert re.search(r"^listings +3;", run("status", env={"DATABASE_URL": db_url}).stdout, re.M)
