"""`sources add --check` against pages and feeds served on 127.0.0.1: a page that
advertises its feed adds the feed; a typo, a page with no feed or several, and a failing
source are refused before anything is stored (issue 11: once all were added with exit 0
and failed later, quietly)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from pipeline.storage import schema
from tests.http_server import LocalServer
from tests.test_cli import assert_one_line_error, run
from tests.test_collector import rss

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture
def site():
    srv = LocalServer().start()
    feed = rss([("a", "A job"), ("b", "B job")])
    srv.routes["/feed.xml"] = lambda h: h.reply(200, feed, {"Content-Type": "application/rss+xml"})
    srv.routes["/other.xml"] = lambda h: h.reply(200, feed, {"Content-Type": "application/rss+xml"})
    page = (b"<!DOCTYPE html><html><head><title>Jobs</title>"
            b"<link rel='alternate' type='application/rss+xml' href='/feed.xml'></head><body>hi</body></html>")
    srv.routes["/jobs"] = lambda h: h.reply(200, page, {"Content-Type": "text/html"})
    two = page.replace(b"</head>", b"<link rel='alternate' type='application/atom+xml' href='/other.xml'></head>")
    srv.routes["/two"] = lambda h: h.reply(200, two, {"Content-Type": "text/html; charset=utf-8"})
    srv.routes["/none"] = lambda h: h.reply(200, b"<html><body>no feed here</body></html>", {"Content-Type": "text/html"})
    yield srv
    srv.stop()


def stored(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(sa.select(schema.sources.c.url)).scalars().all()


def env(db_url: str) -> dict[str, str]:
    return {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}


def test_a_page_that_advertises_its_feed_adds_the_feed(engine, db_url, site):
    result = run("sources", "add", site.url("/jobs"), "--check", env=env(db_url))
    assert result.returncode == 0, result.stderr
    assert f"adding the feed it advertises: {site.url('/feed.xml')}" in result.stderr
    assert "checked: 2 items" in result.stderr
    assert stored(engine) == [site.url("/feed.xml")]


def test_the_advertised_feed_keeps_the_options_given_for_the_page(engine, db_url, site):
    result = run("sources", "add", site.url("/jobs"), "--check", "--priority", "7", "--adaptive",
                 "--max-interval", "300", "--interval", "30", env=env(db_url))
    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        [row] = conn.execute(sa.select(schema.sources)).mappings().all()
    assert row["url"] == site.url("/feed.xml")
    assert (row["priority"], row["adaptive_cadence"], row["max_interval_minutes"], row["fetch_interval_minutes"]) == (
        7, True, 300, 30)


def test_a_feed_is_checked_and_added(engine, db_url, site):
    result = run("sources", "add", site.url("/feed.xml"), "--check", env=env(db_url))
    assert result.returncode == 0 and "checked: 2 items" in result.stderr, result.stderr
    assert stored(engine) == [site.url("/feed.xml")]


@pytest.mark.parametrize(("path", "fragment"), [
    ("/two", "names 2 feeds; add the one you mean"),
    ("/none", "is an HTML page that names no feed"),
    ("/typo", "the check failed: http_4xx"),
])
def test_what_will_not_work_is_refused_before_anything_is_stored(engine, db_url, site, path, fragment):
    assert_one_line_error(run("sources", "add", site.url(path), "--check", env=env(db_url)), fragment)
    assert stored(engine) == []


def test_without_check_nothing_changes_for_scripts(engine, db_url, site):
    result = run("sources", "add", site.url("/typo"), env=env(db_url))
    assert result.returncode == 0 and result.stderr == ""
    assert stored(engine) == [site.url("/typo")]


def test_a_youtube_handle_that_does_not_resolve_is_refused_when_checked(engine, db_url, site):
    site.routes["/api/channels"] = lambda h: h.reply(200, b'{"items": []}', {"Content-Type": "application/json"})
    config = json.dumps({"api_key": "KEY-0123456789", "api_base": site.url("/api")})
    result = run("sources", "add", "@nobody-here", "--config", config, "--check", env=env(db_url))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "the check failed" in result.stderr and "KEY-0123456789" not in result.stderr
    assert stored(engine) == []


def test_import_check_adds_advertised_feeds_and_refuses_a_file_with_a_failing_entry(engine, db_url, site, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(f"- url: {site.url('/jobs')}\n  name: Jobs board\n  group: boards\n- url: {site.url('/other.xml')}\n")
    result = run("sources", "import", str(good), "--check", env=env(db_url))
    assert result.returncode == 0, result.stderr
    assert f"importing the feed it advertises: {site.url('/feed.xml')}" in result.stderr
    assert "checked: 4 items in 2 sources" in result.stderr
    with engine.connect() as conn:
        rows = {r.url: r for r in conn.execute(sa.select(schema.sources))}
    assert sorted(rows) == sorted([site.url("/feed.xml"), site.url("/other.xml")])
    feed = rows[site.url("/feed.xml")]
    assert (feed.name, feed.politeness_group) == ("Jobs board", "boards"), "the entry's options follow the feed"

    bad = tmp_path / "bad.yaml"
    bad.write_text(f"- url: {site.url('/feed.xml')}\n- url: {site.url('/typo')}\n- url: {site.url('/none')}\n")
    result = run("sources", "import", str(bad), "--check", env=env(db_url))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "nothing imported" in result.stderr and "entry 2" in result.stderr and "entry 3" in result.stderr
    assert len(stored(engine)) == 2, "nothing more was stored"


@pytest.mark.parametrize("path", ["/jobs", "/feed.xml", "/typo", "/none"])
def test_a_password_in_a_source_url_is_never_shown(engine, db_url, site, path):
    """`sources add --check`, its errors, `sources list` and `--json` showed the password
    of `http://bob:PW@host/feed`, and the default name was the whole URL."""
    url = site.url(path).replace("http://", "http://bob:PW-s3cret@")
    added = run("sources", "add", url, "--check", env=env(db_url))
    listed = run("sources", "list", env=env(db_url))
    as_json = run("sources", "list", "--json", env=env(db_url))
    for result in (added, listed, as_json):
        assert "PW-s3cret" not in result.stdout + result.stderr and "bob" not in result.stdout + result.stderr
    with engine.connect() as conn:
        names = conn.execute(sa.select(schema.sources.c.name)).scalars().all()
    assert not any("PW-s3cret" in name for name in names)
    if added.returncode == 0:
        assert "http://***@127.0.0.1" in listed.stdout and "checked: 2 items at http://***@" in added.stderr
        assert [row["url"].startswith("http://***@") for row in json.loads(as_json.stdout)] == [True]
    else:
        assert "http://***@127.0.0.1" in added.stderr, added.stderr


def test_a_source_named_by_its_url_before_names_were_masked_is_listed_masked(engine, db_url):
    with engine.begin() as conn:
        url = "http://bob:PW-s3cret@127.0.0.1:9/feed"
        conn.execute(sa.insert(schema.sources).values(name=url, url=url, source_type="rss"))
    listed = run("sources", "list", "--json", env=env(db_url))
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["url"]) == ("http://***@127.0.0.1:9/feed",) * 2
