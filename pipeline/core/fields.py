"""What a listing says of itself beyond its words: its price, salary, area, rooms,
location and company, normalised so that filters compare them (`price:<1500`,
`salary:>=80000`, `rooms:>=3`, `area:>=60`, `location:berlin`, `company:acme`).

Read from schema.org data (JSON-LD and microdata: ``from_schema_org``, over the
JSON-LD shape), from OpenGraph (``from_open_graph``), and from the text a page source's
selectors pick (``from_selected``); pipeline/fetching/structured.py finds them in a page.

Normalised:

* a price's currency as its ISO code (€ is EUR: pipeline/core/prices.py);
* a salary per year (hourly x 2080, daily x 260, weekly x 52, monthly x 12, the
  schema.org ``unitText`` or the words a page writes), as a range (one amount: both ends);
  with no period written, as written;
* an area in square metres (square feet x 0.09290304); with no unit, none: a number
  alone could be either;
* rooms as a number (3.5 is three and a half).

A value that does not read plainly, or is absurd (a negative price, a thousand rooms, a
salary of a billion, markup), is left out: a listing never tells what its page did not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from price_parser import Price

from pipeline.core.prices import MAX_AMOUNT, currency_code

TEXT_CHARS = 200  # a location or a company, at most
MAX_ROOMS = Decimal(100)
MAX_AREA = Decimal(1_000_000)  # square metres
MAX_SALARY = Decimal(100_000_000)  # a year
SQUARE_FOOT = Decimal("0.09290304")  # square metres
# Hours, days, weeks and months of a working year.
PER_YEAR = {"hour": Decimal(2080), "day": Decimal(260), "week": Decimal(52), "month": Decimal(12),
            "year": Decimal(1)}
_PERIODS = (("hour", r"hour|hourly|hr|/h\b|stunde|heure"), ("day", r"day|daily|tag|jour"),
            ("week", r"week|weekly|woche|semaine"), ("month", r"month|monthly|/mo\b|monat|mois"),
            ("year", r"year|yearly|annual|annum|/yr\b|p\.a\.|jahr"))
_SQUARE_FEET = re.compile(r"ftk|ft²|ft2|sq\.?\s*ft|sqft|square\s+f(ee|oo)t", re.IGNORECASE)
_SQUARE_METRES = re.compile(r"mtk|m²|m2|sqm|sq\.?\s*m\b|qm|square\s+met(er|re)s?", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_MARKUP = re.compile(r"[<>]")
# Not a plain amount: markup, a sign before the first digit (a negative), an exponent.
_NOT_PLAIN = re.compile(r"[<>]|^\D*-\s*\d|\d[eE][+-]?\d")
_THOUSANDS = re.compile(r"\d\s*[kK]\b")


@dataclass(frozen=True)
class Fields:
    price: Decimal | None = None
    currency: str | None = None  # the price's
    salary_min: Decimal | None = None  # a year, when the page said the period
    salary_max: Decimal | None = None
    salary_currency: str | None = None
    area: Decimal | None = None  # square metres
    rooms: Decimal | None = None
    location: str | None = None
    company: str | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def merged(self, other: Fields) -> Fields:
        """These fields, each missing one taken from ``other``."""
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(self)
                                if getattr(self, f.name) is None and getattr(other, f.name) is not None})

    def as_json(self) -> dict[str, str]:
        """The fields a listing stores (``listings.fields``): the known ones, amounts as
        exact decimal strings ("83200", never "8.32E+4")."""
        return {f.name: format(value, "f") if isinstance(value, Decimal) else value
                for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Fields:
        """Stored fields read back; a value that does not read as its kind is left out."""
        if not isinstance(data, Mapping):
            return cls()
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = data.get(f.name)
            if raw is None:
                continue
            if f.name in ("currency", "salary_currency", "location", "company"):
                values[f.name] = _text(raw)
            else:
                try:
                    number = Decimal(str(raw))
                except InvalidOperation:
                    continue
                values[f.name] = number if number.is_finite() else None
        return cls(**values)


def _decimal(value: object) -> Decimal | None:
    """A plain number (an int, a float, or text such as "1200", "1,200.50" or "1.200,50")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            return None
    elif isinstance(value, str) and len(value) <= 64 and not _NOT_PLAIN.search(value):
        amount = Price.fromstring(value).amount
        if amount is None:
            return None
        number = amount
    else:
        return None
    return number if number.is_finite() else None


def _text(value: object) -> str | None:
    """A location or a company: text of one line, without markup, bounded."""
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    if not text or _MARKUP.search(text):
        return None
    return text[:TEXT_CHARS]


def _within(value: Decimal | None, low: Decimal, high: Decimal) -> Decimal | None:
    return value if value is not None and low < value <= high else None


