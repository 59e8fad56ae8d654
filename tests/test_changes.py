"""Change alerts (pipeline/storage/watches.py): a user whose filter watches for changes
hears once per change when a listing it notified them of changes its title or summary,
or goes from its source; a feed's window moving on is not a listing gone."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.notify import delivery
from pipeline.storage import schema
from tests import test_duplicates
from tests.conftest import conformance
from tests.helpers import add_source, now
from tests.http_server import LocalServer
from tests.test_collector import collector
from tests.test_notifier import add_user, notifier, posts
from tests.test_processor import add_raw, processor

site = test_duplicates.site  # a fixture: a webhook receiver


def told(site: LocalServer) -> list[tuple[str, str, str]]:
    """(user, event, title) of every item of every webhook delivery, in order (a digest's
    items each)."""
    bodies = [json.loads(p["body"]) for p in posts(site)]
    return [(b["user"]["name"], item["event"], item["listing"]["title"])
            for b in bodies for item in (b["items"] if "items" in b else [b])]


def release_held(engine: sa.Engine) -> None:
    """The end of every held notification's wait (a window, quiet hours): now."""
    with engine.begin() as conn:
        conn.execute(sa.update(schema.notifications).where(schema.notifications.c.status == "held")
                     .values(next_attempt_at=now() - timedelta(seconds=1)))


def one_pass(engine: sa.Engine, *, fetched: int = 1) -> None:
    """Every source due now; collect (``fetched`` of them succeed), process, notify."""
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    assert collector(engine).run().succeeded == fetched
    processor(engine).run()
    notifier(engine).run()


@conformance
def test_a_change_of_a_watched_listing_is_told_once(engine, site):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/jobs.rss")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python", changes=True)
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "bob", "python")  # no --changes
        add_raw(conn, source, "job-1", title="Python developer", summary="Salary 60k")
    processor(engine).run()
    assert notifier(engine).run().sent == 2

    def store(**content) -> None:
        with engine.begin() as conn:
            add_raw(conn, source, "job-1", **content)
        processor(engine).run()

    store(title="Python developer", summary="Salary 70k")  # changed
    store(title="Python developer", summary="Salary 70k", published_at="2026-11-25T10:00:00Z")  # a date only
    stats = notifier(engine).run()
    assert (stats.notifications_created, stats.sent) == (1, 1)
    store(title="Python developer (filled)", summary="Salary 70k")  # changed again, no longer matching bob
    again = notifier(engine).run()
    assert (again.notifications_created, again.batched, again.sent) == (1, 1, 0), "within the window: held"
    release_held(engine)
    assert notifier(engine).run().sent == 1, "at the window's end"
    store(title="Python developer", summary="Salary 70k")  # back to a version told before
    assert notifier(engine).run().notifications_created == 0
    assert sorted(told(site)) == [
        ("alice", "changed", "Python developer"), ("alice", "changed", "Python developer (filled)"),
        ("alice", "new", "Python developer"), ("bob", "new", "Python developer"),
    ]
    assert notifier(engine).run().notifications_created == 0, "nothing twice"
    with engine.connect() as conn:
        events = conn.execute(sa.select(schema.notifications.c.event).order_by(schema.notifications.c.id)).scalars()
        assert [e.split(":")[0] for e in events] == ["new", "new", "changed", "changed"]


