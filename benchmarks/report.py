"""benchmarks/results/RESULTS.md, results.json and the summary table printed at the end of a run."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.model import Check, Section, Table
from benchmarks.plan import Plan


def machine() -> dict[str, str]:
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return {
        "cores": str(os.cpu_count()),
        "memory": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load average at start (1, 5, 15 min)": load,
    }


def _table(table: Table) -> str:
    lines = [f"**{table.title}**", "", "| " + " | ".join(table.headers) + " |"]
    lines.append("|" + "|".join(" --- " for _ in table.headers) + "|")
    for row in table.rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(check: Check) -> str:
    return {True: "meets", False: "**misses**", None: "not measured"}[check.met]


def summary_table(checks: Sequence[Check]) -> Table:
    return Table(
        "every figure against its target",
        ["figure", "measured", "target", ""],
        [[c.figure, c.value, c.target, _verdict(c)] for c in checks],
    )


def write(
    out: Path,
    plan: Plan,
    sections: Sequence[Section],
    facts: dict[str, Any],
    limits: Sequence[str],
) -> Path:
    checks = [c for s in sections for c in s.checks]
    lines = [
        "# shardops benchmarks: results",
        "",
        f"Produced by `{facts['command']}` — {plan.description}. How to read each table and figure: "
        "[README.md](../README.md). Absolute times on a shared 2-core machine are noise; the ratios of "
        "runs measured side by side in this one run are the result.",
        "",
        "| | |",
        "| --- | --- |",
    ]
    for key, value in facts["about"].items():
        lines.append(f"| {key} | {value} |")
    lines += ["", "## Summary", "", _table(summary_table(checks)), ""]
    if limits:
        lines += ["## What limits the figures that miss", ""]
        lines += [f"* {text}" for text in limits]
        lines.append("")
    for section in sections:
        lines += [f"## {section.title}", "", section.how, ""]
        if section.error:
            lines += [f"**Not completed:** {section.error}", ""]
        for table in section.tables:
            lines += [_table(table), ""]
        for note in section.notes:
            lines += [f"* {note}"]
        if section.notes:
            lines.append("")
        for plot in section.plots:
            if (out / plot).exists():
                lines += [f"![{plot}]({plot})", ""]
        lines += [f"_Section time: {section.seconds:.0f} s._", ""]
    path = out / "RESULTS.md"
    path.write_text("\n".join(lines))
    (out / "results.json").write_text(
        json.dumps(
            {"facts": facts, "sections": [s.to_json() for s in sections], "limits": list(limits)},
            indent=1,
            default=str,
        )
    )
    return path


def print_summary(sections: Sequence[Section]) -> None:
    checks = [c for s in sections for c in s.checks]
    width = max((len(c.figure) for c in checks), default=10)
    print("\nshardops benchmarks — every figure against its target")
    for check in checks:
        print(f"  {check.figure:<{width}}  {check.value:<28}  target {check.target:<12}  {_verdict(check)}")


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
