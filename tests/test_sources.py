"""Sources from the command line: add, import (OPML, YAML, CSV), list, enable, disable, refresh."""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.catalogue.sources import make_spec, read_source_file, remove_sources
from pipeline.core.errors import SourceError
from pipeline.storage import schema
from tests.conftest import conformance
from tests.helpers import add_raw_rows, add_source, now, wait_until
from tests.test_cli import assert_one_line_error, run

OPML = """<?xml version="1.0" encoding="UTF-8"?>
<opml version="2.0">
  <head><title>Subscriptions</title></head>
  <body>
    <outline text="News">
      <outline type="rss" text="Example news" xmlUrl="http://127.0.0.1:8000/news.xml"/>
      <outline type="rss" title="Atom feed" xmlUrl="http://127.0.0.1:8000/atom.xml"/>
    </outline>
    <outline type="rss" text="Top level" xmlUrl="http://127.0.0.1:8000/top.xml"/>
  </body>
</opml>
"""


def sources_rows(engine: sa.Engine) -> list[dict]:
    t = schema.sources
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.id)).mappings()]


def test_add_prints_the_id_and_defaults_to_rss_every_60_minutes(engine, db_url):
    result = run("sources", "add", "http://127.0.0.1:8000/feed.xml", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    [row] = sources_rows(engine)
    assert result.stdout.strip() == str(row["id"])
    assert (row["source_type"], row["fetch_interval_minutes"], row["enabled"]) == ("rss", 60, True)
    assert row["next_fetch_at"] is None, "a new source is due at once"


def test_add_with_every_option(engine, db_url):
    result = run(
        "sources", "add", "http://127.0.0.1:8000/page", "--type", "http", "--name", "Jobs page",
        "--interval", "15", "--category", "jobs", env={"DATABASE_URL": db_url},
    )
    assert result.returncode == 0, result.stderr
    [row] = sources_rows(engine)
    assert (row["source_type"], row["name"], row["fetch_interval_minutes"]) == ("http", "Jobs page", 15)
    assert row["config"] == {"category": "jobs"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["ftp://127.0.0.1/feed"], "'ftp://127.0.0.1/feed' is not an http(s) URL"),
        (["not a url"], "is not an http(s) URL"),
        (["http://127.0.0.1:99999/x"], "is not a usable URL: Port out of range"),
        (["http://[::1/x"], "is not a usable URL: Invalid IPv6 URL"),
        (["http://127.0.0.1:0/x"], "port 0 is not a port"),
        (['http://a"><svg/onload=alert(1)>/feed'], "is not a host name or an IP address"),
        (["http://127.0.0.1/a\x01b"], "contains white space or control characters"),
        (["http://127.0.0.1/f", "--interval", "0"], "interval 0 is out of bounds: it must be 1 to 10080"),
        (["http://127.0.0.1/f", "--interval", "10081"], "interval 10081 is out of bounds"),
        # A group's name is a key: MariaDB indexes 255 characters of it.
        (["http://127.0.0.1/f", "--group", "g" * 256], "group is 256 characters long; at most 255"),
    ],
)
def test_add_rejects_bad_input_in_one_line(engine, db_url, args, fragment):
    assert_one_line_error(run("sources", "add", *args, env={"DATABASE_URL": db_url}), fragment)
    assert sources_rows(engine) == []


def test_an_unknown_type_is_refused_by_name(db_url):
    result = run("sources", "add", "http://127.0.0.1/f", "--type", "gopher", env={"DATABASE_URL": db_url})
    assert result.returncode == 2 and "gopher" in result.stderr and "Traceback" not in result.stderr


def test_a_duplicate_url_is_refused(engine, db_url):
    env = {"DATABASE_URL": db_url}
    assert run("sources", "add", "http://127.0.0.1/f", env=env).returncode == 0
    assert_one_line_error(run("sources", "add", "http://127.0.0.1/f", env=env), "exists already (id")


@conformance
def test_a_groups_name_is_refused_past_255_characters_by_politeness_set_too(db_url):
    result = run("politeness", "set", "g" * 256, "--max-in-flight", "3", env={"DATABASE_URL": db_url})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result  # a usage error, as its others
    assert "Error: group is 256 characters long; at most 255" in result.stderr


