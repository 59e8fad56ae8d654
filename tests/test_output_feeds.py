"""Output feeds (pipeline/catalogue/feeds.py, pipeline/web/): a user's matches, or one
filter's, as Atom and JSON Feed at a secret URL, answered by `pipeline serve` over a real
local server and read back by feedparser; conditional GET; tokens that are revoked,
unknown or of someone else open nothing; hostile listing text stays text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import feedparser
import httpx
import pytest
import sqlalchemy as sa

from pipeline.catalogue import feeds, users
from pipeline.catalogue.feeds import Entry, Scope
from pipeline.core.errors import ConfigError, UserError
from pipeline.core.settings import Settings
from pipeline.fetching.jsonfeed import parse_json_feed
from pipeline.storage import schema
from pipeline.web import feeds as render
from pipeline.web.app import FeedApp
from tests.helpers import add_source, served
from tests.test_cli import assert_one_line_error, run
from tests.test_notifier import add_listing, add_user, notifier


@pytest.fixture
def site(engine) -> Iterator[str]:
    """`pipeline serve`'s application on a real server on a free port (a thread)."""
    with served(FeedApp(engine)) as url:
        yield url


def seeded(engine, receiver) -> dict[str, int]:
    """alice (two filters: python, then remote) and bob (rust), four listings, notified."""
    with engine.begin() as conn:
        source_id = add_source(conn, "http://127.0.0.1/feed", name="Job board")
        add_user(conn, "alice", receiver.url("/hook"))
        add_user(conn, "bob", receiver.url("/hook"))
        ids = {
            "python": users.add_filter(conn, "alice", "python"),
            "remote": users.add_filter(conn, "alice", "remote"),
            "rust": users.add_filter(conn, "bob", "rust"),
        }
        add_listing(conn, source_id, "a", "Python developer", summary="in the office")
        add_listing(conn, source_id, "b", "Remote python engineer", summary="anywhere")
        add_listing(conn, source_id, "c", "Remote designer", summary="figma")
        add_listing(conn, source_id, "d", "Rust developer", summary="systems")
    assert notifier(engine).run().notifications_created == 4
    return ids


PLAIN_ENCODING = {"Accept-Encoding": "identity"}  # httpx asks for gzip unless told


def fetch_feed(url: str) -> feedparser.FeedParserDict:
    response = httpx.get(url)
    assert response.status_code == 200, response.text
    parsed = feedparser.parse(response.content, response_headers=dict(response.headers))
    assert not parsed.bozo, parsed.get("bozo_exception")
    return parsed


def test_a_user_s_feed_holds_their_matches_newest_first_and_no_one_else_s(engine, receiver, site):
    seeded(engine, receiver)
    with engine.begin() as conn:
        made = feeds.add_feed(conn, "alice")
    atom = fetch_feed(f"{site}/feeds/{made.token}.atom")
    assert atom.version == "atom10"
    titles = [e.title for e in atom.entries]
    assert sorted(titles) == ["Python developer", "Remote designer", "Remote python engineer"]
    assert "Rust developer" not in titles, "bob's match is bob's"
    first = atom.entries[0]
    assert first.link.startswith("http://127.0.0.1/") and first.id.startswith("urn:uuid:")
    assert "From: Job board" in first.content[0].value
    assert atom.feed.title == "Matches for alice"
    assert {link.rel: link.href for link in atom.feed.links}["self"] == f"{site}/feeds/{made.token}.atom"

    response = httpx.get(f"{site}/feeds/{made.token}.json")
    assert response.headers["content-type"] == "application/feed+json; charset=utf-8"
    document = response.json()
    assert document["version"] == "https://jsonfeed.org/version/1.1"
    assert [i["title"] for i in document["items"]] == titles, "one order, one content, two formats"
    assert [i["id"] for i in document["items"]] == [e.id for e in atom.entries]
    assert document["feed_url"] == f"{site}/feeds/{made.token}.json"
    # feedparser 6 reads no JSON Feed; the pipeline's own reader of them does.
    read = parse_json_feed(response.content, f"{site}/feeds/{made.token}.json").items
    assert [(i.source_item_id, i.raw["title"]) for i in read] == [(e.id, e.title) for e in atom.entries]


