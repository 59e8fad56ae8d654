"""Prices read from what pages show (pipeline/core/prices.py), and the price conditions
of change alerts, on hostile values too: absurd amounts, mixed currencies, markup."""

from __future__ import annotations

from decimal import Decimal

from pipeline.core.prices import Amount, PriceCondition, parse_price


def test_prices_read_as_pages_write_them():
    assert parse_price("€1,299") == Amount(Decimal(1299), "EUR")
    assert parse_price("1.299,00 €") == Amount(Decimal("1299.00"), "EUR")
    assert parse_price("EUR 1299") == Amount(Decimal(1299), "EUR")
    assert parse_price("$ 800") == Amount(Decimal(800), "$"), "$ names several currencies"
    assert parse_price("1 200 kr") is not None
    for unusable in (None, "", "call us", "NaN", "99999999999999999999 EUR", "€ 1" + "0" * 40):
        assert parse_price(unusable) is None, unusable


def test_a_condition_is_met_only_by_a_comparable_price():
    drop = PriceCondition(drop=10)
    assert drop.met("€1,000", "€900") and drop.met("€1,000", "899 EUR")
    assert not drop.met("€1,000", "€901"), "9.9% is not 10%"
    assert not drop.met("€1,000", "$500"), "another currency is no drop"
    assert not drop.met(None, "€500"), "no price heard: nothing to drop from"
    assert not drop.met("€1,000", None) and not drop.met("€1,000", "sold out")
    below = PriceCondition(below=900)
    assert below.met(None, "€850") and below.met("€1,000", "€850") and below.met("€880", "€850")
    assert not below.met("€850", "€870"), "a rise below the line is not told"
    assert not below.met("€1,000", "€900"), "900 is not below 900"
    assert not below.met("€1,000", "$100")
    both = PriceCondition(drop=50, below=900)
    assert both.met("€1,000", "€890") and both.met("€3,000", "€1,400")
    assert not PriceCondition() and PriceCondition(drop=5) and PriceCondition(below=1)


def test_markup_around_a_price_is_not_its_value():
    assert parse_price("<b>€1,200</b>") == Amount(Decimal(1200), "EUR")
    assert PriceCondition(drop=10).met("<b>€1,200</b>", "€ 1,000 <i>")
