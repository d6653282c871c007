"""Fault scenarios: a campaign runs while faults are injected, its whole history is read back from the
API server's audit log and checked offline (e2e/faults/checker.py). Each scenario adds a row to the
results table (docs/faults.md says what each column counts).

Two sizes: `short` (the default, part of `make test`: a few operator kills and worker kills) and
`full` (`make faults`, SHARDOPS_FAULTS=full: ≥ 20 operator kills in one campaign, worker kills,
several stale writers at once, and the frozen-worker scenario 20 times in a row). `make faults`
writes the table to SHARDOPS_FAULTS_TABLE (docs/faults-results.md)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import lifecycle
from e2e.faults import checker, inject
from e2e.faults.history import History
from e2e.faults.recording import AuditTail
from e2e.harness import Cluster, wait_for
from e2e.schedulerkit import (
    LEADER_LEASE,
    Operator,
    campaign_body,
    continue_group,
    create_campaign,
    kill_group,
    kube_for,
    operator_running,
    s3_store_env,
    stop_group,
    wait_phase,
)
from e2e.test_fault_history import IDENTITIES
from shardops.api.names import LEADER_INSTANCE_ANNOTATION
from shardops.k8s.api import Kube

pytestmark = pytest.mark.usefixtures("crds_installed")

FULL = os.environ.get("SHARDOPS_FAULTS", "short") == "full"
TABLE = os.environ.get("SHARDOPS_FAULTS_TABLE")
FROZEN_REPEATS = 20 if FULL else 0
# Which invariants each column of the table counts (the rest count under "violations" only).
LOST = {"no-shard-lost"}
DUPLICATES = {"one-done", "fencing"}
LIVE_CLAIMS = {"no-live-claim-taken", "one-holder-at-a-time"}
WRONG_CHARGES = {"attempt-charged-rightly", "attempts-monotonic", "attempts-bounded"}


@dataclass
class Row:
    scenario: str
    faults: str
    shards: int = 0
    violations: list[checker.Violation] = field(default_factory=list)
    recovery: str = "—"
    took: float = 0.0

    def count(self, invariants: set[str]) -> int:
        return sum(v.invariant in invariants for v in self.violations)

    def markdown(self) -> str:
        cells = [
            self.scenario,
            self.faults,
            str(self.shards),
            str(self.count(LOST)),
            str(self.count(DUPLICATES)),
            str(self.count(LIVE_CLAIMS)),
            str(self.count(WRONG_CHARGES)),
            str(len(self.violations)),
            self.recovery,
            f"{self.took:.0f} s",
        ]
        return "| " + " | ".join(cells) + " |"


HEADER = (
    "| scenario | faults injected | shards | lost | duplicate results | live claims taken "
    "| attempts charged wrongly | invariant violations | recovery | took |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)
ROWS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def results_table() -> Iterator[None]:
    yield
    if TABLE and ROWS:
        when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        load = os.getloadavg()[0]
        lines = [
            "# Fault scenarios: results",
            "",
            f"`make faults` on {when} (load average {load:.1f} at the end). Each row: a campaign run while",
            "the faults were injected, its history checked by `e2e/faults/checker.py` (docs/faults.md).",
            "",
            HEADER,
            *(row.markdown() for row in ROWS),
            "",
        ]
        violations = [f"* {row.scenario}: {v}" for row in ROWS for v in row.violations]
        if violations:
            lines += ["## Violations", "", *violations, ""]
        Path(TABLE).write_text("\n".join(lines))


def _check(row: Row, audit_tail: AuditTail, namespace: str) -> Counter[str]:
    history = audit_tail.history(namespace)
    tally: Counter[str] = Counter()
    row.violations = checker.check(history, IDENTITIES, tally)
    row.shards = len(history.shards)
    ROWS.append(row)
    print(f"\n{row.markdown()}\n  checked: " + ", ".join(f"{k} {n}" for k, n in sorted(tally.items())))
    for violation in row.violations:
        print(f"  {violation}")
    return tally


def _campaign(
    name: str, items: int, concurrency: int, latency: float, lease_seconds: int = 10
) -> dict[str, Any]:
    return campaign_body(
        name,
        [{"n": i, "latency": latency} for i in range(items)],
        shardSize=1,
        maxConcurrency=concurrency,
        leaseSeconds=lease_seconds,
    )


def _finished(kube: Kube, cluster: Cluster, namespace: str, name: str, timeout: float) -> None:
    wait_phase(kube, namespace, name, {"Succeeded", "Completed"}, timeout=timeout)
    wait_for("every worker to exit", lambda: not inject.worker_pids(cluster, namespace, name), 120)


def _leader_instance(operator: Operator) -> str | None:
    lease = operator.lease() or {}
    return ((lease.get("metadata") or {}).get("annotations") or {}).get(LEADER_INSTANCE_ANNOTATION)


def _container_started(operator: Operator) -> float | None:
    """When the operator container's current process started (the pod status, 1 s resolution)."""
    for pod in operator.pods():
        for status in pod.status.container_statuses or []:
            if status.state and status.state.running and status.state.running.started_at:
                started: dt.datetime = status.state.running.started_at
                return started.timestamp()
    return None


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s (max {max(values):.1f} s)" if values else "—"


