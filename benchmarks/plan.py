"""The sizes and time budgets of a benchmark run: the full set (`make bench`), the quick set
(`BENCH_QUICK=1 make bench`) and the smoke set (e2e/test_bench_smoke.py, inside `make test`).

Budgets are per run. A run that reaches its budget is stopped and reported with what it completed
(and marked as missing its target), so the whole set stays inside its time even while shardops is
slow: the full set is sized to end within 90 minutes (its two scale runs, 10,000 shards each, take
most of it), the quick one within 10. The full set's million-item run does not fit its 90 minutes:
it runs only when asked for (`--only million`, `--case 1m`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Versus:
    """shardops against an Indexed Job with the same completions, parallelism and per-item work."""

    key: str
    label: str
    shards: int
    work_seconds: float
    max_concurrency: int
    repeats: int
    budget: float
    heartbeat_seconds: int | None = None


@dataclass(frozen=True)
class Scale:
    key: str
    label: str
    items: int
    shard_size: int
    max_concurrency: int
    budget: float


@dataclass(frozen=True)
class Failing:
    """A scale run in which one shard in `fail_every` fails non-retryably (its first item is invalid
    input): the window bound and the Campaign object's size while the failures are folded."""

    key: str
    label: str
    items: int
    shard_size: int
    max_concurrency: int
    fail_every: int
    budget: float


@dataclass(frozen=True)
class Plan:
    name: str
    physical_seconds: float
    physical_repeats: int
    physical_processes: int
    physical_threads: int
    versus: tuple[Versus, ...]
    zombie_repeats: int
    zombie_lease_seconds: int
    restart_repeats: int
    failover_repeats: int
    many_campaigns: int
    many_shards_each: int
    many_concurrency_each: int
    many_budget: float
    scale: tuple[Scale, ...]
    # A scale run gets at least this long even when the deadline is near (the many-campaigns runs
    # after it shrink instead): shorter, it would show only the ramp-up.
    scale_min_budget: float
    # After the scale curve; each gets at least scale_min_budget too.
    failing: tuple[Failing, ...]
    # A million items end to end (scenarios/million.py), after the others. When `million_on_request`,
    # it runs only when asked for (`--only million` or its case named in `--case`): its run is longer
    # than the rest of the set's time budget leaves.
    million: tuple[Scale, ...]
    million_on_request: bool
    profile_seconds: float
    # When the profiles start: a worker's into the first zero-work run, the operator's into the
    # first scale run (once it has shards to look at).
    worker_profile_delay: float
    operator_profile_delay: float
    sample_every: float
    cleanup_timeout: float
    # Whether a run waits for the garbage collector to remove the previous run's Shards and a Job's
    # pods (a quiet start), or only for the previous campaign's worker Jobs (their processes).
    wait_for_garbage: bool
    # The whole run stops starting new sections after this many seconds.
    deadline: float

    @property
    def description(self) -> str:
        return {
            "full": "the full set",
            "quick": "the QUICK set: reduced sizes, a rehearsal of the full set (`make bench`), whose "
            "figures for the scale targets it does not replace",
            "smoke": "the smoke set (e2e/test_bench_smoke.py): tiny sizes, proves the harness works",
        }[self.name]


FULL = Plan(
    name="full",
    physical_seconds=20,
    physical_repeats=3,
    physical_processes=2,
    physical_threads=8,
    versus=(
        Versus("zero", "1,000 one-item shards, zero work", 1000, 0.0, 20, 1, 360),
        Versus("1s", "200 shards of 1 s work", 200, 1.0, 20, 3, 100),
        Versus("5s", "100 shards of 5 s work (heartbeat 2 s)", 100, 5.0, 20, 3, 100, heartbeat_seconds=2),
    ),
    zombie_repeats=3,
    zombie_lease_seconds=10,
    restart_repeats=3,
    failover_repeats=3,
    many_campaigns=10,
    many_shards_each=200,
    many_concurrency_each=2,
    many_budget=150,
    scale=(
        # Long enough for the whole campaign: the decile figures compare the last tenth with the
        # first, which a run stopped at its budget never reaches. 10,000 inline items make a Campaign
        # of ~130 KB that every status write sends whole; this case ran at ~6.8 shards/s (1,475 s).
        Scale("10k", "10,000 one-item shards", 10000, 1, 20, 1800),
        Scale("100k", "100,000 items at shardSize 10", 100000, 10, 20, 1200),
    ),
    scale_min_budget=120,
    failing=(
        # 5,000 shards of 100 items, 500 of them Failed: issue 31's must-show. Its items are an
        # object in the S3 store (a ConfigMap holds at most 100,000 items).
        Failing("500k-failing", "500,000 items at shardSize 100, 10 % failing", 500000, 100, 20, 10, 1500),
    ),
    # shardSize 200: 5,000 shards, the number the 500,000-item failing run (5,000 shards, ~1,100 s)
    # showed one operator and this API server carry. What a shard costs is fixed: ~7.4 API writes
    # (claim, Lease, Done, fold; the 20,000-item run) and a few seconds of its slot on this machine,
    # where 200 zero-work items cost the agent milliseconds and one result object of ~35 KiB. A
    # larger shard spends less per item on the API, but 200 items of real work (seconds each) already
    # make a shard of minutes, which a crash or a retry repeats whole. Estimated from the 20,000-item
    # run (~1,000 items/s once running): ~1,100 s; the budget stops a run 3x slower than that.
    million=(Scale("1m", "1,000,000 items at shardSize 200 (5,000 shards)", 1000000, 200, 20, 3600),),
    million_on_request=True,
    profile_seconds=30,
    worker_profile_delay=8,
    operator_profile_delay=60,
    sample_every=3.0,
    cleanup_timeout=120,
    wait_for_garbage=True,
    deadline=90 * 60,
)