@conformance
def test_the_database_refuses_intervals_out_of_bounds_too(engine):
    # IntegrityError on PostgreSQL and SQLite; PyMySQL reports MariaDB's CHECK as operational.
    with pytest.raises(sa.exc.DBAPIError, match="fetch_interval"), engine.begin() as conn:
        conn.execute(
            sa.insert(schema.sources).values(
                name="x", url="http://127.0.0.1/x", source_type="rss", fetch_interval_minutes=0
            )
        )


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("UCabcdefghijklmnopqrstuv", "https://www.youtube.com/channel/UCabcdefghijklmnopqrstuv"),
        ("@SomeChannel", "https://www.youtube.com/@SomeChannel"),
        ("https://www.youtube.com/playlist?list=PL123", "https://www.youtube.com/playlist?list=PL123"),
    ],
)
def test_youtube_channel_ids_handles_and_urls_are_youtube_sources(value, url):
    spec = make_spec(value)
    assert (spec.source_type, spec.url) == ("youtube", url)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("https://www.youtube.com/watch?v=abc", "is not a YouTube channel, @handle, user or playlist URL"),
        ("https://youtu.be/abc", "is not a YouTube channel"),
    ],
)
def test_a_youtube_url_must_name_a_channel_or_playlist(value, fragment):
    with pytest.raises(SourceError, match=fragment):
        make_spec(value)


def test_config_is_checked_by_the_sources_adapter(engine, db_url):
    env = {"DATABASE_URL": db_url}
    good = run("sources", "add", "http://127.0.0.1:8000/jobs", "--type", "http",
               "--config", '{"item": "li.job", "title": "h2"}', env=env)
    assert good.returncode == 0, good.stderr
    assert sources_rows(engine)[0]["config"] == {"item": "li.job", "title": "h2"}
    bad = run("sources", "add", "http://127.0.0.1:8000/other", "--type", "http",
              "--config", '{"item": "li[["}', env=env)
    assert_one_line_error(bad, "http config 'item': bad CSS selector")
    assert len(sources_rows(engine)) == 1


@pytest.mark.parametrize(
    ("url", "kind", "config", "fragment"),
    [
        ("http://127.0.0.1/p", "http", '{"itme": "li"}', "unknown http config keys ['itme']"),
        ("http://127.0.0.1/p", "http", '{"title": "h2"}', "set 'item' too"),
        ("http://127.0.0.1/p", "http", "[1, 2]", "config must be a JSON object"),
        ("http://127.0.0.1/p", "http", "{not json", "config is not valid JSON"),
        ("http://127.0.0.1/p", "rss", '{"item": "li"}', "an rss source takes none"),
        ("@SomeChannel", None, '{"channel_id": "nope"}', "channel_id 'nope' is not a channel id"),
        ("@SomeChannel", None, '{"api_base": "ftp://x"}', "api_base 'ftp://x' is not an http(s) URL"),
    ],
)
def test_bad_config_is_refused_naming_what_is_wrong(url, kind, config, fragment):
    with pytest.raises(SourceError, match=re.escape(fragment)):
        make_spec(url, source_type=kind, config=config)


