"""Money: costs, budgets and prices as exact decimals, never binary floats.

Thirty costs of 0.1 add up to 3, not 3.0000000000000004. On the wire an amount is a canonical
decimal string ("0.3", "3": no exponent, no trailing zeros); users may write a number or a string
(`limit: 0.5`, `limit: "0.5"`), and objects stored before (JSON numbers) still parse. The CRD
cannot type "number or string" (a structural schema has one type; int-or-string refuses 0.5), so
the field is untyped there, and invisible to the CRD's CEL rules. Its value checks still apply to
an untyped field by the value's kind: a string must match MONEY_PATTERN, a number must lie in
[0, 10^18) (api/common.py `Money`), so the API server refuses `limit: "abc"` and `limit: -1` at
admission with the same bounds parse_money applies here. What the schema cannot say (a boolean or
an object, a nonzero amount below 10^-60, maxPerShard over limit without the chart's admission
policy) the model checks: the operator reports it as Ready=False InvalidSpec naming the field.
Pure (no pydantic): the logic layer prints amounts with it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MONEY_DESCRIPTION = 'A decimal amount: a number (5, 0.5) or a decimal string ("0.5").'
# Bounds of an amount, so its text stays short (1E+999999 would print a million digits): below
# 10^18, and a nonzero amount at least 10^-60 (far below any price per token).
MONEY_MAX_MAGNITUDE = 18
MONEY_MIN_MAGNITUDE = -60
# A decimal string: digits with an optional fraction and exponent ("5", "0.5", ".5", "2.5e-6"). No
# sign, "NaN" or "Infinity": the CRD's pattern for string amounts, and parse_money's (which also
# forgives the spaces around a command's reported cost).
MONEY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"


def money_text(value: Decimal) -> str:
    """The canonical wire form of an amount: plain notation, no exponent, no trailing zeros."""
    if value == 0:
        return "0"
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


class JsonNumber(float):
    """A JSON number with a fraction or exponent: a float to everyone, but it keeps the text it was
    parsed from, so an amount reads exactly what was written (`json.loads(raw, parse_float=JsonNumber)`:
    a command's `"cost": 0.1` is Decimal("0.1") while the floats of its result stay floats)."""

    text: str

    def __new__(cls, text: str) -> JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def money_or_none(value: Decimal | None) -> str | None:
    """money_text for an optional amount (JSON reports: null when absent)."""
    return None if value is None else money_text(value)


def parse_money(value: object) -> Decimal:
    """An amount from what a user, a stored object or a command wrote: Decimal, int, decimal string,
    or a float (a JSON number parsed as float: its shortest repr is the text that was written)."""
    if isinstance(value, Decimal):
        amount = value
    elif isinstance(value, JsonNumber):
        amount = Decimal(value.text)
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"an amount must be a number or a decimal string, got {value!r}")
    elif isinstance(value, str) and not re.fullmatch(MONEY_PATTERN, value.strip()):
        raise ValueError(
            f"an amount must be a number or a decimal string such as 0.5 (it should match "
            f"'{MONEY_PATTERN}'), got {value!r}"
        )
    else:
        try:
            amount = Decimal(str(value).strip())
        except InvalidOperation:  # pragma: no cover - MONEY_PATTERN and float reprs are decimals
            raise ValueError(f"an amount must be a decimal number such as 0.5, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        # No amount in shardops is negative: costs, budgets and prices only add up. The wording is
        # the API server's for the CRD's `minimum: 0`, so both refusals read alike.
        raise ValueError(f"an amount should be greater than or equal to 0, got {value!r}")
    if amount and not MONEY_MIN_MAGNITUDE <= amount.adjusted() < MONEY_MAX_MAGNITUDE:
        raise ValueError(
            f"an amount must be 0 or between 1e{MONEY_MIN_MAGNITUDE} and 1e{MONEY_MAX_MAGNITUDE}, "
            f"got {value!r}"
        )
    return amount