def price(amount: object, currency: object = None) -> Fields:
    value = _decimal(amount)
    if value is None or not 0 <= value < MAX_AMOUNT:
        return Fields()
    code = currency_code(currency.strip()) if isinstance(currency, str) and currency.strip() else None
    return Fields(price=value, currency=code if code and len(code) <= 8 else None)


def period(text: object) -> str | None:
    """The salary period a unit names ("HOUR", "per month", "p.a."), or None."""
    if not isinstance(text, str):
        return None
    folded = text.casefold()
    return next((name for name, words in _PERIODS if re.search(rf"(?<![a-z])(?:{words})", folded)), None)


def salary(low: object, high: object = None, unit: object = None, currency: object = None) -> Fields:
    """A salary from ``low`` to ``high`` (one amount: ``low``) per ``unit``, a year's."""
    top = _decimal(high if high is not None else low)
    bottom = _decimal(low)
    if bottom is None:
        bottom = top
    if bottom is None or top is None:
        return Fields()
    times = PER_YEAR.get(period(unit) or "year", Decimal(1))
    low_year, high_year = (_within(end * times, Decimal(0), MAX_SALARY) for end in (bottom, top))
    if low_year is None or high_year is None or high_year < low_year:
        return Fields()
    code = currency_code(currency.strip()) if isinstance(currency, str) and currency.strip() else None
    return Fields(salary_min=low_year, salary_max=high_year,
                  salary_currency=code if code and len(code) <= 8 else None)


def area(value: object, unit: object) -> Fields:
    """An area of ``value`` in ``unit`` (a UN/CEFACT code, MTK or FTK, or as written:
    "m²", "sq ft"), in square metres; none for a unit it does not know."""
    number = _decimal(value)
    if number is None or not isinstance(unit, str):
        return Fields()
    if _SQUARE_FEET.search(unit):
        number = (number * SQUARE_FOOT).quantize(Decimal("0.01"))
    elif not _SQUARE_METRES.search(unit):
        return Fields()
    return Fields(area=_within(number, Decimal(0), MAX_AREA))


def rooms(value: object) -> Fields:
    number = _decimal(value)
    if number is None or number % Decimal("0.5"):
        return Fields()
    return Fields(rooms=_within(number, Decimal(0), MAX_ROOMS))


def location(value: object) -> Fields:
    return Fields(location=_text(value))


def company(value: object) -> Fields:
    return Fields(company=_text(value))


# -- schema.org, in the JSON-LD shape (extruct gives microdata in it too) --------------


def types(node: Mapping[str, Any]) -> set[str]:
    """A node's schema.org types, without the vocabulary's URL."""
    written = node.get("@type")
    names = written if isinstance(written, list) else [written]
    return {name.rsplit("/", 1)[-1] for name in names if isinstance(name, str)}


def _nodes(value: object) -> list[Mapping[str, Any]]:
    """The nodes a property holds (one, or a list), skipping plain values."""
    found = value if isinstance(value, list) else [value]
    return [v for v in found if isinstance(v, Mapping)]


def _first(value: object) -> object:
    return value[0] if isinstance(value, list) and value else value


def _name(value: object) -> object:
    """A thing's name: the text itself, or a node's ``name``."""
    value = _first(value)
    return value.get("name") if isinstance(value, Mapping) else value


def _address(value: object) -> str | None:
    """A PostalAddress (or a place's address) as one line: locality first."""
    value = _first(value)
    if isinstance(value, str):
        return _text(value)
    if not isinstance(value, Mapping):
        return None
    parts = [_text(_name(value.get(key))) for key in ("streetAddress", "postalCode", "addressLocality",
                                                       "addressRegion", "addressCountry")]
    return _text(", ".join(dict.fromkeys(p for p in parts if p))) or None


def place_text(value: object) -> str | None:
    """A Place (or a list of them, or text) as one line: its address, else its name."""
    place = _first(value)
    if isinstance(place, Mapping):
        return _address(place.get("address")) or _text(place.get("name"))
    return _text(place)


def _quantity(value: object) -> tuple[object, object, object]:
    """(value or minValue, maxValue, unit) of a QuantitativeValue, or of a plain value."""
    value = _first(value)
    if isinstance(value, Mapping):
        low = value.get("value", value.get("minValue"))
        return low, value.get("maxValue"), value.get("unitCode") or value.get("unitText")
    return value, None, None


def _offer_price(offer: Mapping[str, Any]) -> Fields:
    """An Offer's (or an AggregateOffer's lowest) price, or its price specification's."""
    spec = _first(offer.get("priceSpecification"))
    spec = spec if isinstance(spec, Mapping) else {}
    amount = offer.get("price", offer.get("lowPrice", spec.get("price")))
    return price(_first(amount), offer.get("priceCurrency") or spec.get("priceCurrency"))