@pytest.mark.long
def test_operator_sigkilled_again_and_again_loses_nothing(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    kills = 20 if FULL else 3
    namespace, kube = history_namespace, kube_for(local_cluster)
    rng = random.Random(13)
    env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    # Long enough to outlast the kills (the restarts' back-off, as the kubelet's, grows to 30 s).
    body = _campaign("kills", 600 if FULL else 60, 6, 1.0)
    started = time.monotonic()
    restart_to_lead: list[float] = []
    with operator_running(local_cluster, namespace, env=env) as operator:
        create_campaign(kube, namespace, body)
        for _ in range(kills):
            before = wait_for("the operator to lead", lambda: _leader_instance(operator), 90)
            time.sleep(rng.uniform(1.0, 4.0))  # a random moment of its work, not a synchronization
            (pid,) = operator.running_pids().values()
            kill_group(pid)

            def new_leader(before: str = before) -> str | None:
                now = _leader_instance(operator)
                return now if now and now != before else None

            instance = wait_for("the restarted operator to lead", new_leader, 120, interval=0.1)
            led = time.time()
            began = _container_started(operator)
            assert instance and began is not None
            restart_to_lead.append(led - began)
        _finished(kube, local_cluster, namespace, "kills", 900)
    row = Row(
        "operator SIGKILLed",
        f"{kills} kills",
        recovery=f"process start → leading: {_median(restart_to_lead)}",
    )
    row.took = time.monotonic() - started
    _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))


@pytest.mark.long
def test_workers_sigkilled_at_random_lose_nothing(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    kills = 10 if FULL else 2
    namespace, kube = history_namespace, kube_for(local_cluster)
    rng = random.Random(11)
    env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    body = _campaign("workerkills", 300 if FULL else 40, 8, 1.0)
    started = time.monotonic()
    with operator_running(local_cluster, namespace, env=env):
        create_campaign(kube, namespace, body)
        for _ in range(kills):
            held = wait_for(
                "a worker holding a shard",
                lambda: inject.held_shards(kube, local_cluster, namespace, "workerkills") or None,
                120,
                interval=0.2,
            )
            _, _, pid = rng.choice(held)
            kill_group(pid)
            time.sleep(rng.uniform(0.5, 2.0))  # a random moment for the next kill
        _finished(kube, local_cluster, namespace, "workerkills", 600)
    row = Row("workers SIGKILLed", f"{kills} kills of a worker holding a shard")
    row.took = time.monotonic() - started
    tally = _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))
    assert tally["lost-holder charges"] >= 1, tally  # the faults were exercised


