"""The budget breaker: at the warn ratio only finalize shards start; at the limit unclaimed shards are
Paused and claimed ones finish; that is Paused, not Failed; raising the limit resumes to the end."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
import yaml
from testbed.bed import Bed
from testbed.kits.scheduler import Seen

from shardops.api.common import JSON
from shardops.k8s.api import SHARDS, Kube

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

FIFO = {"SHARDOPS_CLAIM_CANDIDATES": 1}


def _numbered(items: list[JSON]) -> list[JSON]:
    """Distinct items: equal items share an idempotency key, and their result would be reused."""
    return [{"n": index, **item} for index, item in enumerate(items)]


def _gate_published(events: list[Seen], name: str, condition_type: str) -> dt.datetime | None:
    """When the campaign's status first showed the condition True (watch arrival time)."""
    for seen in events:
        if (
            seen.name == name
            and (found := Bed.condition(seen.obj, condition_type))
            and found["status"] == "True"
        ):
            return seen.wall
    return None


def _claims(kube: Kube, namespace: str, campaign: str) -> list[tuple[dt.datetime, str]]:
    shards = [s for s in kube.list(SHARDS, namespace) if s["spec"]["campaign"] == campaign]
    return sorted(
        (Bed.parse_time(e["at"]), s["metadata"]["name"])
        for s in shards
        for e in Bed.history(s)
        if e["reason"] == "Claimed"
    )