def _offer(node: Mapping[str, Any]) -> Fields:
    # "Offers" too: shops' templates write it so, and readers take it (schema.org is
    # case-sensitive; a reader of prices is not the place to insist).
    for offer in _nodes(node.get("offers", node.get("Offers"))):
        if found := _offer_price(offer):
            return found
    return Fields()


def _salary(node: Mapping[str, Any]) -> Fields:
    for key in ("baseSalary", "estimatedSalary"):
        for money in _nodes(node.get(key)) or ([{"value": node[key]}] if node.get(key) is not None else []):
            low, high, unit = _quantity(money.get("value"))
            found = salary(low, high, unit or money.get("unitText"),
                           money.get("currency") or node.get("salaryCurrency"))
            if found:
                return found
    return Fields()


def from_schema_org(node: Mapping[str, Any]) -> Fields:
    """The fields of one schema.org thing (a JobPosting, a Product or an Offer, an
    Accommodation, a RealEstateListing, an Event, ...)."""
    found = _offer(node)
    if types(node) & {"Offer", "AggregateOffer"}:
        found = found.merged(_offer_price(node))
    found = found.merged(_salary(node))
    found = found.merged(company(_name(node.get("hiringOrganization"))))
    # Where it is: a job's place (or, for one done from anywhere, where its applicants
    # must be), a flat's address, an event's venue.
    found = found.merged(location(place_text(node.get("jobLocation")) or _address(node.get("address"))
                                  or place_text(node.get("location"))
                                  or _name(node.get("applicantLocationRequirements"))))
    low, _high, unit = _quantity(node.get("floorSize"))
    found = found.merged(area(low, unit)).merged(rooms(_quantity(node.get("numberOfRooms"))[0]))
    for inner in ("mainEntity", "about", "itemOffered"):  # a listing of a flat, an offer of a product
        for thing in _nodes(node.get(inner)):
            found = found.merged(from_schema_org(thing))
    return found


def things(data: object) -> Iterator[Mapping[str, Any]]:
    """Every thing a page's schema.org data is about: its top-level things, a ``@graph``'s
    members and an ItemList's items in their stead, and what a thing is about or offers
    (a page's ``mainEntity``, a seller's ``makesOffer``) after it."""
    for node in _nodes(data):
        if "@graph" in node:
            yield from things(node["@graph"])
        elif "ItemList" in types(node):
            for element in _nodes(node.get("itemListElement")):
                yield from things(element.get("item", element) if "ListItem" in types(element) else element)
        else:
            yield node
            for inner in ("mainEntity", "makesOffer"):
                yield from things(node.get(inner))


# -- OpenGraph and selected text --------------------------------------------------------


def from_open_graph(properties: Mapping[str, Any]) -> Fields:
    """A page's OpenGraph price (``product:price:amount`` and ``:currency``, or ``og:price:``)."""
    for prefix in ("product:price:", "og:price:", "product:sale_price:"):
        found = price(_first(properties.get(prefix + "amount")), _first(properties.get(prefix + "currency")))
        if found:
            return found
    return Fields()


def from_selected(selected: Mapping[str, str]) -> Fields:
    """The fields a page source's selectors picked, from their elements' text
    (``rooms``: "3.5 rooms"; ``area``: "75 m²", "800 sq ft"; ``salary``: "€60,000 -
    €80,000 a year"; ``location`` and ``company`` as written); text holding markup is
    no value."""
    found = Fields()
    selected = {key: text for key, text in selected.items() if not _MARKUP.search(text)}  # markup: not a value
    if text := selected.get("rooms"):
        number = _NUMBER.search(text)
        found = found.merged(rooms(number.group().replace(",", ".") if number else None))
    if text := selected.get("area"):
        number = _NUMBER.search(text)
        found = found.merged(area(number.group() if number else None, text[number.end():] if number else None))
    if text := selected.get("salary"):
        found = found.merged(salary_text(text))
    return found.merged(location(selected.get("location"))).merged(company(selected.get("company")))


def salary_text(text: str) -> Fields:
    """A salary as a page writes it: "€60,000 - €80,000 a year", "$40/hour", "4.500 € / Monat"."""
    parts = re.split(r"\s+(?:-|–|—|to|bis)\s+|(?<=[\dkK])\s*[-–—]\s*(?=\D?\d)", text, maxsplit=1)
    if _NOT_PLAIN.search(text):
        return Fields()
    amounts = [Price.fromstring(part) for part in parts]
    currency = next((a.currency for a in amounts if a.currency), None)
    values = [None if a.amount is None else a.amount * (1000 if _THOUSANDS.search(part) else 1)
              for a, part in zip(amounts, parts, strict=True)]
    return salary(values[0], values[1] if len(values) > 1 else None, text, currency)