@pytest.mark.long
def test_clocks_thirty_seconds_apart_take_no_live_claim(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    """The operator's clock 30 s ahead, each worker's off by its own random amount within ±30 s,
    leaseSeconds 30 and heartbeatSeconds 10 (the allowed extreme): every claim outlives several
    heartbeats, and workers are killed so that expiry is judged under skew too. Judged by holders'
    timestamps, the operator would reclaim each live claim seconds after it was renewed."""
    kills = 3 if FULL else 1
    namespace, kube = history_namespace, kube_for(local_cluster)
    rng = random.Random(17)
    env = {
        **s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}"),
        "SHARDOPS_CLOCK_OFFSET_SECONDS": "30",
    }
    items = 120 if FULL else 16
    body = campaign_body(
        "skew",
        [{"n": i, "latency": 12.0} for i in range(items)],
        shardSize=1,
        maxConcurrency=8,
        leaseSeconds=30,
        heartbeatSeconds=10,
        worker_env={"SHARDOPS_CLOCK_OFFSET_SPREAD_SECONDS": "30"},
    )
    started = time.monotonic()
    with operator_running(local_cluster, namespace, env=env):
        create_campaign(kube, namespace, body)
        for _ in range(kills):
            held = wait_for(
                "a worker holding a shard",
                lambda: inject.held_shards(kube, local_cluster, namespace, "skew") or None,
                120,
                interval=0.2,
            )
            _, _, pid = rng.choice(held)
            kill_group(pid)
            time.sleep(rng.uniform(2.0, 6.0))  # a random moment for the next kill
        _finished(kube, local_cluster, namespace, "skew", 900)
    row = Row(
        "clock skew",
        f"operator +30 s, workers ±30 s at random; {kills} worker kill(s); leaseSeconds 30",
    )
    row.took = time.monotonic() - started
    tally = _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))
    assert tally["lost-holder charges"] >= 1, tally  # expiry was judged under skew
    assert tally["lease renewals"] >= items, tally  # claims lived through heartbeats


def _standby_competes(operator: Operator, leader: str, paused: set[int]) -> bool:
    """Every replica but `leader` runs a process that has started its leader election — not one
    paused before (resumed, it finds it lost the Lease and exits) —: its log has one "competes
    for Lease" line per container it ran."""
    pids = operator.running_pids()
    for pod in operator.pods():
        name = pod.metadata.name
        if name == leader:
            continue
        if name not in pids or pids[name] in paused:
            return False
        try:
            os.kill(pids[name], 0)
        except ProcessLookupError:
            return False  # the kubelet's status still names the exited process
        restarts = sum(s.restart_count for s in pod.status.container_statuses or [])
        if operator.log(name).count("competes for Lease") < restarts + 1:
            return False
    return len(pids) == 2


def _leader_takeover_gaps(history: History, lease_name: str) -> list[float]:
    """For each change of holder of the leader Lease: seconds (server time) from the old holder's last
    write of it to the new holder's first — how long the replicas were without a leader."""
    gaps: list[float] = []
    for key, versions in history.leases.items():
        if key[1] != lease_name:
            continue
        stored = [v for v in versions if not v.deleted]
        for before, after in itertools.pairwise(stored):
            if before.holder and after.holder and before.holder != after.holder:
                gaps.append((after.write.stage - before.write.stage).total_seconds())
    return gaps


@pytest.mark.skipif(not FULL, reason="make faults (SHARDOPS_FAULTS=full)")
def test_a_leader_paused_past_its_lease_and_resumed_writes_nothing(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    """A forced split brain, three times: the leading replica SIGSTOPped past its leader lease (10 s)
    while the campaign runs, the standby takes over, then the old leader is resumed. Whatever it
    had in flight must be refused or never sent (`operator-writes-while-leading`)."""
    pauses = 3
    namespace, kube = history_namespace, kube_for(local_cluster)
    env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    started = time.monotonic()
    failovers: list[float] = []
    paused: set[int] = set()
    with operator_running(local_cluster, namespace, replicas=2, lease_seconds=10, env=env) as operator:
        wait_for("two operator replicas running", lambda: len(operator.running_pids()) == 2, timeout=90)
        create_campaign(kube, namespace, _campaign("splitbrain", 200, 8, 1.0))
        for _ in range(pauses):
            leader = wait_for("a leader", operator.leader, 60)
            # The paused one of the last round exits once resumed, and its container restarts after the
            # kubelet's back-off: pause the leader only once the other replica competes again.
            wait_for(
                "the standby to compete",
                lambda leader=leader: _standby_competes(operator, leader, paused),
                120,
            )
            pids = operator.running_pids()
            paused.add(pids[leader])
            paused_at = time.monotonic()
            stop_group(pids[leader])

            def other_leads(leader: str = leader) -> str | None:
                now = operator.leader()
                return now if now and now != leader else None

            try:
                wait_for("the standby to take over", other_leads, 60, interval=0.1)
                failovers.append(time.monotonic() - paused_at)
                time.sleep(3.0)  # the new leader at work while the old one is still paused
            finally:
                continue_group(pids[leader])
        _finished(kube, local_cluster, namespace, "splitbrain", 900)
    gaps = _leader_takeover_gaps(audit_tail.history(namespace), LEADER_LEASE)
    row = Row(
        "split brain",
        f"{pauses} pauses of the leading replica past its 10 s leader lease, then resumed (2 replicas)",
        recovery=f"pause → standby leading: {_median(failovers)}; old leader's last renewal → "
        f"takeover: {_median(gaps)}",
    )
    row.took = time.monotonic() - started
    tally = _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))
    assert tally["operator writes"] > 0, tally


