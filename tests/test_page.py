"""The http (HTML page) adapter: CSS selectors, or one item per distinct page text."""

from __future__ import annotations

import tracemalloc

import pytest
import sqlalchemy as sa

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.fetching.page import MAX_ELEMENTS, PageAdapter, parse_page
from pipeline.storage import schema
from tests.helpers import add_source
from tests.http_server import LocalServer
from tests.test_collector import collector, rows

PAGE = b"""<html><head><title>Jobs board</title><style>.x{}</style></head><body>
<script>var tracking = 1;</script>
<ul>
  <li class="job"><a href="/jobs/1"><h2>Data engineer</h2></a><p class="blurb">Postgres and Dagster</p></li>
  <li class="job"><a href="https://127.0.0.1/jobs/2"><h2>SRE</h2></a><p class="blurb">On call, <b>kind</b> team</p></li>
</ul></body></html>"""
URL = "http://127.0.0.1/board"


def test_selectors_give_one_item_per_element():
    items = parse_page(PAGE, URL, {"item": "li.job", "title": "h2", "summary": ".blurb"})
    assert [i.source_item_id for i in items] == ["http://127.0.0.1/jobs/1", "https://127.0.0.1/jobs/2"]
    first = items[0].raw
    assert (first["title"], first["url"], first["summary"]) == (
        "Data engineer", "http://127.0.0.1/jobs/1", "Postgres and Dagster",
    )
    assert items[1].raw["summary"] == "On call, kind team"


def test_a_price_selector_gives_each_item_its_price_and_a_new_price_is_the_same_item():
    def page(price: str) -> bytes:
        return (f'<ul><li class="offer"><h2>Road bike</h2><span class="price"> {price} </span></li>'
                f'<li class="offer"><h2>Helmet</h2></li></ul>').encode()
    config = {"item": "li.offer", "title": "h2", "price": ".price"}
    bike, helmet = parse_page(page("&euro;1,299.00"), URL, config)
    assert (bike.raw["title"], bike.raw["price"]) == ("Road bike", "€1,299.00")
    assert "price" not in helmet.raw, "an item without the element has no price"
    [cheaper, _] = parse_page(page("€1,199.00"), URL, config)
    assert cheaper.raw["price"] == "€1,199.00"
    # No link: the item is its text less its price, so a new price is the same item.
    assert cheaper.source_item_id == bike.source_item_id
    PageAdapter().check_config(config)
    with pytest.raises(ValueError, match="set 'item' too"):
        PageAdapter().check_config({"price": ".price"})


def test_without_selectors_the_page_is_a_change_detector():
    [item] = parse_page(PAGE, URL, {})
    assert item.source_item_id.startswith("sha256:") and item.raw["title"] == "Jobs board"
    assert "tracking" not in item.raw["summary"], "scripts are not page text"
    [same] = parse_page(PAGE.replace(b"<ul>", b"<ul>  "), URL, {})
    assert same.source_item_id == item.source_item_id, "white space is not a change"
    [changed] = parse_page(PAGE.replace(b"SRE", b"SRE (remote)"), URL, {})
    assert changed.source_item_id != item.source_item_id


@pytest.mark.parametrize(
    ("config", "reason", "message"),
    [
        ({"item": "li[class="}, FailureReason.INVALID_CONFIG, "bad CSS selector"),
        ({"item": "article.post"}, FailureReason.PARSE_ERROR, "matched nothing"),
    ],
)
def test_bad_or_stale_selectors_are_reported(config, reason, message):
    with pytest.raises(FetchError) as error:
        parse_page(PAGE, URL, config)
    assert error.value.reason is reason and message in str(error.value)


def test_an_empty_page_is_a_parse_error():
    with pytest.raises(FetchError, match="no text"):
        parse_page(b"<html><body>   </body></html>", URL, {})


def test_a_changed_page_yields_a_new_item_through_the_collector(engine):
    server = LocalServer().start()
    try:
        body = [PAGE]
        server.routes["/board"] = lambda h: h.reply(200, body[0], {"Content-Type": "text/html"})
        with engine.begin() as conn:
            add_source(conn, server.url("/board"), source_type="http")
        assert collector(engine).run().items_new == 1
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
        assert collector(engine).run().items_new == 0, "unchanged page, nothing new"
        body[0] = PAGE.replace(b"SRE", b"Platform engineer")
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
        assert collector(engine).run().items_new == 1
        assert len(rows(engine, schema.listings_raw)) == 2
    finally:
        server.stop()


def parsing_peak(body: bytes, config: dict) -> tuple[object, int]:
    tracemalloc.start()
    try:
        try:
            outcome: object = parse_page(body, "http://127.0.0.1/p", config)
        except FetchError as exc:
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("config", [{}, {"item": "i"}])
def test_a_page_of_too_many_elements_is_refused_before_it_is_parsed(config):
    # 600 KB, well under the byte cap: parsed, it once took about 80 MiB (a 6 MB page
    # like it, 816 MiB and 19 s).
    body = b"<html><body>" + b"<i>x</i>" * (MAX_ELEMENTS + 10_000) + b"</body></html>"
    outcome, peak = parsing_peak(body, config)
    assert isinstance(outcome, FetchError) and outcome.reason is FailureReason.TOO_LARGE, outcome
    assert f"more than {MAX_ELEMENTS:,} elements" in outcome.message
    assert peak < 4 * 1024 * 1024, f"{peak / 2**20:.0f} MiB to refuse it"


def test_a_large_page_within_the_element_budget_is_parsed():
    body = b"<html><body>" + b"<p>word</p>" * (MAX_ELEMENTS - 10) + b"</body></html>"
    [item] = parse_page(body, "http://127.0.0.1/p", {})
    assert item.raw["summary"].startswith("word word")