def test_a_yaml_entry_carries_its_config_and_secrets_are_never_listed(engine, db_url, tmp_path):
    env = {"DATABASE_URL": db_url}
    path = write(
        tmp_path, "yt.yaml",
        "- url: '@SomeChannel'\n  config: {api_key: very-secret-key}\n"
        "- url: http://127.0.0.1:8000/page\n  type: http\n  config: {item: article}\n",
    )
    assert run("sources", "import", str(path), env=env).stdout.strip() == "2 added, 0 already present"
    stored = {r["url"]: r["config"] for r in sources_rows(engine)}
    assert stored["https://www.youtube.com/@SomeChannel"] == {"api_key": "very-secret-key"}
    listed = run("sources", "list", "--json", env=env).stdout
    assert "very-secret-key" not in listed and '"api_key": "***"' in listed
    assert "very-secret-key" not in run("sources", "list", env=env).stdout


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_import_opml_is_idempotent_by_url(engine, db_url, tmp_path):
    path = write(tmp_path, "subs.opml", OPML)
    env = {"DATABASE_URL": db_url}
    first = run("sources", "import", str(path), env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "3 added, 0 already present"
    second = run("sources", "import", str(path), env=env)
    assert second.stdout.strip() == "0 added, 3 already present"
    rows = {r["url"]: r for r in sources_rows(engine)}
    assert len(rows) == 3
    assert rows["http://127.0.0.1:8000/news.xml"]["name"] == "Example news"
    assert rows["http://127.0.0.1:8000/news.xml"]["config"] == {"category": "News"}
    assert rows["http://127.0.0.1:8000/top.xml"]["config"] == {}


def test_import_yaml_and_csv(engine, db_url, tmp_path):
    env = {"DATABASE_URL": db_url}
    yaml_file = write(
        tmp_path, "feeds.yaml",
        "sources:\n"
        "  - http://127.0.0.1:8000/a.xml\n"
        "  - {url: 'http://127.0.0.1:8000/page', type: http, interval: 30, name: Page}\n",
    )
    csv_file = write(
        tmp_path, "feeds.csv",
        "url,type,name,interval,category\n"
        "http://127.0.0.1:8000/b.xml,rss,B,120,tech\n"
        "http://127.0.0.1:8000/a.xml,,,,\n",
    )
    assert run("sources", "import", str(yaml_file), env=env).stdout.strip() == "2 added, 0 already present"
    assert run("sources", "import", str(csv_file), env=env).stdout.strip() == "1 added, 1 already present"
    rows = {r["url"]: r for r in sources_rows(engine)}
    assert rows["http://127.0.0.1:8000/page"]["fetch_interval_minutes"] == 30
    assert rows["http://127.0.0.1:8000/b.xml"]["config"] == {"category": "tech"}


ALIAS_BOMB = "\n".join(
    [f"a: &a [{', '.join(['lol'] * 9)}]"]
    + [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")]
    + ["sources: [{url: 'http://127.0.0.1/x', config: {x: *i}}]"]
)


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("bad.csv", "url,interval\nhttp://127.0.0.1/ok,10\nhttp://127.0.0.1/bad,0\n",
         "bad.csv, line 3: interval 0 is out of bounds"),
        ("bad.csv", "link\nhttp://127.0.0.1/x\n", "must name a 'url' column"),
        ("bad.yaml", "- http://127.0.0.1/ok\n- {url: 'mailto:x@y', type: rss}\n",
         "bad.yaml, entry 2: 'mailto:x@y' is not an http(s) URL"),
        ("bad.yaml", "sources: [unclosed\n", "not valid YAML"),
        ("bad.opml", "<opml><body><outline xmlUrl='http://127.0.0.1/a'>", "not valid OPML"),
        ("bad.opml", OPML.replace("http://127.0.0.1:8000/top.xml", "javascript:alert(1)"),
         "outline 'Top level': 'javascript:alert(1)' is not an http(s) URL"),
        ("bomb.opml", '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]><opml/>',
         "DOCTYPE or ENTITY declaration is not accepted"),
        ("feeds.txt", "http://127.0.0.1/a\n", "unknown file type '.txt'"),
        # Once 10**9 nodes of nested aliases kept the import on a CPU past 30 s.
        ("laughs.yaml", ALIAS_BOMB, "aliases (*a) are not accepted in an import"),
        ("deep.yaml", "[" * 20_000 + "]" * 20_000, "not valid YAML: nested more than"),
        ("wide.csv", "url,name\nhttp://127.0.0.1/x," + "a" * 200_000 + "\n",
         "wide.csv, line 2: not valid CSV: field larger than field limit"),
    ],
)
def test_a_bad_file_names_the_entry_and_writes_nothing(engine, db_url, tmp_path, name, text, fragment):
    path = write(tmp_path, name, text)
    assert_one_line_error(run("sources", "import", str(path), env={"DATABASE_URL": db_url}), fragment)
    assert sources_rows(engine) == [], "nothing of a rejected file is written"


