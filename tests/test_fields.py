"""A listing's fields (pipeline/core/fields.py): read from a page's structured data
(JSON-LD, microdata, OpenGraph), a source's selectors and a feed's g:price, normalised
(currency codes, a year's salary, square metres), stored with the listing, and compared
by filters (`salary:>=80000 rooms:3..4 area:>=60 location:berlin company:acme`)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pipeline.catalogue import users, workbench
from pipeline.core import fields
from pipeline.core.errors import QueryError
from pipeline.core.fields import Fields
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.fetching.page import parse_page
from pipeline.listings.normalize import normalise
from pipeline.notify.matching import Filter, FilterIndex, ListingText, reasons
from pipeline.notify.query import compile_query
from tests.conftest import conformance
from tests.helpers import add_source
from tests.test_notifier import SECRET, notifier, posts
from tests.test_processor import processor

NOW = datetime(2026, 11, 27, tzinfo=UTC)
D = Decimal


# -- normalising ----------------------------------------------------------------------


@pytest.mark.parametrize(("written", "low", "high", "currency"), [
    ("€60,000 - €80,000 a year", 60000, 80000, "EUR"),
    ("$40/hour", 83200, 83200, "$"),
    ("4.500 € / Monat", 54000, 54000, "EUR"),
    ("£30k-£35k per annum", 30000, 35000, "GBP"),
    ("$45,000 to $55,000", 45000, 55000, "$"),  # no period written: as written
    ("CHF 1,000 per week", 52000, 52000, "CHF"),
])
def test_a_salary_is_a_year_s_range_with_its_currency(written, low, high, currency):
    found = fields.salary_text(written)
    assert (found.salary_min, found.salary_max, found.salary_currency) == (D(low), D(high), currency)


@pytest.mark.parametrize(("value", "unit", "area"), [
    ("75", "MTK", "75"), (75, "m²", "75"), ("800", "FTK", "74.32"), ("800", "sq ft", "74.32"),
    ("1,200", "sqft", "111.48"), ("75", None, None), ("75", "acres", None), ("0", "m2", None),
    ("2000000", "m2", None),
])
def test_an_area_is_square_metres_and_a_number_without_a_unit_is_none(value, unit, area):
    assert fields.area(value, unit).area == (None if area is None else D(area))


@pytest.mark.parametrize("hostile", ["-5", "1e30", "<b>5</b>", "NaN", "Infinity", "9" * 70, True, [3], {"value": 3}])
def test_absurd_or_marked_up_values_are_left_out(hostile):
    assert not fields.price(hostile, "EUR")
    assert not fields.rooms(hostile)
    assert not fields.area(hostile, "m2")
    assert not fields.salary(hostile, None, "YEAR", "EUR")


def test_absurd_amounts_and_markup_in_text_fields_are_left_out():
    assert not fields.rooms("1000") and not fields.rooms("2.25") and fields.rooms("3.5").rooms == D("3.5")
    assert not fields.salary(10**12, None, "YEAR")
    assert not fields.salary(90000, 60000, "YEAR"), "a range that ends below its start"
    assert not fields.location("<script>alert(1)</script>") and not fields.company("x" + "<" + "y")
    assert fields.location("  Berlin,\n Mitte ").location == "Berlin, Mitte"
    assert len(fields.company("A" * 1000).company) == fields.TEXT_CHARS


def test_stored_fields_read_back_as_they_were_and_bad_stored_values_are_dropped():
    found = fields.salary(40, 50, "HOUR", "USD").merged(fields.area("800", "FTK")).merged(fields.location("Berlin"))
    stored = found.as_json()
    assert stored == {"salary_min": "83200", "salary_max": "104000", "salary_currency": "USD", "area": "74.32",
                      "location": "Berlin"}
    assert Fields.from_json(json.loads(json.dumps(stored))) == found
    assert Fields.from_json({"rooms": "three", "area": "NaN", "location": 5, "price": "12"}) == Fields(price=D(12))


# -- reading pages --------------------------------------------------------------------


@pytest.mark.parametrize(("data", "expected"), [
    # A page about a product (ItemPage's mainEntity), its offer's price specification.
    ({"@type": "ItemPage", "mainEntity": {"@type": "Product", "offers": {
        "@type": "Offer", "priceSpecification": {"price": "99.99", "priceCurrency": "USD"}}}},
     {"price": "99.99", "currency": "USD"}),
    # A person selling a car (makesOffer), an AggregateOffer's lowest price.
    ({"@type": "Person", "makesOffer": {"@type": "Offer", "priceSpecification": {"price": "18000",
                                                                                 "priceCurrency": "USD"},
                                        "itemOffered": {"@type": "Car"}}}, {"price": "18000", "currency": "USD"}),
    ({"@type": "Event", "offers": {"@type": "AggregateOffer", "lowPrice": "35", "priceCurrency": "USD"},
      "location": {"@type": "Place", "address": "79 Washington St., Providence, RI"}},
     {"price": "35", "currency": "USD", "location": "79 Washington St., Providence, RI"}),
    # A job done from anywhere: where its applicants must be.
    ({"@type": "JobPosting", "applicantLocationRequirements": {"@type": "Country", "name": "USA"},
      "baseSalary": "100000", "salaryCurrency": "USD"},
     {"location": "USA", "salary_min": "100000", "salary_max": "100000", "salary_currency": "USD"}),
    # A venue written beside its offer (a @graph of a Place and an Offer).
    ({"@graph": [{"@type": "Place", "name": "The Hi-Dive", "address": {"addressLocality": "Denver"}},
                 {"@type": "Offer", "price": "13.00", "priceCurrency": "USD"}]},
     {"price": "13.00", "currency": "USD", "location": "Denver"}),
    # Not a listing: the site's organisation and its address are nobody's location.
    ({"@type": "Organization", "name": "Board", "address": {"addressLocality": "Hamburg"}}, None),
])
def test_the_things_a_page_is_about_give_its_fields(data, expected):
    from pipeline.fetching import structured

    found = structured.page_fields({"json-ld": [data]})
    assert (found.as_json() or None) == expected

JOB_PAGE = b"""<html><head><title>Data engineer</title>
<meta property="og:title" content="Data engineer">
<script type="application/ld+json">{"@context": "https://schema.org", "@graph": [
  {"@type": "Organization", "name": "Job board", "address": {"@type": "PostalAddress", "addressLocality": "Hamburg"}},
  {"@type": "JobPosting", "title": "Data engineer", "hiringOrganization": {"@type": "Organization", "name": "Acme Corp"},
   "jobLocation": {"@type": "Place", "address": {"@type": "PostalAddress", "addressLocality": "Berlin",
                                                  "addressCountry": "DE"}},
   "baseSalary": {"@type": "MonetaryAmount", "currency": "EUR",
                  "value": {"@type": "QuantitativeValue", "minValue": 5000, "maxValue": 6500, "unitText": "MONTH"}}}
]}</script></head><body><h1>Data engineer</h1><p>Pipelines.</p></body></html>"""


def test_a_job_page_s_json_ld_gives_its_salary_company_and_location_not_the_site_s():
    [item] = parse_page(JOB_PAGE, "http://127.0.0.1/jobs/1", {})
    assert item.raw["fields"] == {"salary_min": "60000", "salary_max": "78000", "salary_currency": "EUR",
                                  "location": "Berlin, DE", "company": "Acme Corp"}


FLATS = """<html><head><title>Flats</title>
<script type="application/ld+json">{"@context": "https://schema.org", "@type": "ItemList", "itemListElement": [
  {"@type": "ListItem", "position": 1, "item": {"@type": "Apartment", "url": "/flats/2",
   "numberOfRooms": 2, "floorSize": {"@type": "QuantitativeValue", "value": 650, "unitCode": "FTK"},
   "address": {"@type": "PostalAddress", "addressLocality": "Potsdam"}}}]}</script>