CHALLENGES = [
    # Cloudflare's interstitial, by its title and by its platform's script
    b"<html><head><title>Just a moment...</title></head><body><li class='job'>Checking your browser</li></body></html>",
    b"<html><head><title>Jobs</title><script src='/cdn-cgi/challenge-platform/h/g/orchestrate/jsch/v1'></script>"
    b"</head><body><ul><li class='job'><a href='/j/1'>One</a></li></ul></body></html>",
    # A captcha whose selectors match its own element ("Please verify you are human")
    b"<html><head><title>Are you a robot?</title></head><body><li class='job'>Please verify you are human"
    b"</li></body></html>",
    b"<html><head><title>Robot Check</title></head><body><form><li class='job'>Type the characters</li></form></body>",
    b"<html><head><title>x</title><script src='https://ct.captcha-delivery.com/c.js'></script></head><body>"
    b"<li class='job'>blocked</li></body></html>",
]


@pytest.mark.parametrize("body", CHALLENGES)
def test_a_bot_challenge_is_a_block_not_a_page(body):
    """Stored as listings, a challenge page's elements would be items, and the watched
    listings missing from it once; it is a failed fetch of its own code instead."""
    for config in ({"item": "li.job", "title": "a"}, {}):
        with pytest.raises(FetchError) as error:
            parse_page(body, URL, config)
        assert error.value.reason is FailureReason.BLOCKED and "bot challenge" in str(error.value)


def test_a_page_with_a_captcha_on_its_contact_form_is_a_page():
    body = PAGE.replace(b"</ul>", b"</ul><form><div class='g-recaptcha' data-sitekey='x'></div></form>"
                        b"<script src='https://www.google.com/recaptcha/api.js'></script>")
    assert len(parse_page(body, URL, {"item": "li.job", "title": "h2"})) == 2


def test_a_blocked_source_backs_off_as_a_transient_failure_and_stores_nothing(engine):
    server = LocalServer().start()
    server.routes["/board"] = lambda h: h.reply(200, CHALLENGES[0], {"Content-Type": "text/html"})
    try:
        with engine.begin() as conn:
            source_id = add_source(conn, server.url("/board"), source_type="http", config={"item": "li.job"})
        stats = collector(engine).run()
        assert stats.failed == {"blocked": 1}
        with engine.connect() as conn:
            source = conn.execute(sa.select(schema.sources).where(schema.sources.c.id == source_id)).mappings().one()
        assert (source["last_failure_reason"], source["enabled"], source["consecutive_failures"]) == ("blocked", True, 1)
        assert rows(engine, schema.listings_raw) == []
    finally:
        server.stop()


@pytest.mark.parametrize("body", CHALLENGES)
def test_a_feed_answered_by_a_bot_challenge_is_blocked_not_broken(body):
    """A feed behind a challenge was a parse_error, a permanent code: a few of them
    disabled the source. It is blocked, transient; other HTML is still no feed."""
    from pipeline.fetching import rss

    with pytest.raises(FetchError) as error:
        rss.parse_feed(body, URL, "text/html")
    assert error.value.reason is FailureReason.BLOCKED and "not the feed" in str(error.value)
    with pytest.raises(FetchError) as error:
        rss.parse_feed(PAGE, URL, "text/html")
    assert error.value.reason is FailureReason.PARSE_ERROR


def _jobs(count: int, *, closed: bool = True) -> str:
    """``count`` job items, each closed, or each left open (nested, as unclosed tags nest)."""
    end = "</div>" if closed else ""
    return "".join(f'<div class="job"><a href="/j/{i}">job {i}</a><p>text {i}</p>{end}' for i in range(count)) + (
        "" if closed else "</div>" * count)


@pytest.mark.parametrize("script", [
    "[" * 100_000,  # past the interpreter's stack: json raised RecursionError, and the page failed
    '{"a": ' * 900 + "1" + "}" * 900,  # readable, but deeper than any page's real data
    "[" * 100_000 + ",,",  # neither: read leniently, and refused the same way
], ids=["100000 brackets", "900 nested objects", "100000 brackets, not JSON"])
def test_structured_data_nested_past_reason_is_dropped_and_the_items_stay(script):
    """One hostile JSON-LD script took the whole page with it (0 of 3 items stored)."""
    body = f'<html><body><script type="application/ld+json">{script}</script>{_jobs(3)}</body></html>'.encode()
    items = parse_page(body, URL, {"item": "div.job", "title": "a", "summary": "p"})
    assert [i.raw["title"] for i in items] == ["job 0", "job 1", "job 2"]


def test_a_page_nested_past_reason_is_refused_at_once_naming_why():
    """8,000 nested items (0.5 MB) kept a pass busy 72 s: the CSS matcher reads every
    item's ancestors. Refused in a walk of the page, as a page of too many elements is."""
    body = f"<html><body>{_jobs(8000, closed=False)}</body></html>".encode()
    with pytest.raises(FetchError) as raised:
        parse_page(body, URL, {"item": "div.job", "title": "a"})
    assert raised.value.reason == FailureReason.TOO_LARGE
    assert "nests elements more than 256 deep" in str(raised.value)


def test_items_nested_by_unclosed_tags_each_read_their_own_text():
    """A sloppy page's unclosed item elements nest: each item's text was its own and
    every later item's, so its summary (and a link-less item's identity) changed with
    each new item below it."""
    body = f"<html><body>{_jobs(5, closed=False)}</body></html>".encode()
    items = parse_page(body, URL, {"item": "div.job"})
    assert [i.raw["summary"] for i in items] == [f"job {i} text {i}" for i in range(5)]
    assert [i.raw["title"] for i in items] == [f"job {i} text {i}" for i in range(5)]