def test_folders_nested_thousands_deep_are_read_without_recursion(engine, db_url, tmp_path):
    """3,000 nested outlines once ended the import in a RecursionError."""
    depth = 3000
    opml = ("<opml><body>" + "".join(f"<outline text='f{i}'>" for i in range(depth))
            + "<outline text='deep' xmlUrl='http://127.0.0.1/deep.xml'/>" + "</outline>" * depth + "</body></opml>")
    path = write(tmp_path, "deep.opml", opml)
    result = run("sources", "import", str(path), env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.sources.c.url, schema.sources.c.config)).all() == [
            ("http://127.0.0.1/deep.xml", {"category": f"f{depth - 1}"})]


def test_a_missing_file_is_one_line(db_url, tmp_path):
    result = run("sources", "import", str(tmp_path / "nope.opml"), env={"DATABASE_URL": db_url})
    assert_one_line_error(result, "no such file")


def test_every_bad_entry_is_reported_at_once(tmp_path):
    path = write(tmp_path, "many.csv", "url\nftp://a\nftp://b\nhttp://127.0.0.1/ok\n")
    with pytest.raises(SourceError) as error:
        read_source_file(path)
    assert "line 2" in str(error.value) and "line 3" in str(error.value)


def test_list_enable_disable_refresh(engine, db_url):
    env = {"DATABASE_URL": db_url}
    source_id = run("sources", "add", "http://127.0.0.1/f", env=env).stdout.strip()
    t = schema.sources
    with engine.begin() as conn:
        conn.execute(
            sa.update(t).values(
                next_fetch_at=now() + timedelta(hours=1), consecutive_failures=3,
                last_failure_reason="http_5xx",
            )
        )
    assert run("sources", "disable", source_id, "--reason", "moved", env=env).returncode == 0
    [listed] = json.loads(run("sources", "list", "--json", env=env).stdout)
    assert (listed["enabled"], listed["disabled_reason"]) == (False, "moved")
    assert "disabled (moved), 3 failures (http_5xx)" in run("sources", "list", env=env).stdout

    assert run("sources", "refresh", source_id, env=env).returncode == 0
    assert sources_rows(engine)[0]["next_fetch_at"] is None
    assert run("sources", "enable", source_id, env=env).returncode == 0
    [row] = sources_rows(engine)
    assert (row["enabled"], row["disabled_reason"], row["consecutive_failures"]) == (True, None, 0)
    assert_one_line_error(run("sources", "enable", "999999", env=env), "no source with id 999999")


def test_refresh_takes_several_ids_all_or_none(engine, db_url):
    env = {"DATABASE_URL": db_url}
    ids = [run("sources", "add", f"http://127.0.0.1/f{i}", env=env).stdout.strip() for i in range(3)]
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=now() + timedelta(hours=1)))
    assert_one_line_error(run("sources", "refresh", ids[0], "999999", env=env), "no source with id 999999")
    assert all(row["next_fetch_at"] is not None for row in sources_rows(engine)), "an unknown id changed nothing"
    result = run("sources", "refresh", ids[0], ids[2], env=env)
    assert result.returncode == 0 and result.stdout.strip() == "2 sources due now"
    due = {str(row["id"]): row["next_fetch_at"] is None for row in sources_rows(engine)}
    assert due == {ids[0]: True, ids[1]: False, ids[2]: True}


