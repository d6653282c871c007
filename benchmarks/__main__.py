"""`make bench`: measure shardops on the local control plane (or the cluster KUBECONFIG names) and
write benchmarks/results/: RESULTS.md, results.json and the PNG figures.

    python -m benchmarks                 # the full set (BENCH_QUICK=1: the quick set)
    python -m benchmarks --plan quick --out /tmp/bench
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import limits, report
from benchmarks.model import Section
from benchmarks.plan import PLANS, Plan, narrowed
from benchmarks.plots import Plots
from benchmarks.scenarios import cost, failing, latency, many, million, physical, profiles, scale, versus
from benchmarks.scenarios.context import Context, stop_everything
from benchmarks.target import Target, acquire, git_revision

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent

STEPS: list[tuple[str, Callable[[Context], Section]]] = [
    ("physical", physical.physical),
    ("versus", versus.versus),
    ("cost", cost.api_cost),
    ("latency", latency.latency),
    ("many", many.many),
    ("scale", scale.scale),
    ("failing", failing.failing),
    ("million", million.million),
]
# Sections whose runs shrink to the time left (down to a minimum) instead of being skipped.
ADAPTIVE = frozenset({"many", "scale", "failing", "million"})


def wanted(key: str, plan: Plan, only: frozenset[str]) -> bool:
    """Whether section `key` runs: one of `only` (all when empty) that has something to run. The
    full set's million-item run is longer than the rest of the set's budget leaves: it runs only
    when asked for (in `only`, or its case named: `narrowed`)."""
    if only and key not in only:
        return False
    if key == "many":
        return plan.many_campaigns > 0
    if key == "million":
        return bool(plan.million) and (not plan.million_on_request or key in only)
    return True


def run(
    target: Target, plan: Plan, out: Path, command: str, only: frozenset[str] = frozenset()
) -> list[Section]:
    """Every scenario of `plan` on `target` (or those named in `only`); writes RESULTS.md and the
    figures into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    started = time.monotonic()
    ctx = Context(target, plan, out, Plots(out))
    about = {
        "date": report.now_text(),
        "git revision": git_revision(),
        "cluster": target.kind,
        **{f"machine: {k}": v for k, v in report.machine().items()},
        **{f"version: {k}": v for k, v in target.versions().items()},
        "set": plan.name,
    }
    sections: list[Section] = []
    for key, step in STEPS:
        if not wanted(key, plan, only):
            continue
        elapsed = time.monotonic() - started
        if elapsed > plan.deadline and key not in ADAPTIVE:
            skipped = Section(key, key, "")
            skipped.error = f"skipped: the run had used {elapsed:.0f} s of its {plan.deadline:.0f} s"
            sections.append(skipped)
            continue
        print(f"[bench] {key} (at {elapsed:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            section = step(ctx)
        except Exception as error:
            section = Section(key, key, "")
            section.error = f"{type(error).__name__}: {error}"[:2000]
            traceback.print_exc()
        section.seconds = time.monotonic() - began
        sections.append(section)
    sections.append(profiles.profiles(ctx))
    about["total time"] = f"{time.monotonic() - started:.0f} s"
    facts = {"command": command, "about": about}
    report.write(out, plan, sections, facts, limits.explain(sections, ctx))
    report.print_summary(sections)
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    default = "quick" if os.environ.get("BENCH_QUICK") not in (None, "", "0") else "full"
    parser.add_argument("--plan", choices=sorted(PLANS), default=default)
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="where RESULTS.md and the figures go"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO_ROOT / ".shardops" / "bench",
        help="cluster state, ledgers, profiles",
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"comma list of sections to run ({', '.join(key for key, _ in STEPS)}); "
        "use with --out so the full RESULTS.md stays",
    )
    parser.add_argument(
        "--case",
        default="",
        help="comma list of the versus, scale, failing and million cases to run (full set: zero, 1s, 5s; "
        "10k, 100k; 500k-failing; 1m, which runs only when named here or in --only); "
        "a section none of whose cases is named runs all of its own",
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats of each versus case")
    args = parser.parse_args(argv)
    only = frozenset(key for key in args.only.split(",") if key)
    unknown = only - {key for key, _ in STEPS}
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}")
    cases = frozenset(key for key in args.case.split(",") if key)
    try:
        plan = narrowed(PLANS[args.plan], cases, args.repeats)
    except ValueError as error:
        parser.error(f"--case/--repeats: {error}")
    command = "BENCH_QUICK=1 make bench" if plan.name == "quick" else "make bench"
    if only or cases or args.repeats is not None:
        command = f"python -m benchmarks --plan {plan.name}"
        command += f" --only {','.join(sorted(only))}" if only else ""
        command += f" --case {','.join(sorted(cases))}" if cases else ""
        command += f" --repeats {args.repeats}" if args.repeats is not None else ""
    with acquire(args.work) as target:
        try:
            run(target, plan, args.out, command, only)
        finally:
            stop_everything(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