def _shard(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(SHARDS, namespace, name)


def _completed_at(shard: JSON) -> dt.datetime:
    return Bed.parse_time(next(e["at"] for e in Bed.history(shard) if e["reason"] == "Completed"))


def test_budget_warning_then_exhaustion_pause_and_resume(bed: Bed) -> None:
    kube = bed.kube
    fast = {"latency": 0.2}
    finalize = {"image": "shardops:e2e", "command": ["shardops-example-agent"]}
    warn = bed.campaign_body(
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
    stop = bed.campaign_body(
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
        bed.operator(),
        bed.recording("campaigns") as recorded,
    ):
        bed.create_campaign(warn)
        bed.create_campaign(stop)

        # --- warn: shard 1 pushes spend to 83% while running; when it is done, shard 2 must not start.
        bed.wait_for(
            "warn shard 1 done",
            lambda: bed.shard_phase("warn-00001") == "Done",
            timeout=120,
        )
        warned = _gate_published(recorded["campaigns"].events, "warn", "BudgetWarning")
        assert warned is not None
        # Published while shard 1 still ran: the gate was in place before its worker looked for more.
        assert warned < _completed_at(_shard(kube, bed.namespace, "warn-00001"))

        # --- stop: shard 2 passes the limit while shard 3 runs; the rest pause, the two finish.
        bed.wait_for(
            "stop shards 2 and 3 done",
            lambda: all(bed.shard_phase(f"stop-0000{i}") == "Done" for i in (2, 3)),
            timeout=120,
        )
        paused_campaign = bed.wait_phase("stop", {"Paused"}, timeout=60)
        exhausted = _gate_published(recorded["campaigns"].events, "stop", "BudgetExhausted")
        assert exhausted is not None

        # An observation window, not a synchronization: for a few ticks nothing may start in either.
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=bed.HOLD_WINDOW)
        bed.wait_for(
            "the hold window", lambda: dt.datetime.now(dt.UTC) >= deadline, timeout=bed.HOLD_WINDOW + 5
        )
        held_warn = bed.get_campaign("warn")
        held_stop = bed.get_campaign("stop")
        warn_claims = _claims(kube, bed.namespace, "warn")
        stop_claims = _claims(kube, bed.namespace, "stop")

        assert bed.phase_of(_shard(kube, bed.namespace, "warn-00002")) == "Pending"
        assert all(at <= warned + bed.STALE_READ_GRACE for at, _ in warn_claims), (warned, warn_claims)
        assert bed.condition(held_warn, "BudgetWarning")["status"] == "True"
        assert "warn-finalize" not in {s["metadata"]["name"] for s in kube.list(SHARDS, bed.namespace)}

        status = held_stop["status"]
        assert status["phase"] == "Paused" and paused_campaign["status"]["phase"] == "Paused"
        assert bed.condition(held_stop, "BudgetExhausted")["status"] == "True"
        assert status["counts"]["running"] == 0 and status["counts"]["failed"] == 0
        counts = status["counts"]
        assert counts["paused"] >= 1 and counts["paused"] + counts["done"] == counts["materialized"]
        assert all(at <= exhausted + bed.STALE_READ_GRACE for at, _ in stop_claims), (exhausted, stop_claims)
        # Claimed shards finished and their cost was recorded: spend went past the limit, honestly.
        assert status["spent"] == "5.5", status["spent"]
        assert all(
            bed.reasons(_shard(kube, bed.namespace, f"stop-0000{i}"))[-1] == "Completed" for i in (2, 3)
        )
        paused_names = [
            s["metadata"]["name"] for s in kube.list(SHARDS, bed.namespace) if bed.phase_of(s) == "Paused"
        ]
        assert paused_names and all(n.startswith("stop-") for n in paused_names)

        # --- raise the limits: warn runs shard 2 (7 of 8.5 = 82%: warn again) and then its finalize
        # shard, which may start at warn; stop resumes its paused shards and finishes.
        bed.patch_spec("warn", {"budget": {"limit": 8.5, "warnRatio": 0.8}})
        bed.patch_spec("stop", {"budget": {"limit": 100, "warnRatio": 0.8}})
        warn_done = bed.wait_phase("warn", {"Succeeded", "Completed"}, timeout=120)
        stop_done = bed.wait_phase("stop", {"Succeeded", "Completed"}, timeout=120)

    finalize_shard = _shard(kube, bed.namespace, "warn-finalize")
    finalize_claim = bed.parse_time(
        next(e["at"] for e in bed.history(finalize_shard) if e["reason"] == "Claimed")
    )
    assert warn_done["status"]["phase"] == "Succeeded"
    assert bed.condition(warn_done, "BudgetWarning")["status"] == "True"
    assert warn_done["status"]["spent"] == "7"
    assert Decimal(warn_done["status"]["spent"]) >= Decimal("0.8") * Decimal("8.5")
    assert bed.phase_of(finalize_shard) == "Done"
    assert stop_done["status"]["phase"] == "Succeeded"
    assert stop_done["status"]["counts"]["paused"] == 0
    resumed = [n for n in paused_names if "Resumed" in bed.reasons(_shard(kube, bed.namespace, n))]
    assert resumed == paused_names
    print(
        f"\nwarn: BudgetWarning published at {warned:%H:%M:%S.%f}; work claims after it: "
        f"{sum(1 for at, _ in warn_claims if at > warned)}; finalize claimed at "
        f"{finalize_claim:%H:%M:%S.%f} at {warn_done['status']['spent']} of 8.5. "
        f"stop: BudgetExhausted published at {exhausted:%H:%M:%S.%f}; spent {status['spent']} of 4 when "
        f"paused ({len(paused_names)} shard(s) Paused, 2 running finished); "
        f"claims after it: {sum(1 for at, _ in stop_claims if at > exhausted)}"
    )


def test_thirty_costs_of_a_tenth_spend_exactly_three(bed: Bed) -> None:
    """The issue's must-show: 30 one-item shards, each reporting cost 0.1 (a JSON number on the
    results line), and `kubectl get campaigns` shows SPENT 3, not 3.0000000000000004. Limits go in as
    users write them in YAML: a string, a fraction and a whole number."""
    body = bed.campaign_body(
        "tenths",
        [{"n": n} for n in range(30)],
        shardSize=1,
        maxConcurrency=3,
        budget={"limit": "4.5", "maxPerShard": 0.5},
        worker_env={"SHARDOPS_AGENT_COST": 0.1, "SHARDOPS_AGENT_LATENCY": 0.05},
    )
    whole = {**body, "metadata": {"name": "whole"}, "spec": {**body["spec"], "budget": {"limit": 5}}}
    accepted = bed.cluster.kubectl(
        "create", "--dry-run=server", "-n", bed.namespace, "-f", "-", stdin=yaml.safe_dump(whole)
    )
    assert "created (server dry run)" in accepted.stdout
    with bed.operator():
        bed.cluster.kubectl("apply", "-n", bed.namespace, "-f", "-", stdin=yaml.safe_dump(body))
        done = bed.wait_phase("tenths", {"Succeeded", "Failed", "Paused"}, timeout=300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["spent"] == "3"
    assert done["spec"]["budget"] == {"limit": "4.5", "maxPerShard": 0.5, "warnRatio": 0.8}
    shown = bed.cluster.kubectl("get", "campaigns", "tenths", "-n", bed.namespace).stdout.splitlines()
    header, row = shown[0].split(), shown[1].split()
    assert row[header.index("SPENT")] == "3", shown
    print("\nkubectl get campaigns after 30 shards at 0.1 each:\n" + "\n".join(shown))