def _freeze_and_thaw(
    cluster: Cluster, kube: Kube, namespace: str, campaign: str, how_many: int, frozen_for: float
) -> list[str]:
    """SIGSTOP `how_many` workers that hold a shard at once, for `frozen_for` seconds (past their
    leases), then SIGCONT them: stale writers. The owners frozen."""

    def held() -> list[tuple[str, str, int]] | None:
        found = inject.held_shards(kube, cluster, namespace, campaign)
        return found if len({pid for *_, pid in found}) >= how_many else None

    found = wait_for(f"{how_many} workers holding shards", held, 120, interval=0.2)
    frozen: dict[int, str] = {}
    for _, owner, pid in found:
        if pid not in frozen and len(frozen) < how_many:
            frozen[pid] = owner
    for pid in frozen:
        stop_group(pid)
    try:
        # The leases run out while the workers stay frozen: a clock, not a synchronization.
        time.sleep(frozen_for)
    finally:
        for pid in frozen:
            continue_group(pid)
    return list(frozen.values())


@pytest.mark.skipif(not FULL, reason="make faults (SHARDOPS_FAULTS=full)")
def test_several_stale_writers_at_once_are_fenced(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    namespace, kube = history_namespace, kube_for(local_cluster)
    env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    started = time.monotonic()
    with operator_running(local_cluster, namespace, env=env):
        create_campaign(kube, namespace, _campaign("stale", 150, 12, 2.0))
        owners = _freeze_and_thaw(local_cluster, kube, namespace, "stale", 3, 22.0)
        _finished(kube, local_cluster, namespace, "stale", 600)
    row = Row("stale writers", f"{len(owners)} workers SIGSTOPped 22 s past their 10 s leases, resumed")
    row.took = time.monotonic() - started
    tally = _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))
    assert tally["lost-holder charges"] >= len(owners), tally


@pytest.mark.skipif(not FULL, reason="make faults (SHARDOPS_FAULTS=full)")
@pytest.mark.parametrize("run", range(1, FROZEN_REPEATS + 1))
def test_one_worker_frozen_past_its_lease_among_twelve(
    run: int,
    local_cluster: Cluster,
    history_namespace: str,
    object_store: lifecycle.ObjectStore,
    audit_tail: AuditTail,
) -> None:
    """The run that found the lease-sweep defect: 150 one-item shards, maxConcurrency 12,
    leaseSeconds 10, one worker SIGSTOPped for 22 s while it held an item, then resumed."""
    namespace, kube = history_namespace, kube_for(local_cluster)
    env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    started = time.monotonic()
    with operator_running(local_cluster, namespace, env=env):
        create_campaign(kube, namespace, _campaign("frozen", 150, 12, 2.0))
        _freeze_and_thaw(local_cluster, kube, namespace, "frozen", 1, 22.0)
        _finished(kube, local_cluster, namespace, "frozen", 600)
    row = Row(f"one frozen worker among 12, run {run} of {FROZEN_REPEATS}", "1 worker SIGSTOPped 22 s")
    row.took = time.monotonic() - started
    tally = _check(row, audit_tail, namespace)
    assert not row.violations, "\n".join(map(str, row.violations))
    assert tally["lost-holder charges"] >= 1, tally
