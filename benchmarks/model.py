"""What a benchmark run reports: sections of tables and plots, and checks of figures against targets.

Everything here is plain data that `report` renders to benchmarks/results/RESULTS.md and results.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Check:
    """One figure next to its target. `met` is None when the figure could not be measured here."""

    figure: str
    value: str
    target: str
    met: bool | None
    section: str = ""
    number: float | None = None


@dataclass
class Section:
    key: str
    title: str
    how: str
    tables: list[Table] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def check(
        self, figure: str, value: str, target: str, met: bool | None, number: float | None = None
    ) -> Check:
        found = Check(figure, value, target, met, self.title, number)
        self.checks.append(found)
        return found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def meets(value: float | None, bound: float, at_least: bool = True) -> bool | None:
    """Whether `value` keeps `bound`; a value equal to it up to float rounding does (4.06 / 2.03 is
    2.0000000000000004, which keeps "<= 2")."""
    if value is None:
        return None
    if math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12):
        return True
    return value >= bound if at_least else value <= bound


def fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"