def test_a_watching_filter_watches_though_an_older_filter_of_its_user_matches_too(engine, site):
    """A user hears once of a listing however many of their filters match it; when one
    of them watches for changes, that one is the match, or the change went untold."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/jobs.rss")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python")  # older, not watching
        users.add_filter(conn, "alice", '"python developer"', changes=True)
        add_raw(conn, source, "job-1", title="Python developer", summary="Salary 60k")
    processor(engine).run()
    assert notifier(engine).run().sent == 1
    with engine.begin() as conn:
        add_raw(conn, source, "job-1", title="Python developer", summary="Salary 70k")
    processor(engine).run()
    assert notifier(engine).run().sent == 1
    assert told(site) == [("alice", "new", "Python developer"), ("alice", "changed", "Python developer")]
    assert [json.loads(p["body"])["filter"]["query"] for p in posts(site)] == ['"python developer"'] * 2


PAGE = """<html><body><ul>{}</ul></body></html>"""


def _page(*jobs: str) -> bytes:
    return PAGE.format("".join(f'<li class="job"><h2>{j}</h2><a href="/jobs/{j}">more</a></li>' for j in jobs)).encode()


@conformance
def test_a_watched_listing_gone_from_a_page_is_told_once_and_its_return_is_quiet(backend, engine, site):
    body = [_page("Python developer", "Python lead")]
    site.routes["/board"] = lambda h: h.reply(200, body[0], {"Content-Type": "text/html"})
    with engine.begin() as conn:
        add_source(conn, site.url("/board"), source_type="http",
                   config={"item": "li.job", "title": "h2", "link": "a"})
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python", changes=True)

    def step(page: bytes, fetched: bool = True) -> None:
        body[0] = page
        one_pass(engine, fetched=int(fetched))

    step(body[0])
    step(_page("Python lead"))  # the developer job is not there: once is not gone
    step(_page("Python lead"))  # twice in a row: gone, told
    step(_page("Python lead"))  # still gone: not told again
    step(_page("Python developer", "Python lead"))  # back: quiet
    step(_page(), fetched=False)  # a page with no items fails its fetch (parse_error): nothing told
    assert sorted(told(site)) == [("alice", "gone", "Python developer"), ("alice", "new", "Python developer"),
                                  ("alice", "new", "Python lead")]
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.listings.c.gone_at)).scalars().all() == [None, None]


def test_a_new_price_on_a_page_is_a_change_told_once_with_the_price(backend, engine, site):
    """A page source's ``price`` selector: a watched listing whose price moves is told as
    changed, with its price, once per price; a page that shows no prices tells nothing."""
    prices = ["€1,299"]
    site.routes["/shop"] = lambda h: h.reply(200, (
        '<ul><li class="offer"><h2>Python course</h2><a href="/c/1">more</a>'
        f'<span class="price">{prices[0]}</span></li></ul>').encode(), {"Content-Type": "text/html"})
    with engine.begin() as conn:
        add_source(conn, site.url("/shop"), source_type="http",
                   config={"item": "li.offer", "title": "h2", "link": "a", "summary": "h2", "price": ".price"})
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python", changes=True)
        users.add_user(conn, "carol", apprise_url=f"json://127.0.0.1:{site.port}/apprise")
        users.add_filter(conn, "carol", "python", changes=True)
    site.routes["/apprise"] = lambda h: h.reply(204)

    for price in ("€1,299", "€1,199", "€1,199", "€1,299"):  # told: new, then the 1,199; back to 1,299 is quiet
        prices[0] = price
        one_pass(engine)
    bodies = [json.loads(p["body"]) for p in posts(site) if p["path"] == "/hook"]
    assert [(b["event"], b["listing"]["price"]) for b in bodies] == [("new", "€1,299"), ("changed", "€1,199")]
    texts = [json.loads(p["body"]) for p in posts(site) if p["path"] == "/apprise"]
    assert [(t["title"], "Price: €1,199" in t["message"]) for t in texts] == [
        ("Python course", False), ("Changed: Python course", True)]
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.listings.c.price)).scalars().all() == ["€1,299"]



def test_a_listing_in_one_line_says_its_event_and_its_price_when_it_has_one() -> None:
    """A digest's line and the demo receiver's title: one rule (delivery.headline)."""
    assert delivery.headline("changed", {"title": "Python course", "price": "€1,199"}) == "Changed: Python course (€1,199)"
    assert delivery.headline("new", {"title": "Python course", "price": None}) == "Python course"
    assert delivery.headline("gone", {"title": None}) == "Gone: New listing"


def _feed(*letters: str) -> bytes:
    """An RSS feed of items a, b, c, ... published on the 1st, 2nd, 3rd ..., newest first."""
    items = "".join(
        f"<item><guid>{x}</guid><title>Python {x.upper()}</title><link>http://127.0.0.1/{x}</link>"
        f"<pubDate>{ord(x) - 96:02d} Nov 2026 10:00:00 GMT</pubDate></item>"
        for x in letters
    )
    return f"<?xml version='1.0'?><rss version='2.0'><channel><title>t</title>{items}</channel></rss>".encode()


def test_a_feed_moving_on_is_not_a_listing_gone_but_one_taken_out_is(engine, site):
    body = [_feed("c", "b", "a")]
    site.routes["/feed"] = lambda h: h.reply(200, body[0], {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        add_source(conn, site.url("/feed"))
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python", changes=True)

    def step(feed: bytes) -> None:
        body[0] = feed
        one_pass(engine)

    step(_feed("c", "b", "a"))
    step(_feed("d", "c", "b"))  # A fell off the end
    step(_feed("d", "b"))  # C was taken out: B, older, is still there (once: not yet gone)
    step(_feed("d", "b"))  # twice in a row: gone
    assert sorted((e, t) for _, e, t in told(site)) == [
        ("gone", "Python C"), ("new", "Python A"), ("new", "Python B"), ("new", "Python C"), ("new", "Python D"),
    ]


def test_filters_add_changes_on_the_command_line(engine, db_url):
    from tests.test_cli import run

    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 20)
    env = {"DATABASE_URL": db_url}
    added = run("filters", "add", "alice", "--query", "python", "--changes", env=env)
    assert added.returncode == 0, added.stderr
    assert "python (and its changes)" in run("filters", "list", env=env).stdout


def test_past_a_users_alert_limit_the_rest_go_out_as_one_summary_and_nothing_is_dropped(engine, site):
    """The reproduction: one fetch of 1,000 matching items sent 1,000 webhooks in 10.5 s.
    Here 30 in one batch with a limit of 20 a window: 20 one by one, the other 10 in one
    summary at the window's end; another user's alerts are their own."""
    from pipeline.storage.status import collect_status, status_as_text

    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/jobs.rss")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python")
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "bob", "rust")
        for i in range(30):
            add_raw(conn, source, f"job-{i}", title=f"Python developer {i}")
        add_raw(conn, source, "rust-1", title="Rust developer")
    processor(engine).run()
    first = notifier(engine).run()
    assert (first.notifications_created, first.batched, first.sent) == (31, 10, 21)
    assert sorted(told(site))[-1] == ("bob", "new", "Rust developer")
    status = collect_status(engine)
    assert status.notifications["held"] == 10 and status.batched == 10
    assert "(10 held past users' alert limits so far)" in status_as_text(status)
    release_held(engine)
    summary = notifier(engine).run()
    assert (summary.digests_sent, summary.sent) == (1, 10), "one summary delivery of the ten"
    alice = [title for user, _, title in told(site) if user == "alice"]
    assert sorted(alice) == sorted(f"Python developer {i}" for i in range(30)), "none dropped, none twice"
    assert len(posts(site)) == 22


def test_a_listing_changing_on_every_fetch_is_told_once_a_window_with_its_latest_value(engine, site):
    """The reproduction: a 41-item page watched with --changes, its prices rising on each
    of 6 fetches, sent 201 changed alerts. Here one listing changes five times within a
    window: told once at once, then once at the window's end, with its last value."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/shop")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "lamp", changes=True)
        add_raw(conn, source, "lamp", title="Desk lamp", summary="EUR 10")
    processor(engine).run()
    notifier(engine).run()
    for price in (11, 12, 13, 14, 15):
        with engine.begin() as conn:
            add_raw(conn, source, "lamp", title="Desk lamp", summary=f"EUR {price}")
        processor(engine).run()
        notifier(engine).run()
    assert [event for _, event, _ in told(site)] == ["new", "changed"]
    release_held(engine)
    notifier(engine).run()
    bodies = [json.loads(p["body"]) for p in posts(site)]
    assert len(bodies) == 3, "one more, at the window's end"
    last = bodies[-1]["items"][0] if "items" in bodies[-1] else bodies[-1]
    assert (last["event"], last["listing"]["summary"]) == ("changed", "EUR 15"), "carrying the latest value"


