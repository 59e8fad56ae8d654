"""Adaptive cadence: the rule (pipeline/core/cadence.py) with properties and examples,
the publisher's hints (feed and HTTP), the decision, the collector on PostgreSQL and
SQLite against feeds served on 127.0.0.1, and the command line."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from feedparser.encodings import convert_to_utf8
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core import cadence
from pipeline.core.cadence import Bounds, jittered, next_interval, publishing_gap
from pipeline.fetching import quickfeed
from pipeline.fetching.base import Item, Outcome
from pipeline.fetching.decide import Cadence, after_success
from pipeline.fetching.rss import _feedparser_entries, read_feed, refresh_minutes
from pipeline.net.http import fresh_for
from pipeline.storage import schema
from pipeline.storage.politeness_groups import set_limits
from tests.conftest import conformance
from tests.helpers import add_source, now
from tests.test_cli import assert_one_line_error, run
from tests.test_collector import collector, rows
from tests.test_sources import sources_rows

FAST = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
minutes = st.floats(1, 10080, allow_nan=False)


@st.composite
def cases(draw):
    low = draw(st.integers(1, 600))
    high = draw(st.integers(low, 10080))
    current = draw(st.integers(1, 10080))
    gap = draw(st.one_of(st.none(), st.just(math.inf), minutes))
    hint = draw(st.one_of(st.none(), minutes))
    floor = draw(st.one_of(st.just(0.0), st.floats(0, 20000, allow_nan=False)))
    return current, gap, Bounds(low, high, hint, floor), draw(st.booleans())


@FAST
@given(cases())
def test_the_interval_keeps_its_bounds_and_the_group_floor_wins(case):
    current, gap, bounds, unchanged = case
    found = next_interval(current, gap, bounds, unchanged=unchanged)
    assert isinstance(found, int) and cadence.MIN_INTERVAL_MINUTES <= found <= cadence.MAX_INTERVAL_MINUTES
    assert found >= min(math.ceil(bounds.group_floor_minutes), cadence.MAX_INTERVAL_MINUTES), "never faster than the group"
    if bounds.group_floor_minutes <= bounds.max_minutes:
        assert found <= bounds.max_minutes
        assert found >= min(math.ceil(max(bounds.min_minutes, bounds.hint_minutes or 0)), bounds.max_minutes)


@FAST
@given(cases())
def test_the_interval_moves_toward_the_target_at_most_double_or_half(case):
    current, gap, bounds, unchanged = case
    bounds = Bounds(bounds.min_minutes, bounds.max_minutes)  # no hint or floor pushing it
    current = min(max(current, bounds.min_minutes), bounds.max_minutes)
    found = next_interval(current, gap, bounds, unchanged=unchanged)
    assert current / 2 - 1 <= found <= current * 2 + 1, "gradual"
    target = (current * 2 if unchanged else current) if gap is None else min(gap, bounds.max_minutes)
    if target > current:
        assert found >= current
    elif target < current:
        assert found <= current


@FAST
@given(st.integers(1, 10080), st.floats(1, 10080, allow_nan=False))
def test_a_steady_pace_is_reached_in_a_few_fetches_and_kept(start, gap):
    bounds = Bounds(1, 10080)
    interval = start
    for _ in range(30):  # 14 doublings at most, then the log distance halves each fetch
        interval = next_interval(interval, gap, bounds, unchanged=False)
    assert abs(interval - gap) <= 1.5
    assert abs(next_interval(interval, gap, bounds, unchanged=False) - interval) <= 1


@FAST
@given(st.floats(1, 10080, allow_nan=False), st.floats(0, 1, exclude_max=True))
def test_jitter_stays_within_a_tenth(interval, u):
    wait = jittered(interval, u).total_seconds() / 60
    assert interval * 0.9 - 1e-6 <= wait < interval * 1.1 + 1e-6  # timedelta keeps microseconds


def test_sources_added_together_spread_out():
    waits = {round(jittered(60, u / 10).total_seconds()) for u in range(10)}
    assert len(waits) == 10 and max(waits) - min(waits) >= 600  # 54 to 65 minutes


def every(gap_minutes: float, count: int, since: timedelta = timedelta(0)) -> list[datetime]:
    return [NOW - since - timedelta(minutes=gap_minutes * k) for k in range(count)]


def test_the_gap_of_a_feed_that_reaches_past_the_window_is_the_week_over_its_count():
    assert publishing_gap(every(120, 200), NOW) == pytest.approx(7 * 24 * 60 / 84)  # 84 in the week: 120 min


def test_the_gap_of_a_truncated_busy_feed_is_its_span_over_the_gaps():
    assert publishing_gap(every(30, 20), NOW) == pytest.approx(30)
    assert publishing_gap(every(30, 20, since=timedelta(hours=2)), NOW) == pytest.approx(30 + 120 / 19)


def test_no_dates_says_nothing_and_silence_says_the_maximum():
    assert publishing_gap([], NOW) is None
    assert publishing_gap([NOW - timedelta(minutes=5)], NOW) is None, "one item of a truncated feed"
    assert publishing_gap(every(60 * 24, 5, since=timedelta(days=8)), NOW) == math.inf
    assert publishing_gap([NOW + timedelta(days=1), NOW - timedelta(days=9)], NOW) == pytest.approx(7 * 24 * 60)


def test_the_worked_example_of_the_runbook():
    # A job board polled every 60 min, 15 to 1440; it published 42 items this week (its
    # feed of 50 reaches back 9 days): every 240 min. Then 60 -> 120 -> 170 -> 202 ...
    gap = publishing_gap(every(240, 50), NOW)
    assert gap == pytest.approx(240)
    steps, interval = [], 60
    for _ in range(5):
        interval = next_interval(interval, gap, Bounds(15, 1440), unchanged=False)
        steps.append(interval)
    assert steps == [120, 170, 202, 221, 231]
    # Its feed says <ttl>360</ttl>: not sooner than 6 hours, whatever the pace.
    assert next_interval(231, gap, Bounds(15, 1440, hint_minutes=360), unchanged=False) == 360
    # 30 sources on the host's group, 60 s apart: each can be fetched every 30 min at best.
    assert next_interval(20, 5, Bounds(15, 1440, group_floor_minutes=30), unchanged=False) == 30


# -- the publisher's hints ----------------------------------------------------------------------

SY = 'xmlns:sy="http://purl.org/rss/1.0/modules/syndication/"'
HINTED = {
    "rss2 ttl": ((f'<rss version="2.0" {SY}><channel><title>t</title><ttl> 45 </ttl>'
                 "<item><guid>a</guid><title>A</title></item></channel></rss>"), 45),
    "rss2 sy": ((f'<rss version="2.0" {SY}><channel><title>t</title><sy:updatePeriod>hourly</sy:updatePeriod>'
                "<sy:updateFrequency>2</sy:updateFrequency><item><guid>a</guid></item></channel></rss>"), 30),
    "rss2 both": ((f'<rss version="2.0" {SY}><channel><ttl>20</ttl><sy:updatePeriod>daily</sy:updatePeriod>'
                  "<item><guid>a</guid></item></channel></rss>"), 1440),
    "rss1 sy": (('<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://purl.org/rss/1.0/" '
                f'{SY}><channel rdf:about="x"><title>t</title><sy:updatePeriod>weekly</sy:updatePeriod>'
                '</channel><item rdf:about="y"><title>a</title><link>http://127.0.0.1/y</link></item></rdf:RDF>'), 10080),
    "atom sy": ((f'<feed xmlns="http://www.w3.org/2005/Atom" {SY}><title>t</title><sy:updatePeriod>hourly'
                "</sy:updatePeriod><entry><id>a</id><title>A</title></entry></feed>"), 60),
    "junk": ((f'<rss version="2.0" {SY}><channel><ttl>soon</ttl><sy:updatePeriod>often</sy:updatePeriod>'
             "<item><guid>a</guid></item></channel></rss>"), None),
    "none": ('<rss version="2.0"><channel><item><guid>a</guid></item></channel></rss>', None),
}


@pytest.mark.parametrize("name", list(HINTED))
def test_feed_hints_read_alike_on_both_parse_paths(name):
    text, expected = HINTED[name]
    body = f'<?xml version="1.0" encoding="utf-8"?>{text}'.encode()
    detected: dict = {}
    fast = quickfeed.parse(convert_to_utf8({}, body, detected), detected)
    assert fast is not None, "a plain feed takes the fast path"
    _, slow = _feedparser_entries(body, {}, "http://127.0.0.1/f")
    assert refresh_minutes(fast[1]) == refresh_minutes(slow) == expected
    assert read_feed(body, "http://127.0.0.1/f").refresh_minutes == expected


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Cache-Control": "public, max-age=600"}, 600),
        ({"Cache-Control": 'max-age="90", must-revalidate'}, 90),
        ({"Cache-Control": "no-cache, max-age=600"}, None),
        ({"Cache-Control": "no-store"}, None),
        ({"Cache-Control": "max-age=0"}, None),
        ({"Cache-Control": "s-maxage=600"}, None),
        ({"Expires": format_datetime(NOW + timedelta(hours=1), usegmt=True),
          "Date": format_datetime(NOW, usegmt=True)}, 3600),
        ({"Expires": "0"}, None),
        ({"Expires": format_datetime(NOW - timedelta(hours=1), usegmt=True)}, None),
        ({}, None),
    ],
)
def test_http_freshness(headers, seconds):
    assert fresh_for(httpx.Headers(headers), NOW) == seconds


# -- the decision -----------------------------------------------------------------------------------


def item(guid: str, published: datetime | None) -> Item:
    return Item(guid, f"http://127.0.0.1/{guid}", {"title": guid, "published_at": published.isoformat() if published else None})


def source(**values) -> dict:
    return {"id": 1, "url": "http://127.0.0.1/f", "source_type": "rss", "politeness_group": "127.0.0.1",
            "fetch_interval_minutes": 60, "config": {}, "adaptive_cadence": True,
            "min_interval_minutes": None, "max_interval_minutes": None, **values}


def test_an_adaptive_source_learns_its_interval_and_a_fixed_one_keeps_it():
    outcome = Outcome(items=[item(str(k), p) for k, p in enumerate(every(240, 50))])
    how = Cadence(15, 1440, u=0.5)
    learned = after_success(source(), outcome, finished=NOW, group_by="host", adaptive=how)
    assert learned.values()["fetch_interval_minutes"] == 120
    assert learned.next_fetch_at == NOW + timedelta(minutes=120)  # u = 0.5: no jitter
    assert after_success(source(), outcome, finished=NOW, group_by="host",
                         adaptive=Cadence(15, 1440, u=0.0)).next_fetch_at == NOW + timedelta(minutes=108)
    bounded = after_success(source(max_interval_minutes=50), outcome, finished=NOW, group_by="host", adaptive=how)
    assert bounded.values()["fetch_interval_minutes"] == 50  # under a max below it: at once
    fixed = after_success(source(adaptive_cadence=False), outcome, finished=NOW, group_by="host")
    assert "fetch_interval_minutes" not in fixed.values() and fixed.next_fetch_at == NOW + timedelta(minutes=60)
    not_modified = after_success(source(), Outcome(not_modified=True), finished=NOW, group_by="host", adaptive=how)
    assert not_modified.values()["fetch_interval_minutes"] == 85  # 60 x sqrt(2): nothing new, slower
    with pytest.raises(ValueError, match="needs a Cadence"):
        after_success(source(), outcome, finished=NOW, group_by="host")


# -- the collector ----------------------------------------------------------------------------------


def dated_feed(gap_minutes: float, count: int, extra: str = "") -> bytes:
    at = datetime.now(UTC)
    entries = "".join(
        f"<item><guid>g{k}</guid><title>Item {k}</title><link>http://127.0.0.1/{k}</link>"
        f"<pubDate>{format_datetime(at - timedelta(minutes=gap_minutes * k), usegmt=True)}</pubDate></item>"
        for k in range(count)
    )
    return f"<?xml version='1.0'?><rss version='2.0'><channel><title>t</title>{extra}{entries}</channel></rss>".encode()


@conformance
def test_the_collector_learns_each_adaptive_sources_interval_within_its_limits(engine, receiver):
    server = receiver
    server.routes["/busy"] = lambda h: h.reply(200, dated_feed(240, 50), {"Content-Type": "application/rss+xml"})
    server.routes["/ttl"] = lambda h: h.reply(200, dated_feed(240, 50, "<ttl>600</ttl>"),
                                              {"Content-Type": "application/rss+xml"})
    server.routes["/cached"] = lambda h: h.reply(200, dated_feed(5, 20), {"Content-Type": "application/rss+xml",
                                                                          "Cache-Control": "max-age=5400"})
    server.routes["/spaced"] = lambda h: h.reply(200, dated_feed(5, 20), {"Content-Type": "application/rss+xml"})
    server.routes["/fixed"] = lambda h: h.reply(200, dated_feed(240, 50), {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        ids = {
            "busy": add_source(conn, server.url("/busy"), adaptive_cadence=True),
            "ttl": add_source(conn, server.url("/ttl"), adaptive_cadence=True),
            "cached": add_source(conn, server.url("/cached"), adaptive_cadence=True, fetch_interval_minutes=120),
            "spaced": add_source(conn, server.url("/spaced"), adaptive_cadence=True, min_interval_minutes=1,
                                 politeness_group="spaced", fetch_interval_minutes=10),
            "fixed": add_source(conn, server.url("/fixed")),
        }
        # The "spaced" group: one request every 2 minutes, shared by it and 9 others
        # never due: each of the 10 can be fetched every 20 minutes at best.
        set_limits(conn, "spaced", min_interval_seconds=120)
        for k in range(9):
            add_source(conn, f"http://127.0.0.1:9/never{k}", politeness_group="spaced",
                       next_fetch_at=now() + timedelta(days=30))
    started = datetime.now(UTC)
    assert collector(engine).run().succeeded == 5
    found = {r["id"]: r for r in rows(engine, schema.sources)}
    interval = {name: found[i]["fetch_interval_minutes"] for name, i in ids.items()}
    assert interval == {
        "busy": 120,  # sqrt(60 x 240): halfway to its 4-hour pace
        "ttl": 600,  # the feed's <ttl> is a floor
        "cached": 90,  # a 5-minute pace, but Cache-Control says 90 minutes
        "spaced": 20,  # a 5-minute pace, min 1, but its group serves each source every 20 minutes
        "fixed": 60,
    }
    for name, i in ids.items():  # random_unit 0.5: the next fetch is one interval on
        due = found[i]["next_fetch_at"]
        assert started + timedelta(minutes=interval[name]) <= due <= datetime.now(UTC) + timedelta(minutes=interval[name])


# -- the command line -------------------------------------------------------------------------------


def test_cadence_on_add_import_set_and_list(engine, db_url, tmp_path):
    env = {"DATABASE_URL": db_url}
    adaptive = run("sources", "add", "http://127.0.0.1/a", "--adaptive", "--min-interval", "10",
                   "--max-interval", "600", env=env).stdout.strip()
    fixed = run("sources", "add", "http://127.0.0.1/b", env=env).stdout.strip()
    default_on = run("sources", "add", "http://127.0.0.1/c", env={**env, "PIPELINE_ADAPTIVE_CADENCE": "on"}).stdout.strip()
    (tmp_path / "s.yaml").write_text(
        "- {url: 'http://127.0.0.1/d', adaptive: true, max_interval: 120}\n- {url: 'http://127.0.0.1/e'}\n")
    assert run("sources", "import", str(tmp_path / "s.yaml"), env=env).returncode == 0
    by_url = {r["url"]: r for r in sources_rows(engine)}
    cadences = {url.rsplit("/", 1)[1]: (r["adaptive_cadence"], r["min_interval_minutes"], r["max_interval_minutes"])
                for url, r in by_url.items()}
    assert cadences == {"a": (True, 10, 600), "b": (False, None, None), "c": (True, None, None),
                        "d": (True, None, 120), "e": (False, None, None)}
    listed = run("sources", "list", env=env).stdout
    assert f"{adaptive}  rss     every 60 min (adaptive, 10 to 600)," in listed
    assert f"{default_on}  rss     every 60 min (adaptive, default to default)," in listed
    assert json.loads(run("sources", "list", "--json", env=env).stdout)[0]["adaptive_cadence"] is True
    assert run("sources", "set", fixed, "--adaptive", "--max-interval", "300", env=env).returncode == 0
    assert run("sources", "set", adaptive, "--fixed", env=env).returncode == 0
    by_id = {str(r["id"]): r for r in sources_rows(engine)}
    assert (by_id[fixed]["adaptive_cadence"], by_id[fixed]["max_interval_minutes"]) == (True, 300)
    assert (by_id[adaptive]["adaptive_cadence"], by_id[adaptive]["min_interval_minutes"]) == (False, None)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--adaptive", "--min-interval", "600", "--max-interval", "60"), "min interval 600 is more than max interval 60"),
        (("--min-interval", "10"), "a min or max interval bounds an adaptive cadence: this source's is fixed"),
        (("--adaptive", "--max-interval", "20000"), "max interval 20000 is out of bounds: it must be 1 to 10080"),
    ],
)
def test_bad_cadences_are_refused_in_one_line(engine, db_url, args, fragment):
    assert_one_line_error(run("sources", "add", "http://127.0.0.1/a", *args, env={"DATABASE_URL": db_url}), fragment)
    assert sources_rows(engine) == []


def test_set_checks_new_bounds_against_those_kept(engine, db_url):
    env = {"DATABASE_URL": db_url}
    source_id = run("sources", "add", "http://127.0.0.1/a", "--adaptive", "--max-interval", "60", env=env).stdout.strip()
    assert_one_line_error(run("sources", "set", source_id, "--min-interval", "90", env=env),
                          "min interval 90 is more than max interval 60")


def test_bad_adaptive_settings_are_refused(db_url):
    result = run("sources", "list", env={"DATABASE_URL": db_url, "PIPELINE_ADAPTIVE_MIN_MINUTES": "500",
                                         "PIPELINE_ADAPTIVE_MAX_MINUTES": "100"})
    assert_one_line_error(result, "PIPELINE_ADAPTIVE_MIN_MINUTES=500 and PIPELINE_ADAPTIVE_MAX_MINUTES=100")
    assert_one_line_error(run("sources", "list", env={"DATABASE_URL": db_url, "PIPELINE_ADAPTIVE_CADENCE": "maybe"}),
                          "PIPELINE_ADAPTIVE_CADENCE='maybe'")