QUICK = Plan(
    name="quick",
    physical_seconds=3,
    physical_repeats=3,
    physical_processes=2,
    physical_threads=8,
    versus=(
        Versus("zero", "12 one-item shards, zero work", 12, 0.0, 6, 3, 60),
        Versus("1s", "12 shards of 1 s work", 12, 1.0, 6, 3, 60),
        Versus("5s", "12 shards of 5 s work (heartbeat 2 s)", 12, 5.0, 6, 3, 60, heartbeat_seconds=2),
    ),
    zombie_repeats=3,
    zombie_lease_seconds=10,
    restart_repeats=3,
    failover_repeats=3,
    many_campaigns=3,
    many_shards_each=8,
    many_concurrency_each=2,
    many_budget=15,
    scale=(
        Scale("800", "800 one-item shards (full set: 10,000)", 800, 1, 20, 50),
        Scale("5k-items", "5,000 items at shardSize 10 (full set: 100,000)", 5000, 10, 20, 50),
    ),
    scale_min_budget=40,
    failing=(
        Failing(
            "2k-failing",
            "2,000 items at shardSize 10, 10 % failing (full set: 500,000 at 100)",
            2000,
            10,
            20,
            10,
            60,
        ),
    ),
    # The million-item run's code at a size the quick set's time holds: 100 shards of 200 items.
    million=(
        Scale("20k", "20,000 items at shardSize 200 (full set: 1,000,000, on request)", 20000, 200, 20, 90),
    ),
    million_on_request=False,
    profile_seconds=10,
    worker_profile_delay=3,
    operator_profile_delay=15,
    sample_every=2.0,
    cleanup_timeout=40,
    wait_for_garbage=False,
    deadline=8.5 * 60,
)

SMOKE = Plan(
    name="smoke",
    physical_seconds=1,
    physical_repeats=3,
    physical_processes=1,
    physical_threads=2,
    versus=(Versus("zero", "3 one-item shards, zero work", 3, 0.0, 3, 1, 40),),
    zombie_repeats=0,
    zombie_lease_seconds=10,
    restart_repeats=0,
    failover_repeats=0,
    many_campaigns=0,
    many_shards_each=0,
    many_concurrency_each=1,
    many_budget=0,
    scale=(Scale("tiny", "20 items at shardSize 10", 20, 10, 2, 30),),
    scale_min_budget=10,
    failing=(
        Failing("tiny-failing", "100 items at shardSize 10, 1 shard in 10 failing", 100, 10, 2, 10, 40),
    ),
    million=(),
    million_on_request=False,
    profile_seconds=1,
    worker_profile_delay=1,
    operator_profile_delay=0,
    sample_every=1.0,
    cleanup_timeout=30,
    wait_for_garbage=False,
    # Its test (e2e/test_bench_smoke.py) asserts that every section ran and the scale run finished:
    # a deadline near the smoke's own length (40-50 s) would skip the last sections and cut the
    # scale run's budget to scale_min_budget whenever the machine is slow or shared, so the test
    # would pass or fail on time. Its runs are tiny and end when done: this only bounds a hang.
    deadline=300,
)

PLANS = {plan.name: plan for plan in (FULL, QUICK, SMOKE)}


def narrowed(plan: Plan, cases: frozenset[str], repeats: int | None) -> Plan:
    """`plan` with only the cases named in `cases`: each of the versus, scale and failing sections keeps the
    ones of its own it names (all of them when it names none), and the versus cases are repeated
    `repeats` times when given. A quick look at one case, its figures read as the full set's are:
    `python -m benchmarks --only versus --case 1s --repeats 5`, `--only scale --case 100k`,
    `--only failing --case 500k-failing`, `--only million --case 1m`."""
    failing_keys = {case.key for case in plan.failing}
    million_keys = {case.key for case in plan.million}
    unknown = (
        cases
        - {case.key for case in plan.versus}
        - {case.key for case in plan.scale}
        - failing_keys
        - million_keys
    )
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(sorted(unknown))} of the {plan.name} set")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    named_versus = cases & {case.key for case in plan.versus}
    named_scale = cases & {case.key for case in plan.scale}
    versus = tuple(
        replace(case, repeats=repeats if repeats is not None else case.repeats)
        for case in plan.versus
        if not named_versus or case.key in named_versus
    )
    scale = tuple(case for case in plan.scale if not named_scale or case.key in named_scale)
    named_failing = cases & failing_keys
    failing = tuple(case for case in plan.failing if not named_failing or case.key in named_failing)
    named_million = cases & million_keys
    million = tuple(case for case in plan.million if not named_million or case.key in named_million)
    # Naming the million-item case asks for it.
    on_request = plan.million_on_request and not named_million
    return replace(
        plan, versus=versus, scale=scale, failing=failing, million=million, million_on_request=on_request
    )