def test_priority_is_set_on_add_import_and_set_and_shown_by_list_and_status(engine, db_url, tmp_path):
    env = {"DATABASE_URL": db_url}
    low = run("sources", "add", "http://127.0.0.1/low", env=env).stdout.strip()
    high = run("sources", "add", "http://127.0.0.1/high", "--priority", "10", env=env).stdout.strip()
    yaml_file = write(tmp_path, "feeds.yaml", "- {url: 'http://127.0.0.1/y', priority: -3}\n")
    csv_file = write(tmp_path, "feeds.csv", "url,priority\nhttp://127.0.0.1/c,7\n")
    opml_file = write(tmp_path, "feeds.opml", OPML.replace('text="Top level"', 'text="Top level" priority="2"'))
    for path in (yaml_file, csv_file, opml_file):
        assert run("sources", "import", str(path), env=env).returncode == 0
    rows = {r["url"]: r["priority"] for r in sources_rows(engine)}
    assert (rows["http://127.0.0.1/low"], rows["http://127.0.0.1/high"]) == (0, 10)
    assert (rows["http://127.0.0.1/y"], rows["http://127.0.0.1/c"]) == (-3, 7)
    assert (rows["http://127.0.0.1:8000/top.xml"], rows["http://127.0.0.1:8000/news.xml"]) == (2, 0)

    assert run("sources", "set", low, "--priority", "4", "--interval", "15", env=env).returncode == 0
    row = next(r for r in sources_rows(engine) if str(r["id"]) == low)
    assert (row["priority"], row["fetch_interval_minutes"]) == (4, 15)
    listed = run("sources", "list", env=env).stdout
    assert re.search(rf"^\s*{high}\s.*, next now, priority 10 ", listed, re.MULTILINE)
    assert "priority 0" not in listed, "the default is not shown"
    assert {r["id"]: r["priority"] for r in json.loads(run("sources", "list", "--json", env=env).stdout)}[int(low)] == 4
    status = run("status", env=env).stdout
    assert "priorities     10: 1, 7: 1, 4: 1, 2: 1, 0: 2, -3: 1" in status
    assert json.loads(run("status", "--json", env=env).stdout)["sources_by_priority"]["10"] == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--priority", "101"), "priority 101 is out of bounds: it must be -100 to 100"),
        (("--interval", "0"), "interval 0 is out of bounds"),
        ((), "nothing to set: give --name, --url, --category, --config, --group, --priority"),
    ],
)
def test_set_refuses_bad_values_in_one_line(engine, db_url, args, fragment):
    env = {"DATABASE_URL": db_url}
    source_id = run("sources", "add", "http://127.0.0.1/f", env=env).stdout.strip()
    assert_one_line_error(run("sources", "set", source_id, *args, env=env), fragment)
    assert_one_line_error(run("sources", "set", "999999", "--priority", "1", env=env), "no source with id 999999")
    assert sources_rows(engine)[0]["priority"] == 0


def test_a_bad_priority_in_a_file_names_its_entry(tmp_path):
    path = write(tmp_path, "p.yaml", "- {url: 'http://127.0.0.1/a', priority: high}\n- {url: 'http://127.0.0.1/b', priority: yes}\n")
    with pytest.raises(SourceError) as error:
        read_source_file(path)
    assert "entry 1: priority 'high' is not a whole number" in str(error.value)
    assert "entry 2: priority True is not a whole number" in str(error.value)


@conformance
def test_the_collectors_claim_takes_a_higher_priority_source_due_later_first(engine, db_url):
    """Within the due set, priority first: a source due 9 minutes ago at priority 0 (not
    yet aged one level) waits behind one due a minute ago at priority 5 (the collector's
    own, polite, claim). Aging is tests/test_claim.py's."""
    from pipeline.fetching.politeness import PoliteQueue

    env = {"DATABASE_URL": db_url}
    early = int(run("sources", "add", "http://127.0.0.1/early", env=env).stdout)
    later = int(run("sources", "add", "http://127.0.0.2/later", "--priority", "5", env=env).stdout)
    t = schema.sources
    with engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id == early).values(next_fetch_at=now() - timedelta(minutes=9)))
        conn.execute(sa.update(t).where(t.c.id == later).values(next_fetch_at=now() - timedelta(minutes=1)))
    queue = PoliteQueue(engine)
    assert queue.claim("w", 1).ids == [later]
    assert queue.claim("w", 1).ids == [early]