def test_a_change_alert_waiting_for_a_digest_is_not_doubled_by_a_later_change(engine, site):
    """One still waiting (for its user's daily digest, however long ago it was made)
    carries the later change: read when it is sent, it says the latest."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/shop")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "lamp", changes=True)
        add_raw(conn, source, "lamp", title="Desk lamp", summary="EUR 10")
    processor(engine).run()
    notifier(engine).run()
    with engine.begin() as conn:
        users.set_delivery(conn, "alice", digest="daily")
        add_raw(conn, source, "lamp", title="Desk lamp", summary="EUR 11")
    processor(engine).run()
    assert notifier(engine).run().notifications_created == 1
    n = schema.notifications
    with engine.begin() as conn:  # made long before this window
        conn.execute(sa.update(n).values(created_at=now() - timedelta(hours=5)))
        add_raw(conn, source, "lamp", title="Desk lamp", summary="EUR 12")
    processor(engine).run()
    assert notifier(engine).run().notifications_created == 0


def _shop(site: LocalServer, offers: list[str]) -> None:
    """A shop page of one offer (``offers[0]``: its HTML inside the list) and a source of it."""
    site.routes["/shop"] = lambda h: h.reply(200, f"<ul>{offers[0]}</ul>".encode(), {"Content-Type": "text/html"})


def _offer(price: str | None, title: str = "Python course", link: str = "/c/1") -> str:
    shown = f'<span class="price">{price}</span>' if price is not None else ""
    return f'<li class="offer"><h2>{title}</h2><a href="{link}">more</a>{shown}</li>'


def _watching(engine, site, **condition) -> None:
    with engine.begin() as conn:
        add_source(conn, site.url("/shop"), source_type="http",
                   config={"item": "li.offer", "title": "h2", "link": "a", "price": ".price"})
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python", changes=True, **condition)


@conformance("postgresql", "sqlite")
def test_a_captcha_page_a_500_and_an_empty_selector_result_tell_nothing(backend, engine, site):
    """An odd answer between two good ones: a captcha page whose selectors match its own
    element (the offer is missed once, so not gone), a 500 (a failed fetch), a page
    whose selectors match nothing (parse_error), a page served without its prices (the
    price selector found nothing: partial content, no change). Then the offer goes for
    real, two good fetches in a row, and that is told."""
    offers = [_offer("€1,299")]
    _shop(site, offers)
    _watching(engine, site)
    one_pass(engine)
    for odd, fetched in ((_offer(None, "Please verify you are human", "/captcha"), 1), ("", 0), (_offer("€1,299"), 1),
                         (_offer(None), 1), (_offer("€1,299"), 1)):
        if odd == "":
            site.routes["/shop"] = lambda h: h.reply(500, b"down")
            one_pass(engine, fetched=0)
            _shop(site, offers)
            continue
        offers[0] = odd
        one_pass(engine, fetched=fetched)
    offers[0] = "<li>nothing that matches</li>"
    one_pass(engine, fetched=0)
    assert [(e, t) for _, e, t in told(site)] == [("new", "Python course")]
    offers[0] = _offer("€99", "Another course", "/c/2")
    one_pass(engine)
    one_pass(engine)
    assert [(e, t) for _, e, t in told(site)][-1] == ("gone", "Python course")


@conformance("postgresql", "sqlite")
def test_price_conditions_tell_the_drops_asked_for_and_nothing_else(backend, engine, site):
    """--price-drop 10: each price at least 10% below the last one told; --price-below
    900: each price below 900 and below the last told. A new summary, a rise, a price
    in another currency and an unreadable price tell nothing; gone is told."""
    offers = [_offer("€1,000")]
    _shop(site, offers)
    _watching(engine, site, price_drop=10)
    with engine.begin() as conn:
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "bob", "python", price_below=900)
    one_pass(engine)
    steps = ["€950", "€880", "€850", "€870", "€700", "$600", "call us", "€690 <b>", "€1,200"]
    for price in steps:
        offers[0] = _offer(price)
        one_pass(engine)
    bodies = [json.loads(x["body"]) for x in posts(site)]
    heard = {user: [(b["event"], b["listing"]["price"]) for b in bodies if b["user"]["name"] == user]
             for user in ("alice", "bob")}
    assert heard == {
        "alice": [("new", "€1,000"), ("changed", "€880"), ("changed", "€700")],  # -12%, then -20.5% from 880
        "bob": [("new", "€1,000"), ("changed", "€880"), ("changed", "€850"), ("changed", "€700"),
                ("changed", "€690")],  # each step down below 900 (markup around a price is not its value)
    }
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.watches.c.price).order_by(schema.watches.c.user_id)).scalars().all() == [
            "€700", "€690"]
    for _ in range(2):
        offers[0] = _offer("€5", "Rust course", "/c/2")
        one_pass(engine)
    assert sorted(e for _, e, t in told(site) if t == "Python course")[:2] == ["changed", "changed"]
    assert {(u, e) for u, e, t in told(site)[-2:]} == {("alice", "gone"), ("bob", "gone")}, "the last told"


def test_price_conditions_on_the_command_line(engine, db_url):
    from tests.test_cli import assert_one_line_error, run

    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret="s" * 20)
    env = {"DATABASE_URL": db_url}
    added = run("filters", "add", "alice", "--query", "flat", "--price-drop", "10", "--price-below", "1500", env=env)
    assert added.returncode == 0, added.stderr
    assert "flat (and its price changes: a drop of 10% or below 1500)" in run("filters", "list", env=env).stdout
    for wrong, said in ((["--price-drop", "0"], "--price-drop 0 must be a percent"),
                        (["--price-drop", "100"], "must be a percent"), (["--price-below", "-5"], "positive amount"),
                        (["--price-below", "nan"], "positive amount"), (["--price-drop", "inf"], "percent")):
        assert_one_line_error(run("filters", "add", "alice", "--query", "x", *wrong, env=env), said)


def test_a_price_condition_in_a_filter_matches_new_listings_and_the_workbench(engine, site):
    """``price:<1000`` in a filter: the notifier (the claim's rows carry the price) and
    `filters test` (it reads the price with the text) decide alike."""
    from pipeline.catalogue import workbench

    offers = [_offer("€1,299") + _offer("€99", "Python intro", "/c/2") + _offer(None, "Python free", "/c/3")]
    _shop(site, offers)
    with engine.begin() as conn:
        add_source(conn, site.url("/shop"), source_type="http",
                   config={"item": "li.offer", "title": "h2", "link": "a", "price": ".price"})
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "python price:<1000 currency:EUR")
    one_pass(engine)
    assert told(site) == [("alice", "new", "Python intro")]
    trial = workbench.try_filter(engine, "alice", "python price:<1000")
    assert [(h.title, h.reasons[-1]) for h in trial.hits] == [("Python intro", "price €99")]


def test_a_shopping_feed_s_prices_are_read_and_price_conditions_apply_to_them(engine, site):
    """A feed in Google's product namespace (g:price, g:sale_price): each item's price is
    stored as the feed writes it, a filter's price: condition reads it, and a watching
    filter's --price-drop tells the sale."""
    def feed(*items: tuple[str, str, str]) -> bytes:
        body = "".join(f"<item><guid>{i}</guid><title>{t}</title><link>http://127.0.0.1/{i}</link>{p}</item>"
                       for i, t, p in items)
        return (b'<?xml version="1.0"?><rss version="2.0" xmlns:g="http://base.google.com/ns/1.0"><channel>'
                b"<title>Flats</title><link>http://127.0.0.1/</link>" + body.encode() + b"</channel></rss>")

    body = [feed(("a", "Flat in Berlin", "<g:price>1450.00 EUR</g:price>"),
                 ("b", "Loft in Berlin", "<g:price>2900.00 EUR</g:price>"), ("c", "Room in Berlin", ""))]
    site.routes["/flats.rss"] = lambda h: h.reply(200, body[0], {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        add_source(conn, site.url("/flats.rss"))
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "berlin price:<1500")
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "bob", "loft", price_drop=10)
    one_pass(engine)
    with engine.connect() as conn:
        prices = dict(conn.execute(sa.select(schema.listings.c.title, schema.listings.c.price)).all())
    assert prices == {"Flat in Berlin": "1450.00 EUR", "Loft in Berlin": "2900.00 EUR", "Room in Berlin": None}
    body[0] = feed(("a", "Flat in Berlin", "<g:price>1450.00 EUR</g:price>"),
                   ("b", "Loft in Berlin", "<g:price>2900.00 EUR</g:price><g:sale_price>2499.00 EUR</g:sale_price>"),
                   ("c", "Room in Berlin", ""))
    one_pass(engine)
    assert sorted(told(site)) == [("alice", "new", "Flat in Berlin"), ("bob", "changed", "Loft in Berlin"),
                                  ("bob", "new", "Loft in Berlin")]