def test_a_filter_s_feed_holds_what_it_matches_also_when_an_older_filter_was_credited(engine, receiver, site):
    """alice hears once of "Remote python engineer", credited to her older filter
    (python); her remote filter's feed must still show it."""
    ids = seeded(engine, receiver)
    with engine.connect() as conn:
        credited = dict(conn.execute(sa.select(schema.listings.c.title, schema.notifications.c.filter_id)
                                     .join(schema.listings)).all())
    assert credited["Remote python engineer"] == ids["python"]
    with engine.begin() as conn:
        remote = feeds.add_feed(conn, "alice", filter_id=ids["remote"])
        python = feeds.add_feed(conn, "alice", filter_id=ids["python"])
        with pytest.raises(UserError, match="not one of 'alice'"):
            feeds.add_feed(conn, "alice", filter_id=ids["rust"])
    remote_feed = fetch_feed(f"{site}/feeds/{remote.token}.atom")
    assert sorted(e.title for e in remote_feed.entries) == ["Remote designer", "Remote python engineer"]
    assert remote_feed.feed.title == "Matches for alice: remote"
    assert sorted(e.title for e in fetch_feed(f"{site}/feeds/{python.token}.atom").entries) == [
        "Python developer", "Remote python engineer"]
    # A disabled filter's feed still shows what it matched.
    with engine.begin() as conn:
        users.set_filter_enabled(conn, ids["remote"], False)
    assert len(fetch_feed(f"{site}/feeds/{remote.token}.atom").entries) == 2


def test_conditional_requests_get_304_until_the_feed_changes(engine, receiver, site):
    seeded(engine, receiver)
    with engine.begin() as conn:
        made = feeds.add_feed(conn, "alice")
    url = f"{site}/feeds/{made.token}.atom"
    first = httpx.get(url, headers=PLAIN_ENCODING)
    etag, modified = first.headers["etag"], first.headers["last-modified"]
    assert first.headers["cache-control"].startswith("private")
    for headers in ({"If-None-Match": etag}, {"If-None-Match": f'"other", W/{etag}'}, {"If-None-Match": "*"},
                    {"If-Modified-Since": modified}):
        again = httpx.get(url, headers={**headers, **PLAIN_ENCODING})
        assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag), headers
    other = {"If-None-Match": '"other"', "If-Modified-Since": modified, **PLAIN_ENCODING}
    assert httpx.get(url, headers=other).status_code == 200, "If-None-Match decides when it is sent"
    assert httpx.get(url, headers={"If-Modified-Since": "yesterday-ish"}).status_code == 200
    zipped = httpx.get(url, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip" and zipped.content == first.content
    assert zipped.headers["etag"] != etag and "Accept-Encoding" in zipped.headers["vary"]
    assert httpx.get(url, headers={"Accept-Encoding": "gzip;q=0"}).headers.get("content-encoding") is None
    head = httpx.head(url, headers=PLAIN_ENCODING)
    assert (head.status_code, head.content, head.headers["etag"]) == (200, b"", etag)
    with engine.begin() as conn:
        add_listing(conn, add_source(conn, "http://127.0.0.1/other"), "e", "Python lead")
    assert notifier(engine).run().notifications_created == 1
    changed = httpx.get(url, headers={"If-None-Match": etag, **PLAIN_ENCODING})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert b"Python lead" in changed.content


def test_a_revoked_unknown_or_malformed_token_opens_nothing_and_the_database_keeps_no_token(
        engine, receiver, site, db_url):
    ids = seeded(engine, receiver)
    with engine.begin() as conn:
        made = feeds.add_feed(conn, "alice")
        of_filter = feeds.add_feed(conn, "alice", filter_id=ids["remote"])
        rows = [dict(r) for r in conn.execute(sa.select(schema.feed_tokens)).mappings()]
    assert not any(made.token in str(value) for row in rows for value in row.values()), "only its hash"
    assert httpx.get(f"{site}/feeds/{made.token}.atom").status_code == 200
    revoked = run("feeds", "revoke", str(made.id), env={"DATABASE_URL": db_url})
    assert revoked.returncode == 0, revoked
    answers = [httpx.get(f"{site}{path}") for path in (
        f"/feeds/{made.token}.atom", f"/feeds/{made.token}.json", f"/feeds/{made.token[:-1]}x.atom",
        "/feeds/short.atom", "/feeds/%00' OR 1=1.atom", f"/feeds/{made.token}.xml", "/")]
    assert {(a.status_code, a.content) for a in answers} == {(404, b"no such feed\n")}, "one answer for each"
    assert httpx.post(f"{site}/feeds/{of_filter.token}.atom").status_code == 405
    with engine.begin() as conn:
        users.remove_filter(conn, ids["remote"])
    assert httpx.get(f"{site}/feeds/{of_filter.token}.atom").status_code == 404, "its filter is gone"
    listed = run("feeds", "list", "--json", env={"DATABASE_URL": db_url})
    assert [(r["id"], r["revoked_at"] is not None) for r in json.loads(listed.stdout)] == [(made.id, True)]


def test_the_command_line_prints_the_urls_once_and_refuses_what_is_wrong(engine, receiver, db_url):
    ids = seeded(engine, receiver)
    env = {"DATABASE_URL": db_url, "PIPELINE_PUBLIC_URL": "https://feeds.example.org/"}
    made = run("feeds", "add", "alice", "--filter", str(ids["remote"]), env=env)
    assert made.returncode == 0, made
    atom_url, json_url = made.stdout.split()
    assert atom_url.startswith("https://feeds.example.org/feeds/") and atom_url.endswith(".atom")
    assert json_url == atom_url.removesuffix(".atom") + ".json"
    token = atom_url.rsplit("/", 1)[1].removesuffix(".atom")
    with engine.connect() as conn:
        scope = feeds.resolve(conn, token)
    assert scope is not None and (scope.user_name, scope.filter_id) == ("alice", ids["remote"])
    assert_one_line_error(run("feeds", "add", "nobody", env=env), "no user named")
    assert_one_line_error(run("feeds", "add", "bob", "--filter", str(ids["remote"]), env=env), "not one of")
    assert_one_line_error(run("feeds", "revoke", "999", env=env), "no feed with id 999")
    assert_one_line_error(run("feeds", "add", "alice", env={**env, "PIPELINE_PUBLIC_URL": "feeds.example.org"}),
                          "PIPELINE_PUBLIC_URL", "base URL")


def test_an_unreachable_database_is_503_with_retry_after(free_postgres_port_url):
    """A request while the database is away gets 503 and Retry-After, never a traceback."""
    engine = sa.create_engine(free_postgres_port_url)
    app = FeedApp(engine)
    for path in ("/feeds/" + "a" * 32 + ".atom", "/healthz"):
        seen: dict = {}

        def start_response(status, headers, seen=seen):
            seen.update(status=status, headers=headers)

        body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.url_scheme": "http",
                             "HTTP_HOST": "x"}, start_response))
        assert seen["status"].startswith("503") and ("Retry-After", "30") in seen["headers"], path
        assert b"Traceback" not in body


