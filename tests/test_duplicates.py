"""One feed, one source; one item, one notification per user, however many sources carry
it. On PostgreSQL and SQLite."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from pipeline.catalogue import sources, users
from pipeline.core import politeness
from pipeline.core.errors import SourceError
from pipeline.core.urls import canonical_url, item_key, url_host, url_site
from pipeline.storage import schema
from tests.helpers import add_source
from tests.http_server import LocalServer
from tests.test_collector import collector, rss, serve
from tests.test_notifier import add_user, notifier, posts
from tests.test_processor import add_raw, processor


@pytest.mark.parametrize(("spelling", "canonical"), [
    ("HTTP://Example.COM/feed", "http://example.com/feed"),
    ("http://example.com:80/feed", "http://example.com/feed"),
    ("https://example.com:443/feed", "https://example.com/feed"),
    ("http://example.com/feed#latest", "http://example.com/feed"),
    ("http://example.com", "http://example.com/"),
    ("http://example.com/a%2fb?q=%7e", "http://example.com/a%2Fb?q=%7E"),
    ("http://example.com.:8080/feed", "http://example.com:8080/feed"),
    ("http://[::1]:80/x", "http://[::1]/x"),
    # One machine, one spelling: the resolver reads all of these as 127.0.0.1.
    ("http://127.1/x", "http://127.0.0.1/x"),
    ("http://2130706433/x", "http://127.0.0.1/x"),
    ("http://0x7f.0.0.1/x", "http://127.0.0.1/x"),
    ("http://0177.0.0.1/x", "http://127.0.0.1/x"),
    ("http://[::ffff:127.0.0.1]/x", "http://127.0.0.1/x"),
    ("http://[0:0:0:0:0:0:0:1]/x", "http://[::1]/x"),
    ("http://bücher.example/x", "http://xn--bcher-kva.example/x"),
])
def test_spellings_of_one_url_have_one_canonical_form(spelling, canonical):
    assert canonical_url(spelling) == canonical


@pytest.mark.parametrize("other", [
    "http://example.com/Feed",  # paths are case-sensitive
    "http://example.com/feed/",  # a trailing slash can name another resource
    "http://www.example.com/feed",
    "https://example.com/feed",  # another scheme is another server
    "http://example.com:8080/feed",
    "http://example.com/feed?b=1&a=2",
])
def test_urls_that_may_name_other_resources_stay_apart(other):
    assert canonical_url(other) != canonical_url("http://example.com/feed")


def test_spellings_of_one_host_share_one_politeness_group():
    # Once, each spelling was a group of its own, so writing one host seven ways gave
    # it seven times the politeness limit.
    spellings = ["http://127.0.0.1:8080/a", "http://127.1:8080/b", "http://2130706433/c",
                 "http://0x7f000001/d", "http://[::ffff:127.0.0.1]/e", "HTTP://127.0.0.1./f"]
    assert {politeness.group_for(url, "rss") for url in spellings} == {"127.0.0.1"}
    assert politeness.group_for("http://[0::1]/x", "rss") == "::1"


def test_a_politeness_group_and_a_site_read_one_host_and_a_malformed_url_has_none():
    """One rule for a URL's host (``url_host``): the politeness group by host is it, the
    group by domain and a listing's site are its registrable domain; a URL that cannot
    be parsed has no host and is the default group, not an error (it once raised in
    ``group_for`` where ``url_site`` answered "")."""
    for url in ("http://[0::1]/x", "https://a.blog.example.co.uk:8443/p", "http://127.1/"):
        assert politeness.group_for(url, "rss") == url_host(url)
        assert politeness.group_for(url, "rss", by="domain") == url_site(url)
    for malformed in ("http://[::1/x", "http://[not-an-ip]/", "http://a b/", "not a url", ""):
        assert url_host(malformed) == url_site(malformed) == ""
        assert politeness.group_for(malformed, "rss") == politeness.DEFAULT


def test_a_second_spelling_of_a_source_is_refused_with_the_existing_id(engine):
    with engine.begin() as conn:
        first = sources.add_source(conn, sources.make_spec("http://feeds.example.com/jobs"))
    for spelling in ("HTTP://FEEDS.example.com/jobs", "http://feeds.example.com:80/jobs",
                     "http://feeds.example.com/jobs#new"):
        with engine.begin() as conn, pytest.raises(SourceError, match=rf"\(id {first}\)"):
            sources.add_source(conn, sources.make_spec(spelling))
    with engine.begin() as conn:
        result = sources.import_sources(conn, [sources.make_spec("HTTP://feeds.example.com/jobs#x"),
                                               sources.make_spec("http://feeds.example.com/other")])
    assert (result.added, result.present) == (1, 1)


@pytest.fixture
def site():
    srv = LocalServer().start()
    srv.routes["/hook"] = lambda h: h.reply(204)
    yield srv
    srv.stop()


def test_an_item_carried_by_two_sources_reaches_a_user_once(engine, site):
    # One feed served under two URLs that are not spellings of each other (a mirror, or
    # two addresses that redirect to one feed): two sources, two listings per item.
    body = rss([("job-1", "Python developer"), ("job-2", "Python lead")])
    serve(site, "/feed", body)
    serve(site, "/mirror/feed", body)
    with engine.begin() as conn:
        add_source(conn, site.url("/feed"))
        add_source(conn, site.url("/mirror/feed"))
        add_user(conn, "alice", site.url("/hook"))
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "alice", "python")
        users.add_filter(conn, "bob", "lead")
    assert collector(engine).run().items_new == 4
    assert processor(engine).run().inserted == 4
    stats = notifier(engine).run()
    assert (stats.listings_matched, stats.notifications_created, stats.sent) == (4, 3, 3)
    bodies = [json.loads(p["body"]) for p in posts(site)]
    by_user = sorted((b["user"]["name"], b["listing"]["title"]) for b in bodies)
    assert by_user == [("alice", "Python developer"), ("alice", "Python lead"), ("bob", "Python lead")]


def test_entries_sharing_a_link_but_not_an_id_are_separate_items(engine, site):
    with engine.begin() as conn:
        source_id = add_source(conn, "http://127.0.0.1/page")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "opening")
        # A page watched for changes: each change is an item with the page's own URL.
        add_raw(conn, source_id, "change-1", title="New opening: editor", url="http://127.0.0.1/page")
        add_raw(conn, source_id, "change-2", title="New opening: writer", url="http://127.0.0.1/page")
    processor(engine).run()
    assert notifier(engine).run().sent == 2
    keys = [item_key("http://127.0.0.1/page", "change-1"), item_key("HTTP://127.0.0.1:80/page#x", "change-1")]
    assert keys[0] == keys[1] and keys[0] != item_key("http://127.0.0.1/page", "change-2")
    with engine.connect() as conn:
        stored = conn.execute(sa.select(schema.notifications.c.item_key)).scalars().all()
    assert sorted(stored) == sorted([keys[0], item_key("http://127.0.0.1/page", "change-2")])
