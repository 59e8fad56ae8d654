"""Prices as pages show them ("€1,299", "1.299,00 EUR", "$ 800"), read as an amount and a
currency (the ``price-parser`` library), and the price conditions a watching filter may
set on its change alerts (`filters add --price-drop 10 --price-below 1500`).

A change is told under a condition only when both prices are known and comparable: the
same currency (a symbol and its code are one: € is EUR), or neither saying one. A price
that does not read as a positive finite amount (absurd, "call us") meets no condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from price_parser import Price

# Symbols that name one currency only ("$" names several, so it stays "$").
_SYMBOLS = {"€": "EUR", "£": "GBP", "₹": "INR", "₩": "KRW", "₺": "TRY", "₴": "UAH", "zł": "PLN", "Kč": "CZK"}
MAX_AMOUNT = Decimal(10) ** 15  # past any real price: a page's digits run together


@dataclass(frozen=True)
class Amount:
    value: Decimal
    currency: str | None  # an ISO code where the text named one plainly, else its symbol


def parse_price(text: str | None) -> Amount | None:
    """``text``'s price, or None when it holds no usable one."""
    if not text:
        return None
    price = Price.fromstring(text)
    if price.amount is None or not price.amount.is_finite() or not 0 <= price.amount < MAX_AMOUNT:
        return None
    return Amount(price.amount, currency_code((price.currency or "").strip()) or None)


def currency_code(written: str) -> str:
    """A currency as prices compare it: a symbol that names one currency as its code
    (€ is EUR), anything else upper-cased ("$" stays "$")."""
    return _SYMBOLS.get(written, written.upper())


@dataclass(frozen=True)
class PriceCondition:
    """When a watching filter's change is told: a drop of at least ``drop`` percent from
    the price last heard of, or a price below ``below`` (and below the price last heard
    of, so each further step down is told once and a rise is not)."""

    drop: float | None = None
    below: float | None = None

    def __bool__(self) -> bool:
        return self.drop is not None or self.below is not None

    def met(self, heard: str | None, now: str | None) -> bool:
        before, after = parse_price(heard), parse_price(now)
        if after is None:
            return False
        comparable = before is not None and before.currency == after.currency
        if (self.drop is not None and comparable and before is not None and before.value > 0
                and after.value <= before.value * (1 - Decimal(str(self.drop)) / 100)):
            return True
        if self.below is not None and after.value < Decimal(str(self.below)):
            return before is None or (comparable and after.value < before.value)
        return False


def condition_problem(drop: float | None, below: float | None) -> str | None:
    """What is wrong with a price condition an operator gives, or None."""
    if drop is not None and not 0 < drop < 100:
        return f"--price-drop {drop:g} must be a percent above 0 and below 100"
    if below is not None and not 0 < below < float(MAX_AMOUNT):
        return f"--price-below {below:g} must be a positive amount"
    return None
