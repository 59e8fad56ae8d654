"""The youtube adapter against a server on 127.0.0.1 that plays YouTube: the public Atom
feed, a channel page for @handles, and the Data API v3.

A source URL on a host other than youtube.com is read from that host, so the tests'
server stands in for www.youtube.com, and ``api_base`` in the config for the API.
"""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import sqlalchemy as sa

from pipeline.core.backoff import PACIFIC, next_quota_reset
from pipeline.fetching.youtube import PUBLIC_ORIGIN, Target, parse_target
from pipeline.storage import schema
from tests.helpers import add_source, now
from tests.http_server import Handler, LocalServer
from tests.test_collector import collector, completed_events, rows

CHANNEL = "UCabcdefghijklmnopqrstuv"
OTHER_CHANNEL = "UCzzzzzzzzzzzzzzzzzzzzzz"
VIDEOS = [("vid00000001", "First video", "2026-11-20T15:00:00+00:00"),
          ("vid00000002", "Second video", "2026-11-21T09:30:00+00:00")]


def atom(videos=VIDEOS, views: int = 42) -> bytes:
    entries = "".join(
        f"""<entry><id>yt:video:{vid}</id><yt:videoId>{vid}</yt:videoId>
        <yt:channelId>{CHANNEL}</yt:channelId><title>{title}</title>
        <link rel="alternate" href="https://www.youtube.com/watch?v={vid}"/>
        <author><name>Chan</name><uri>https://www.youtube.com/channel/{CHANNEL}</uri></author>
        <published>{published}</published><updated>2026-11-22T00:00:00+00:00</updated>
        <media:group><media:title>{title}</media:title>
        <media:thumbnail url="https://i1.ytimg.com/vi/{vid}/hqdefault.jpg" width="480" height="360"/>
        <media:description>About {title}</media:description>
        <media:community><media:statistics views="{views}"/></media:community></media:group></entry>"""
        for vid, title, published in videos
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><feed xmlns:yt="http://www.youtube.com/xml/schemas/2015"'
        ' xmlns:media="http://search.yahoo.com/mrss/" xmlns="http://www.w3.org/2005/Atom">'
        f"<id>yt:channel:{CHANNEL[2:]}</id><title>Chan</title>{entries}</feed>"
    ).encode()


def api_items(videos=VIDEOS) -> bytes:
    return json.dumps({"items": [
        {"snippet": {"title": title, "description": f"About {title}", "publishedAt": "2026-11-22T00:00:00Z",
                     "channelTitle": "Chan", "videoOwnerChannelTitle": "Chan", "videoOwnerChannelId": CHANNEL,
                     "resourceId": {"kind": "youtube#video", "videoId": vid},
                     "thumbnails": {"default": {"url": "x"},
                                    "high": {"url": f"https://i1.ytimg.com/vi/{vid}/hqdefault.jpg"}}},
         "contentDetails": {"videoId": vid, "videoPublishedAt": published.replace("+00:00", "Z")}}
        for vid, title, published in videos
    ] + [  # a private video in the uploads: skipped
        {"snippet": {"title": "Private video", "description": "",
                     "resourceId": {"videoId": "private0001"}}, "contentDetails": {"videoId": "private0001"}},
    ]}).encode()


@pytest.fixture
def youtube():
    """A server that answers like www.youtube.com and the Data API, and counts calls."""
    srv = LocalServer().start()
    srv.feed_body = atom()

    def feed(h: Handler) -> None:
        query = parse_qs(urlsplit(h.path).query)
        if query.get("channel_id") == [CHANNEL] or query.get("playlist_id") == ["PLlist123"]:
            h.reply(200, srv.feed_body, {"Content-Type": "application/atom+xml"})
        else:
            h.reply(404, b"no such channel")

    def handle_page(h: Handler) -> None:
        # Other channels' ids come first on a real page (recommendations): only the
        # canonical link names the page's own channel.
        page = (f'<html><head><script>var d = {{"channelId":"{OTHER_CHANNEL}"}};</script>'
                f'<link rel="canonical" href="https://www.youtube.com/channel/{CHANNEL}"></head>'
                "<body>a channel</body></html>")
        h.reply(200, page.encode(), {"Content-Type": "text/html"})

    srv.routes["/feeds/videos.xml"] = feed
    srv.routes["/@somechannel"] = handle_page
    yield srv
    srv.stop()


def source_row(engine: sa.Engine) -> dict:
    [row] = rows(engine, schema.sources)
    return row