def test_sources_show_tells_one_source_s_schedule_health_latest_listings_and_fetches(engine, db_url):
    """`sources show ID`: what an operator asks of one source, without SQL. The first
    fetch here fails (nothing serves the feed yet), the second lists two items."""
    from pipeline.core.settings import Settings
    from pipeline.fetching.collector import Collector
    from pipeline.listings.processor import Processor
    from tests.http_server import LocalServer
    from tests.test_collector import rss

    env = {"DATABASE_URL": db_url}
    server = LocalServer().start()
    try:
        source_id = run("sources", "add", server.url("/feed"), "--name", "Jobs", env=env).stdout.strip()
        settings = Settings(database_url=db_url, allow_networks=("127.0.0.1/32",), http_timeout_seconds=2.0)
        Collector(engine, settings, "test").run()  # 404: a failure
        server.routes["/feed"] = lambda h: h.reply(200, rss([("a", "Python developer"), ("b", "Rust developer")]),
                                                   {"Content-Type": "application/rss+xml"})
        run("sources", "refresh", source_id, env=env)
        Collector(engine, settings, "test").run()
        Processor(engine, settings, "test").run()
    finally:
        server.stop()
    shown = run("sources", "show", source_id, env=env)
    assert shown.returncode == 0, shown
    lines = shown.stdout.splitlines()
    assert lines[0] == f"source {source_id}: Jobs (rss) {server.url('/feed')}"
    assert "2 listings, the latest:" in shown.stdout and "Rust developer  http://127.0.0.1/b" in shown.stdout
    fetches = [line for line in lines if re.match(r"\s+\d{4}-\d\d-\d\dT.*Z\s+(ok|http_4xx)", line)]
    assert len(fetches) == 2 and " ok 200, 2 items seen, 2 new" in fetches[0] and "http_4xx 404" in fetches[1], lines
    data = json.loads(run("sources", "show", source_id, "--json", env=env).stdout)
    assert (data["listings"], [f["success"] for f in data["recent_fetches"]]) == (2, [True, False])
    assert_one_line_error(run("sources", "show", "999999", env=env), "no source with id 999999")


def test_a_source_removed_while_a_processor_writes_its_rows_waits_for_it_instead_of_deadlocking(pg_engine):
    """PostgreSQL's row locks. A processor's transaction locks a source's raw rows, then,
    inserting a listing, its source (the foreign key). The removal used to take the
    source first: each waited for the other, and one was aborted. Starts a thread for
    the removal and waits for a state: the removal blocked on the processor's lock."""
    raw, listings = schema.listings_raw, schema.listings
    with pg_engine.begin() as conn:  # processed already: no other test's claim takes it
        source_id = add_source(conn, "http://127.0.0.1/removed-while-processed")
        add_raw_rows(conn, source_id, 1)
        conn.execute(sa.update(raw).where(raw.c.source_id == source_id).values(processed_at=now()))
    done: dict[str, object] = {}

    def remove() -> None:
        try:
            with pg_engine.begin() as conn:
                done["pid"] = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                done["counts"] = remove_sources(conn, [source_id])
        except Exception as exc:  # the test's assertion names it
            done["error"] = exc

    with pg_engine.connect() as processor, processor.begin():
        processor.execute(sa.update(raw).where(raw.c.source_id == source_id).values(processed_at=now()))
        remover = threading.Thread(target=remove)
        remover.start()
        with pg_engine.connect() as probe:
            def removal_waits() -> bool:
                assert "error" not in done, done["error"]
                return "pid" in done and probe.exec_driver_sql(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %(pid)s",
                    {"pid": done["pid"]}).scalar() is True

            wait_until("the removal to wait for the processor's lock", removal_waits, timeout=50, every=0.05)
        processor.execute(sa.insert(listings).values(source_id=source_id, source_item_id="x",
                                                     url="http://127.0.0.1/x", content_hash="h"))
    remover.join()
    assert "error" not in done, done.get("error")
    with pg_engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).where(schema.sources.c.id == source_id)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).where(listings.c.source_id == source_id)).scalar_one() == 0