def test_an_error_nobody_listed_is_a_plain_500_and_one_log_line(engine, caplog, monkeypatch):
    """The service caught only the database's errors: any other (a push's signature
    header that broke a comparison, say) answered with the server's own traceback."""
    app = FeedApp(engine)

    def broken(*args, **kwargs):
        raise TypeError("comparing strings with non-ASCII characters is not supported")

    monkeypatch.setattr(app, "_feed", broken)
    seen: dict = {}

    def start_response(status, headers):
        seen.update(status=status)

    with caplog.at_level("ERROR", logger="pipeline.web.app"):
        body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/feeds/" + "a" * 32 + ".atom",
                             "wsgi.url_scheme": "http", "HTTP_HOST": "x"}, start_response))
    assert (seen["status"], body) == ("500 Internal Server Error", b"internal error\n")
    [record] = caplog.records
    assert record.getMessage().endswith("failed: TypeError: comparing strings with non-ASCII characters is not supported")
    assert record.exc_info is None, "one line, no traceback"


@pytest.fixture
def free_postgres_port_url() -> str:
    from tests.helpers import free_port

    return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing?connect_timeout=2"


SCOPE = Scope(feed_id=1, user_id=7, user_name="alice <admin>", filter_id=None, query=None,
              created_at=datetime(2026, 11, 1, tzinfo=UTC))
PLAIN = Entry(identity="k1 new", title="Plain", link="https://jobs.example.org/1", summary="text", author=None,
              categories=(), price=None, source="Board", published=datetime(2026, 11, 2, tzinfo=UTC),
              updated=datetime(2026, 11, 3, tzinfo=UTC))