<script type="application/ld+json">{"broken": </script></head><body><ul>
<li class="flat" itemscope itemtype="https://schema.org/Apartment"><a href="/flats/1">Flat one</a>
  <span itemprop="numberOfRooms">3</span>
  <div itemprop="floorSize" itemscope itemtype="https://schema.org/QuantitativeValue">
    <span itemprop="value">72</span><meta itemprop="unitCode" content="MTK"></div>
  <div itemprop="address" itemscope itemtype="https://schema.org/PostalAddress">
    <span itemprop="addressLocality">Berlin</span></div>
  <span class="rent">1.250 €</span></li>
<li class="flat"><a href="/flats/2">Flat two</a><span class="rent">€ 990</span><span class="size">4 rooms</span></li>
<li class="flat"><a href="/flats/3">Flat three</a><span class="rent">€ 10000000000000000000</span>
  <span class="size">&lt;b&gt;3&lt;/b&gt; rooms</span></li>
</ul></body></html>""".encode()


def test_each_item_takes_its_own_microdata_the_json_ld_at_its_link_and_its_selectors_first():
    config = {"item": "li.flat", "title": "a", "price": ".rent", "rooms": ".size"}
    one, two, three = parse_page(FLATS, "http://127.0.0.1/flats", config)
    assert one.raw["fields"] == {"rooms": "3", "area": "72", "location": "Berlin"}
    assert one.raw["price"] == "1.250 €", "the selector's text, read as a price when stored"
    # The selector's "4 rooms" wins over the JSON-LD's 2; the rest is the JSON-LD's.
    assert two.raw["fields"] == {"rooms": "4", "area": "60.39", "location": "Potsdam"}
    # An absurd price and markup in a value: no fields, and the broken script failed nothing.
    assert "fields" not in three.raw
    assert normalise(one.raw).fields == {"price": "1250", "currency": "EUR", "rooms": "3", "area": "72",
                                         "location": "Berlin"}
    assert "price" not in (normalise(three.raw).fields or {})


@pytest.mark.parametrize("markup", [
    # A shop template's trailing commas and a comment: not strict JSON, read as readers do.
    '<script type="application/ld+json">// product\n{"@type": "Product", "offers": {"@type": "Offer",'
    ' "price": 155.55, "priceCurrency": "AUD",},}</script>',
    # "Offers" capitalised, a list of types.
    '<script type="application/ld+json">{"@type": ["Product", "SubType"], "Offers": {"@type": "Offer",'
    ' "price": 155.55, "priceCurrency": "AUD"}}</script>',
    # A list of offers, the first with a price specification; the site's WebSite beside it.
    '<script type="application/ld+json">{"@type": "WebSite", "url": "/"}</script>'
    '<script type="application/ld+json">{"@type": "Product", "offers": [{"@type": "Offer", "priceSpecification":'
    ' {"@type": "PriceSpecification", "price": 155.55, "priceCurrency": "AUD"}}]}</script>',
    # Microdata whose currency is a symbol shown with a machine-readable code, the price
    # in a content attribute beside its shown text.
    '<div itemscope itemtype="http://schema.org/Product"><span itemprop="offers" itemscope'
    ' itemtype="http://schema.org/Offer"><sup itemprop="priceCurrency" content="AUD">$</sup>'
    '<span itemprop="price" content="155.55">155.55</span></span></div>',
])
def test_prices_as_shops_mark_them_up_are_read(markup):
    body = f"<html><body><p>Price: $155.55</p>{markup}</body></html>".encode()
    [item] = parse_page(body, "http://127.0.0.1/product", {})
    assert item.raw["fields"] == {"price": "155.55", "currency": "AUD"}


def test_a_product_page_s_open_graph_price_is_its_price_and_a_change_of_it_a_change_of_the_item():
    page = (b'<html><head><meta property="product:price:amount" content="%s">'
            b'<meta property="product:price:currency" content="EUR"></head><body>Lamp</body></html>')
    [before] = parse_page(page % b"49.90", "http://127.0.0.1/lamp", {})
    [after] = parse_page(page % b"39.90", "http://127.0.0.1/lamp", {})
    assert before.raw["fields"] == {"price": "49.90", "currency": "EUR"} and before.raw["price"] == "49.90 EUR"
    assert normalise(before.raw).content_hash != normalise(after.raw).content_hash


def test_mixed_currencies_never_compare():
    eur, usd = ListingText(1, 1, "Lamp", "", fields=fields.price(100, "EUR")), \
        ListingText(2, 1, "Lamp", "", fields=fields.price(100, "USD"))
    index = FilterIndex([Filter(1, 1, query=compile_query("lamp currency:EUR price:<150"))])
    assert [m.listing_id for m in index.matches([eur, usd], now=NOW)] == [1]


# -- conditions -----------------------------------------------------------------------


def listing(id: int, title: str, **found: object) -> ListingText:
    return ListingText(id, 1, title, "", (), NOW, fields=Fields(**found))


LISTINGS = [
    listing(1, "Data engineer", salary_min=D(70000), salary_max=D(90000), location="Berlin, DE", company="Acme Corp"),
    listing(2, "Data engineer", salary_min=D(50000), salary_max=D(60000), location="Hamburg", company="Acme Corp"),
    listing(3, "Data engineer"),
    listing(4, "Flat", rooms=D(3), area=D(72), location="Berlin Mitte", price=D(1250), currency="EUR"),
    listing(5, "Flat", rooms=D("4.5"), area=D(110), location="Potsdam", price=D(1900), currency="EUR"),
    listing(6, "Flat", rooms=D(2), area=D(45), location="Berlin"),
]


@pytest.mark.parametrize(("query", "ids"), [
    ("engineer salary:>=80000", [1]),  # 70000..90000 reaches 80000
    ("engineer salary:55000..65000", [2]),
    ("engineer -salary:>=80000", [2, 3]),
    ("location:berlin", [1, 4, 6]),
    ('company:"acme corp" location:berlin', [1]),
    ("flat rooms:>=3", [4, 5]),
    ("flat rooms:3..4 area:>=60", [4]),
    ("location:berlin rooms:>=3 price:<1500", [4]),
    ("flat area:<50 OR location:potsdam", [5, 6]),
])
def test_field_conditions_match_as_written(query, ids):
    index = FilterIndex([Filter(1, 1, query=compile_query(query))])
    assert sorted(m.listing_id for m in index.matches(LISTINGS, now=NOW)) == ids


def test_conditions_say_what_they_matched_and_bad_ones_name_the_position():
    [why] = [reasons(compile_query("engineer salary:>=80000 location:berlin"), LISTINGS[0], NOW)]
    assert why == ("engineer (title)", "salary 70000..90000 a year", "location:berlin")
    with pytest.raises(QueryError, match="nothing here must appear"):
        compile_query("rooms:>=3")
    with pytest.raises(QueryError, match="at position 12: rooms:many is not an amount condition"):
        compile_query("flat rooms:many")
    with pytest.raises(QueryError, match="write the amount without a thousands separator"):
        compile_query("job salary:>80,000")


# -- end to end -----------------------------------------------------------------------


@conformance
def test_a_flat_page_s_fields_reach_a_filter_and_the_workbench(engine, receiver):
    """A page source served by a real local server, the collector, processor and notifier:
    only the flat the filter's fields describe is notified, and `filters test` finds it.
    On every database: the fields are a JSON column each stores its own way."""
    receiver.routes["/flats"] = lambda h: h.reply(200, FLATS, {"Content-Type": "text/html"})
    with engine.begin() as conn:
        source_id = add_source(conn, receiver.url("/flats"), source_type="http",
                               config={"item": "li.flat", "title": "a", "price": ".rent", "rooms": ".size"})
        users.add_user(conn, "alice", webhook=receiver.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "location:berlin rooms:>=3 price:<1500")
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",))
    assert Collector(engine, settings, "test").run().succeeded == 1
    assert processor(engine).run().inserted == 3
    assert notifier(engine).run().sent == 1
    [post] = [p for p in posts(receiver) if p["path"] == "/hook"]
    listing = json.loads(post["body"])["listing"]
    assert listing["title"] == "Flat one" and listing["fields"] == {
        "price": "1250", "currency": "EUR", "rooms": "3", "area": "72", "location": "Berlin"}
    trial = workbench.try_filter(engine, "alice", "location:potsdam area:>=50")
    assert [hit.title for hit in trial.hits] == ["Flat two"], source_id


def test_a_price_read_into_fields_leaves_the_listing_s_content_hash_as_it_was():
    """Listings stored before fields (a page's price selector, a feed's g:price) keep
    their hashes: reprocessing them changes no listing."""
    raw = {"title": "Lamp", "url": "http://127.0.0.1/lamp", "summary": "", "price": "€ 49.90"}
    with_fields = normalise(raw)
    assert with_fields.fields == {"price": "49.90", "currency": "EUR"}
    assert with_fields.content_hash == dataclasses.replace(with_fields, fields=None).content_hash
    assert normalise({**raw, "fields": {"rooms": "3"}}).content_hash != with_fields.content_hash
