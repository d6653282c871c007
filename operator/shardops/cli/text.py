"""The text every `kubectl campaign` view shares: tables padded like `kubectl get`, durations and relative
times like kubectl's ages, RFC 3339 times, and the `-o json|yaml` documents. Pure: no I/O, no clock."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import yaml

from shardops.logic.timefmt import rfc3339

NONE = "-"
# Go's duration units (time.ParseDuration), which kubectl's --request-timeout takes, in seconds.
GO_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_GO_DURATION_PART = r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"


def iso(moment: dt.datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None


def duration(seconds: float | None) -> str:
    """45s, 3m12s, 2h05m, 3d04h: two units at most, like kubectl's ages; "-" for None."""
    if seconds is None:
        return NONE
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, sec = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def parse_duration(text: str) -> float:
    """Seconds in a duration as kubectl's --request-timeout reads it: a whole number of seconds ("30"),
    or numbers with Go's units ("30s", "1m", "1h30m", "1.5s", "300ms"); "0" is zero. Negative
    durations and anything else raise ValueError."""
    if re.fullmatch(r"\+?[0-9]+", text):
        return float(int(text))
    body = text.removeprefix("+")
    if not re.fullmatch(f"(?:{_GO_DURATION_PART})+", body):
        raise ValueError(f"not a duration: {text!r}")
    return sum(
        float(number) * GO_DURATION_UNITS[unit] for number, unit in re.findall(_GO_DURATION_PART, body)
    )


def relative(moment: dt.datetime | None, now: dt.datetime) -> str:
    """ "in 40s" for the future, "12s ago" for the past."""
    if moment is None:
        return NONE
    delta = (moment - now).total_seconds()
    if delta >= 0:
        return f"in {duration(delta)}"
    return f"{duration(-delta)} ago"


def percent(part: float | Decimal, whole: float | Decimal) -> str:
    return f"{100 * float(part) / float(whole):.0f}%" if whole else NONE


def names_text(names: Sequence[str], limit: int = 8) -> str:
    if not names:
        return NONE
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit} more" if len(names) > limit else "")


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "", *, no_headers: bool = False
) -> str:
    """Columns padded like `kubectl get`; the last column is not padded (free text). With `no_headers`
    the header line is left out and, as in kubectl, the columns are as wide as the rows alone need."""
    cells = [] if no_headers else [[str(h) for h in headers]]
    cells += [[NONE if c is None or c == "" else str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append((indent + "   ".join(padded)).rstrip())
    return "\n".join(lines)


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def as_yaml(data: Any) -> str:
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).rstrip("\n")
