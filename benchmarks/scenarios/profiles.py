"""The py-spy profiles collected during the other scenarios, as tables."""

from __future__ import annotations

from benchmarks.model import Section, Table
from benchmarks.scenarios.context import (
    Context,
)


def profiles(ctx: Context) -> Section:
    section = Section(
        "profiles",
        "Profiles (py-spy)",
        "py-spy samples of the busy threads of one process (50 Hz): the share of samples in which a "
        "function was on the stack (inclusive) and in which it was the running frame (self).",
    )
    for profile in ctx.profiles:
        if profile.error:
            section.notes.append(f"{profile.what}: {profile.error}")
            continue
        if not profile.samples:
            section.notes.append(f"{profile.what}: no busy samples (the process was idle or ended)")
            continue
        rows = []
        inclusive = profile.top(profile.inclusive, 15)
        leaf = profile.top(profile.leaf, 15)
        for index in range(max(len(inclusive), len(leaf))):
            left = inclusive[index] if index < len(inclusive) else ("", 0.0)
            right = leaf[index] if index < len(leaf) else ("", 0.0)
            rows.append([left[0], f"{left[1]:.0f} %", right[0], f"{right[1]:.0f} %"])
        section.tables.append(
            Table(
                f"{profile.what}: {profile.samples} samples",
                ["on the stack (inclusive)", "share", "running (self)", "share"],
                rows,
            )
        )
    section.data["profiles"] = [
        {
            "what": p.what,
            "samples": p.samples,
            "error": p.error,
            "inclusive": p.top(p.inclusive, 30),
            "self": p.top(p.leaf, 30),
        }
        for p in ctx.profiles
    ]
    return section