@conformance
def test_a_removed_sources_id_is_never_given_again_and_filters_naming_only_it_end_with_it(backend, engine):
    """On SQLite a removed source's id went to the next source added (a rowid is the
    largest plus one), and a filter ``source:2 python`` kept after source 2 was removed
    followed the new source 2. Every table's ids are now never given twice, and a
    filter that can match only a removed source's listings ends with it; one that names
    it beside other alternatives, by name, or in an exclusion stays."""
    from pipeline.catalogue import users

    with engine.begin() as conn:
        kept = add_source(conn, "http://127.0.0.1/kept", name="Kept")
        gone = add_source(conn, "http://127.0.0.1/gone", name="Gone")
        users.add_user(conn, "dora", webhook="http://127.0.0.1:9/hook", secret="s" * 16)
        ending = [users.add_filter(conn, "dora", query) for query in (
            f"source:{gone} python", f"(source:{gone} rust) OR (source:{gone} go)", f"python source:{gone} -source:{kept}")]
        staying = [users.add_filter(conn, "dora", query) for query in (
            f"source:{gone} OR rust", 'source:"Gone" python', f"python -source:{gone}", f"source:{kept} python")]
    with engine.begin() as conn:
        counts = remove_sources(conn, [gone])
    assert counts["filters"] == len(ending)
    f = schema.filters
    with engine.begin() as conn:
        assert sorted(conn.execute(sa.select(f.c.id)).scalars()) == staying
        again = add_source(conn, "http://127.0.0.1/new", name="New")
    assert again > gone, "the id of a removed source names nothing again"
    if backend == "sqlite":  # every table with an id, not only sources
        with engine.connect() as conn:
            ddl = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'").all())
        assert [t.name for t in schema.ID_TABLES if "AUTOINCREMENT" not in ddl[t.name]] == []


def test_a_source_is_edited_in_place_keeping_its_id_items_and_owner(engine, db_url):
    """A source's name, URL, category, options or group could not be changed (`sources set
    --name` was "No such option"), and removing and adding it again lost its items, its
    fetch history and its owner. `sources edit` changes each in place, validated as `add`
    validates it, and refuses a URL another source has."""
    env = {"DATABASE_URL": db_url}
    first = run("sources", "add", "http://127.0.0.1:9/feed", "--owner", "nobody", env=env)
    assert first.returncode == 1, "no such user yet"
    assert run("users", "add", "olga", "--apprise", "json://127.0.0.1:9/hook",
               env={**env, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}).returncode == 0
    source = run("sources", "add", "http://127.0.0.1:9/feed", "--owner", "olga", env=env).stdout.strip()
    other = run("sources", "add", "http://127.0.0.1:9/other", env=env).stdout.strip()
    with engine.begin() as conn:
        add_raw_rows(conn, int(source), 3)
    done = run("sources", "edit", source, "--name", "Jobs", "--category", "it", "--url",
               "HTTP://LOCALHOST:9/feed2?utm_source=x", env=env)
    assert done.returncode == 0 and done.stdout.strip().startswith(f"source {source}: name 'Jobs'"), done
    [row] = [r for r in sources_rows(engine) if r["id"] == int(source)]
    assert (row["url"], row["name"], row["config"], row["politeness_group"]) == (
        "http://localhost:9/feed2", "Jobs", {"category": "it"}, "localhost"), "validated as add; group by host"
    with engine.connect() as conn:
        kept = conn.execute(sa.select(sa.func.count()).select_from(schema.listings_raw)
                            .where(schema.listings_raw.c.source_id == int(source))).scalar_one()
    assert kept == 3
    assert "owner olga" in run("sources", "owner", source, env=env).stdout
    assert_one_line_error(run("sources", "edit", source, "--url", "http://127.0.0.1:9/other", env=env),
                          f"source {other} has URL http://127.0.0.1:9/other already")
    assert run("sources", "edit", source, "--group", "mine", env=env).returncode == 0
    assert run("sources", "edit", source, "--url", "http://127.0.0.2:9/feed", env=env).returncode == 0
    [row] = [r for r in sources_rows(engine) if r["id"] == int(source)]
    assert row["politeness_group"] == "mine", "a group of its own stays with a new URL"
    assert_one_line_error(run("sources", "edit", source, "--config", "[1]", env=env), "JSON object")
