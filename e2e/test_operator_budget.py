"""The budget breaker: at the warn ratio only finalize shards start; at the limit unclaimed shards are
Paused and claimed ones finish; that is Paused, not Failed; raising the limit resumes to the end."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    HOLD_WINDOW,
    JSON,
    STALE_READ_GRACE,
    Seen,
    campaign_body,
    condition,
    create_campaign,
    get_campaign,
    history,
    kube_for,
    operator_running,
    parse_time,
    patch_spec,
    phase_of,
    reasons,
    recording,
    shard_phase,
    wait_phase,
)

from shardops.k8s.api import SHARDS, Kube

pytestmark = pytest.mark.usefixtures("crds_installed")

FIFO = {"SHARDOPS_CLAIM_CANDIDATES": 1}


def _numbered(items: list[JSON]) -> list[JSON]:
    """Distinct items: equal items share an idempotency key, and their result would be reused."""
    return [{"n": index, **item} for index, item in enumerate(items)]


def _gate_published(events: list[Seen], name: str, condition_type: str) -> dt.datetime | None:
    """When the campaign's status first showed the condition True (watch arrival time)."""
    for seen in events:
        if seen.name == name and (found := condition(seen.obj, condition_type)) and found["status"] == "True":
            return seen.wall
    return None


def _claims(kube: Kube, namespace: str, campaign: str) -> list[tuple[dt.datetime, str]]:
    shards = [s for s in kube.list(SHARDS, namespace) if s["spec"]["campaign"] == campaign]
    return sorted(
        (parse_time(e["at"]), s["metadata"]["name"])
        for s in shards
        for e in history(s)
        if e["reason"] == "Claimed"
    )