def make_due(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"https://www.youtube.com/channel/{CHANNEL}", Target("channel", CHANNEL, PUBLIC_ORIGIN)),
        (f"https://m.youtube.com/channel/{CHANNEL}/videos", Target("channel", CHANNEL, PUBLIC_ORIGIN)),
        ("https://www.youtube.com/@Some.Channel", Target("handle", "@Some.Channel", PUBLIC_ORIGIN)),
        ("https://www.youtube.com/@Some.Channel/videos", Target("handle", "@Some.Channel", PUBLIC_ORIGIN)),
        ("https://www.youtube.com/user/oldname", Target("user", "oldname", PUBLIC_ORIGIN)),
        ("https://www.youtube.com/c/CustomName", Target("custom", "CustomName", PUBLIC_ORIGIN)),
        ("https://www.youtube.com/playlist?list=PLlist123", Target("playlist", "PLlist123", PUBLIC_ORIGIN)),
        ("https://www.youtube.com/watch?v=abc&list=PLlist123", Target("playlist", "PLlist123", PUBLIC_ORIGIN)),
        (f"https://www.youtube.com/feeds/videos.xml?channel_id={CHANNEL}", Target("channel", CHANNEL, PUBLIC_ORIGIN)),
        (f"http://127.0.0.1:8000/channel/{CHANNEL}", Target("channel", CHANNEL, "http://127.0.0.1:8000")),
    ],
)
def test_every_url_form_names_its_target_and_feed(url, expected):
    assert parse_target(url) == expected


def test_feed_urls():
    assert Target("channel", CHANNEL, PUBLIC_ORIGIN).feed_url() == (
        f"https://www.youtube.com/feeds/videos.xml?channel_id={CHANNEL}")
    assert Target("playlist", "PLx", PUBLIC_ORIGIN).feed_url().endswith("?playlist_id=PLx")
    assert Target("handle", "@a", PUBLIC_ORIGIN).feed_url(CHANNEL).endswith(f"?channel_id={CHANNEL}")
    with pytest.raises(ValueError, match="must be resolved"):
        Target("handle", "@a", PUBLIC_ORIGIN).feed_url()


def test_a_channel_from_the_public_feed(engine, youtube):
    with engine.begin() as conn:
        add_source(conn, youtube.url(f"/channel/{CHANNEL}"), source_type="youtube")
    stats = collector(engine).run()
    assert (stats.succeeded, stats.items_new) == (1, 2)
    raw = {r["source_item_id"]: r["raw_json"] for r in rows(engine, schema.listings_raw)}
    assert raw["yt:video:vid00000001"] == {
        "title": "First video", "url": "https://www.youtube.com/watch?v=vid00000001",
        "summary": "About First video", "published_at": "2026-11-20T15:00:00+00:00", "author": "Chan",
        "categories": [], "video_id": "vid00000001", "channel_id": CHANNEL,
        "thumbnail": "https://i1.ytimg.com/vi/vid00000001/hqdefault.jpg",
    }
    # View counts change on every fetch; they are not part of a video, so nothing is new.
    youtube.feed_body = atom(views=9000)
    make_due(engine)
    assert collector(engine).run().items_new == 0
    assert source_row(engine)["url"] == youtube.url(f"/channel/{CHANNEL}"), "the channel URL is kept"


def test_a_handle_is_resolved_once_and_its_channel_id_stored(engine, youtube):
    with engine.begin() as conn:
        add_source(conn, youtube.url("/@somechannel"), source_type="youtube")
    assert collector(engine).run().items_new == 2
    assert source_row(engine)["config"] == {"channel_id": CHANNEL}
    make_due(engine)
    collector(engine).run()
    paths = [urlsplit(r["path"]).path for r in youtube.requests]
    assert paths == ["/@somechannel", "/feeds/videos.xml", "/feeds/videos.xml"], "the page is read once"


def test_a_handle_page_without_a_channel_id_is_a_parse_error(engine, youtube):
    youtube.routes["/@nobody"] = lambda h: h.reply(200, b"<html><body>nothing</body></html>")
    with engine.begin() as conn:
        add_source(conn, youtube.url("/@nobody"), source_type="youtube")
    assert dict(collector(engine).run().failed) == {"parse_error": 1}
    assert source_row(engine)["config"] == {}


def test_a_playlist_from_the_public_feed(engine, youtube):
    with engine.begin() as conn:
        add_source(conn, youtube.url("/playlist?list=PLlist123"), source_type="youtube")
    assert collector(engine).run().items_new == 2
    assert "playlist_id=PLlist123" in youtube.requests[-1]["path"]