def test_hostile_listing_text_stays_text_and_the_feeds_stay_readable():
    """Markup, control characters XML cannot hold, a lone surrogate, a javascript: link,
    markup in a category and an author: both documents still parse, every value is the
    text it was (less what XML cannot hold), and no link but http(s) is given."""
    hostile = replace(
        PLAIN, identity="k2 new", title="<script>alert(1)</script> & \x00\x1b\ud800 Jobs]]>",
        link="javascript:alert(1)", summary="<b>bold</b> &amp; \x07bell", author="<i>Eve</i>",
        categories=("<img src=x onerror=alert(1)>", "\x01", "ok"), price="€ 1,200 <b>", source="Evil & Co")
    doc = render.Document(SCOPE, [hostile, PLAIN], atom_url="https://f.example/feeds/t.atom",
                          json_url="https://f.example/feeds/t.json")
    atom = feedparser.parse(render.atom(doc))
    assert not atom.bozo, atom.get("bozo_exception")
    first = atom.entries[0]
    assert first.title == "<script>alert(1)</script> &  Jobs]]>"
    [content] = first.content
    assert first.title_detail.type == "text/plain" and content.type == "text/plain"
    assert "<b>bold</b> &amp; bell" in content.value and "Price: € 1,200 <b>" in content.value
    assert "javascript" not in repr(first) and first.author == "<i>Eve</i>"
    assert [t.term for t in first.tags] == ["<img src=x onerror=alert(1)>", "ok"]
    assert atom.entries[1].link == PLAIN.link
    assert atom.feed.title == "Matches for alice <admin>"
    as_json = json.loads(render.json_feed(doc))
    item = as_json["items"][0]
    assert item["title"] == first.title and "url" not in item and item["tags"] == [t.term for t in first.tags]
    assert item["_listing"] == {"source": "Evil & Co", "price": "€ 1,200 <b>"}
    assert as_json["items"][1]["url"] == PLAIN.link


def test_ids_and_dates_follow_the_atom_rules_and_survive_a_restore():
    """Each id an urn:uuid made from what the entry tells (the same after a restore that
    hands out new row ids), every date RFC 3339 in UTC, the feed's updated its newest
    entry's; an empty feed is valid and dated when it was made."""
    later = replace(PLAIN, identity="k3 new", updated=datetime(2026, 11, 5, 12, 30, tzinfo=UTC))
    doc = render.Document(SCOPE, [later, PLAIN], atom_url="https://f.example/a", json_url="https://f.example/j")
    parsed = feedparser.parse(render.atom(doc))
    assert parsed.feed.updated == "2026-11-05T12:30:00Z" and parsed.feed.id.startswith("urn:uuid:")
    assert [e.id for e in parsed.entries] == [doc.entry_id(later), doc.entry_id(PLAIN)]
    assert len({e.id for e in parsed.entries} | {parsed.feed.id}) == 3
    assert doc.entry_id(PLAIN) == render.Document(SCOPE, [], "a", "b").entry_id(replace(PLAIN, title="new title"))
    assert doc.entry_id(PLAIN) != render.Document(replace(SCOPE, user_id=8), [], "a", "b").entry_id(PLAIN)
    assert parsed.entries[1].published == "2026-11-02T00:00:00Z"
    empty = feedparser.parse(render.atom(render.Document(SCOPE, [], "https://f.example/a", "https://f.example/j")))
    assert not empty.bozo and empty.feed.updated == "2026-11-01T00:00:00Z" and empty.entries == []


def test_the_public_url_setting_is_a_base_url():
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"PIPELINE_PUBLIC_URL": "https://feeds.example.org/"}):
        assert Settings.from_env().public_url == "https://feeds.example.org"
    for wrong in ("feeds.example.org", "ftp://x", "https://x/?a=1"):
        with mock.patch.dict(os.environ, {"PIPELINE_PUBLIC_URL": wrong}), pytest.raises(ConfigError, match="base URL"):
            Settings.from_env()


def test_a_filter_feed_reads_pages_of_the_user_s_notifications(engine, receiver, monkeypatch):
    """A quiet filter behind a busy one: its matches are found past the first page."""
    monkeypatch.setattr(feeds, "_PAGE", 3)
    with engine.begin() as conn:
        source_id = add_source(conn, "http://127.0.0.1/feed")
        add_user(conn, "alice", receiver.url("/hook"))
        users.add_filter(conn, "alice", "busy")
        quiet = users.add_filter(conn, "alice", "quiet")
        start = datetime.now(UTC) + timedelta(seconds=1)  # after the filters were made
        add_listing(conn, source_id, "q", "quiet one", ingested_at=start)
        for n in range(8):
            add_listing(conn, source_id, f"b{n}", f"busy {n}", ingested_at=start + timedelta(minutes=n + 1))
    assert notifier(engine).run().notifications_created == 9
    with engine.begin() as conn:
        scope = feeds.resolve(conn, feeds.add_feed(conn, "alice", filter_id=quiet).token)
    assert scope is not None
    assert [e.title for e in feeds.entries(engine, scope)] == ["quiet one"]
    assert len(feeds.entries(engine, replace(scope, filter_id=None), limit=4)) == 4


@pytest.mark.parametrize("command", [("serve",), ("metrics", "serve")])
def test_a_port_in_use_is_one_line(db_url, command):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(*command, "--port", str(port), env={"DATABASE_URL": db_url})
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "in use")