def _shard(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(SHARDS, namespace, name)


def _completed_at(shard: JSON) -> dt.datetime:
    return parse_time(next(e["at"] for e in history(shard) if e["reason"] == "Completed"))


def test_budget_warning_then_exhaustion_pause_and_resume(local_cluster: Cluster, namespace: str) -> None:
    kube = kube_for(local_cluster)
    fast = {"latency": 0.2}
    finalize = {"image": "shardops:e2e", "command": ["shardops-example-agent"]}
    warn = campaign_body(
        "warn",
        _numbered(
            [
                {"cost": 1, **fast},  # shard 0: spent 2 of 6
                {"cost": 1, **fast},
                {"cost": 3, **fast},  # shard 1: 5 of 6 (83%) while it still runs
                {"cost": 0, "latency": 6},
                {"cost": 1, **fast},  # shard 2: must not start at warn
                {"cost": 1, **fast},
            ]
        ),
        shardSize=2,
        maxConcurrency=1,
        budget={"limit": 6, "warnRatio": 0.8},
        finalize=finalize,
        worker_env=FIFO,
    )
    stop = campaign_body(
        "stop",
        _numbered(
            [
                {"cost": 1, **fast},  # shard 0
                {"cost": 0, **fast},
                {"cost": 0, **fast},  # shard 1
                {"cost": 0, **fast},
                {"cost": 4, **fast},  # shard 2: passes the limit of 4 while it still runs
                {"cost": 0, "latency": 6},
                {"cost": 0.5, **fast},  # shard 3: runs alongside, must finish and be counted
                {"cost": 0, "latency": 6},
                *({"cost": 0.25, **fast} for _ in range(8)),  # shards 4-7: unclaimed at the limit
            ]
        ),
        shardSize=2,
        maxConcurrency=2,
        budget={"limit": 4, "warnRatio": 0.8},
        worker_env=FIFO,
    )
    with (
        operator_running(local_cluster, namespace),
        recording(local_cluster, namespace, "campaigns") as recorded,
    ):
        create_campaign(kube, namespace, warn)
        create_campaign(kube, namespace, stop)

        # --- warn: shard 1 pushes spend to 83% while running; when it is done, shard 2 must not start.
        wait_for(
            "warn shard 1 done",
            lambda: shard_phase(kube, namespace, "warn-00001") == "Done",
            timeout=120,
        )
        warned = _gate_published(recorded["campaigns"].events, "warn", "BudgetWarning")
        assert warned is not None
        # Published while shard 1 still ran: the gate was in place before its worker looked for more.
        assert warned < _completed_at(_shard(kube, namespace, "warn-00001"))

        # --- stop: shard 2 passes the limit while shard 3 runs; the rest pause, the two finish.
        wait_for(
            "stop shards 2 and 3 done",
            lambda: all(shard_phase(kube, namespace, f"stop-0000{i}") == "Done" for i in (2, 3)),
            timeout=120,
        )
        paused_campaign = wait_phase(kube, namespace, "stop", {"Paused"}, timeout=60)
        exhausted = _gate_published(recorded["campaigns"].events, "stop", "BudgetExhausted")
        assert exhausted is not None

        # An observation window, not a synchronization: for a few ticks nothing may start in either.
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=HOLD_WINDOW)
        wait_for("the hold window", lambda: dt.datetime.now(dt.UTC) >= deadline, timeout=HOLD_WINDOW + 5)
        held_warn = get_campaign(kube, namespace, "warn")
        held_stop = get_campaign(kube, namespace, "stop")
        warn_claims = _claims(kube, namespace, "warn")
        stop_claims = _claims(kube, namespace, "stop")

        assert phase_of(_shard(kube, namespace, "warn-00002")) == "Pending"
        assert all(at <= warned + STALE_READ_GRACE for at, _ in warn_claims), (warned, warn_claims)
        assert condition(held_warn, "BudgetWarning")["status"] == "True"
        assert "warn-finalize" not in {s["metadata"]["name"] for s in kube.list(SHARDS, namespace)}

        status = held_stop["status"]
        assert status["phase"] == "Paused" and paused_campaign["status"]["phase"] == "Paused"
        assert condition(held_stop, "BudgetExhausted")["status"] == "True"
        assert status["counts"]["running"] == 0 and status["counts"]["failed"] == 0
        counts = status["counts"]
        assert counts["paused"] >= 1 and counts["paused"] + counts["done"] == counts["materialized"]
        assert all(at <= exhausted + STALE_READ_GRACE for at, _ in stop_claims), (exhausted, stop_claims)
        # Claimed shards finished and their cost was recorded: spend went past the limit, honestly.
        assert math.isclose(status["spent"], 1 + 4 + 0.5), status["spent"]
        assert all(reasons(_shard(kube, namespace, f"stop-0000{i}"))[-1] == "Completed" for i in (2, 3))
        paused_names = [
            s["metadata"]["name"] for s in kube.list(SHARDS, namespace) if phase_of(s) == "Paused"
        ]
        assert paused_names and all(n.startswith("stop-") for n in paused_names)

        # --- raise the limits: warn runs shard 2 (7 of 8.5 = 82%: warn again) and then its finalize
        # shard, which may start at warn; stop resumes its paused shards and finishes.
        patch_spec(kube, namespace, "warn", {"budget": {"limit": 8.5, "warnRatio": 0.8}})
        patch_spec(kube, namespace, "stop", {"budget": {"limit": 100, "warnRatio": 0.8}})
        warn_done = wait_phase(kube, namespace, "warn", {"Succeeded", "Completed"}, timeout=120)
        stop_done = wait_phase(kube, namespace, "stop", {"Succeeded", "Completed"}, timeout=120)

    finalize_shard = _shard(kube, namespace, "warn-finalize")
    finalize_claim = parse_time(next(e["at"] for e in history(finalize_shard) if e["reason"] == "Claimed"))
    assert warn_done["status"]["phase"] == "Succeeded"
    assert condition(warn_done, "BudgetWarning")["status"] == "True"
    assert math.isclose(warn_done["status"]["spent"], 7)
    assert warn_done["status"]["spent"] >= 0.8 * 8.5
    assert phase_of(finalize_shard) == "Done"
    assert stop_done["status"]["phase"] == "Succeeded"
    assert stop_done["status"]["counts"]["paused"] == 0
    resumed = [n for n in paused_names if "Resumed" in reasons(_shard(kube, namespace, n))]
    assert resumed == paused_names
    print(
        f"\nwarn: BudgetWarning published at {warned:%H:%M:%S.%f}; work claims after it: "
        f"{sum(1 for at, _ in warn_claims if at > warned)}; finalize claimed at "
        f"{finalize_claim:%H:%M:%S.%f} at {warn_done['status']['spent']:g} of 8.5. "
        f"stop: BudgetExhausted published at {exhausted:%H:%M:%S.%f}; spent {status['spent']:g} of 4 when "
        f"paused ({len(paused_names)} shard(s) Paused, 2 running finished); "
        f"claims after it: {sum(1 for at, _ in stop_claims if at > exhausted)}"
    )