def api_routes(server: LocalServer, playlist_items) -> None:
    def channels(h: Handler) -> None:
        query = parse_qs(urlsplit(h.path).query)
        found = query.get("forHandle") == ["@somechannel"]
        h.reply(200, json.dumps({"items": [{"id": CHANNEL}] if found else []}).encode())

    server.routes["/youtube/v3/channels"] = channels
    server.routes["/youtube/v3/playlistItems"] = playlist_items


def test_the_data_api_with_the_key_in_a_header_only(engine, youtube, caplog):
    def playlist_items(h: Handler) -> None:
        query = parse_qs(urlsplit(h.path).query)
        if h.headers.get("X-Goog-Api-Key") != "k-secret" or query.get("playlistId") != ["UU" + CHANNEL[2:]]:
            h.reply(400, b"{}")
        else:
            h.reply(200, api_items(), {"Content-Type": "application/json", "ETag": '"p1"'})

    api_routes(youtube, playlist_items)
    config = {"api_key": "k-secret", "api_base": youtube.url("/youtube/v3")}
    with engine.begin() as conn:
        add_source(conn, youtube.url("/@somechannel"), source_type="youtube", config=config)
    with caplog.at_level("DEBUG"):
        stats = collector(engine).run()
    assert (stats.succeeded, stats.items_new) == (1, 2), "the private video is skipped"
    assert source_row(engine)["config"] == {**config, "channel_id": CHANNEL}
    assert source_row(engine)["etag"] == '"p1"'
    assert all("k-secret" not in r["path"] for r in youtube.requests)
    assert "k-secret" not in caplog.text
    assert "k-secret" not in json.dumps([dict(e) for e in rows(engine, schema.ingestion_events)], default=str)


def test_feed_and_api_give_a_video_one_identity(engine, youtube):
    api_routes(youtube, lambda h: h.reply(200, api_items()))
    with engine.begin() as conn:
        source_id = add_source(conn, youtube.url(f"/channel/{CHANNEL}"), source_type="youtube")
    assert collector(engine).run().items_new == 2
    with engine.begin() as conn:  # the operator adds an API key
        conn.execute(sa.update(schema.sources).values(
            next_fetch_at=None, config={"api_key": "k", "api_base": youtube.url("/youtube/v3")}))
    stats = collector(engine).run()
    assert (stats.succeeded, stats.items_seen, stats.items_new) == (1, 2, 0)
    assert len(rows(engine, schema.listings_raw)) == 2 and source_id


def quota_exceeded(h: Handler) -> None:
    h.reply(403, json.dumps({"error": {"code": 403, "message": "The request cannot be completed because you have exceeded your quota.",
                                       "errors": [{"reason": "quotaExceeded", "domain": "youtube.quota"}]}}).encode())


def test_a_spent_quota_waits_for_midnight_in_california(engine, youtube):
    api_routes(youtube, quota_exceeded)
    with engine.begin() as conn:
        add_source(conn, youtube.url(f"/channel/{CHANNEL}"), source_type="youtube",
                   config={"api_key": "k", "api_base": youtube.url("/youtube/v3")})
    before = now()
    assert dict(collector(engine).run().failed) == {"youtube_quota": 1}
    row = source_row(engine)
    reset = next_quota_reset(before)
    assert reset <= row["next_fetch_at"] <= reset + timedelta(minutes=5)
    assert row["next_fetch_at"].astimezone(PACIFIC).hour == 0
    assert "quotaExceeded" in completed_events(engine)[row["id"]]["details"]["error"]


def test_a_bad_key_is_invalid_config(engine, youtube):
    api_routes(youtube, lambda h: h.reply(400, json.dumps(
        {"error": {"code": 400, "message": "API key not valid.", "errors": [{"reason": "keyInvalid"}]}}).encode()))
    with engine.begin() as conn:
        add_source(conn, youtube.url(f"/channel/{CHANNEL}"), source_type="youtube",
                   config={"api_key": "wrong", "api_base": youtube.url("/youtube/v3")})
    assert dict(collector(engine).run().failed) == {"invalid_config": 1}


def test_an_unknown_handle_through_the_api_is_http_4xx(engine, youtube):
    api_routes(youtube, lambda h: h.reply(200, api_items()))
    with engine.begin() as conn:
        add_source(conn, youtube.url("/@nobody"), source_type="youtube",
                   config={"api_key": "k", "api_base": youtube.url("/youtube/v3")})
    assert dict(collector(engine).run().failed) == {"http_4xx": 1}
