"""`kubectl campaign plan` plans with the operator's code: `operator.observe` builds the planner inputs
from live objects exactly as the reconcile does, and the plan view reports what the planner says."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from shardops.api.campaign import Campaign
from shardops.api.sources import Source
from shardops.cli.campaign_plan import _jobs_text, plan_view, render_plan
from shardops.cli.campaign_summary import parse_shards
from shardops.cli.text import NONE
from shardops.logic.breaker import BreakerPolicy
from shardops.logic.planner import LimitReason, plan_dispatch
from shardops.logic.queues import QueueState
from shardops.logic.transitions import Action
from shardops.scheduler import reconcile
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.observed import Observed
from shardops.scheduler.settings import OperatorSettings
from shardops.state import breakers, observe
from tests.clikit import NOW, campaign_body, history, shard_body, t

SOURCES = [{"name": "large", "fallback": "small", "cooldownSeconds": 600}, {"name": "small"}]


def _scenario() -> tuple[Campaign, list[Any], list[dict], list[dict]]:
    """A campaign mid-run: budget near warn, a tripped breaker in status plus unfolded failures,
    backoff, running shards, worker Jobs and a stuck pod."""
    status = {
        "spent": 0.7,
        "historyFoldedUntil": t(500),
        "breakers": [{"source": "small", "state": "Closed", "consecutiveFailures": 1}],
    }
    campaign = Campaign.parse(
        campaign_body(
            items=30,
            shard_size=2,
            maxConcurrency=3,
            backlogRatio=2,
            sources=SOURCES,
            defaultSource="large",
            budget={"limit": 1.0, "warnRatio": 0.9},
            status=status,
        )
    )
    rate_limited = {"source": "large", "errorClass": "rate-limited"}
    bodies = [
        shard_body("papers", 0, "Done", source="large", status={"cost": 0.3}),
        shard_body(
            "papers",
            1,
            "Pending",
            attempt=3,
            source="large",
            status={
                "history": history(
                    *(("Pending", "AttemptFailed", 100 - i, i + 1, rate_limited) for i in range(3))
                )
            },
        ),
        shard_body("papers", 2, "Running", source="small", status={"cost": 0.2, "source": "small"}),
        shard_body("papers", 3, "Pending", source="small", status={"notBefore": t(-30)}),
        shard_body("papers", 4, "Pending", source="small"),
        shard_body("papers", 5, "Pending", source="small"),
        shard_body("papers", 6, "Queued", source="small"),
    ]
    shards = parse_shards(bodies)
    job = {"metadata": {"name": "j1"}, "status": {}}
    pods = [
        {"metadata": {"name": "p1", "creationTimestamp": t(10)}, "status": {"phase": "Running"}},
        {"metadata": {"name": "p2", "creationTimestamp": t(1000)}, "status": {"phase": "Pending"}},
    ]
    return campaign, shards, [job], pods


def test_observe_builds_exactly_the_reconciles_planner_inputs() -> None:
    """The reconcile plans through `Dispatcher.plan`; given the same objects and breaker fold, the
    plan from `observe.dispatch_inputs` is identical. A drift between the two fails here."""
    campaign, shards, jobs, pods = _scenario()
    settings = OperatorSettings(identity="test", leader_election=False, worker_pending_grace_seconds=120)
    reconciler = reconcile.Reconciler(object(), settings, Metrics(), clock=lambda: NOW)  # type: ignore[arg-type]
    seen = Observed(
        body=campaign.to_dict(),
        campaign=campaign,
        items=list(campaign.spec.items or []),
        shards={s.name: s for s in shards},
        jobs=jobs,
        pods=pods,
    )
    states = observe.breaker_states(campaign, shards)
    theirs = reconciler.dispatch.plan(seen, states, NOW)
    ours = plan_dispatch(observe.dispatch_inputs(campaign, shards, jobs, pods, NOW, items_total=30))
    assert ours.as_dict() == theirs.as_dict()
    # The scenario is not trivial: several limits and skip reasons are in play.
    assert len(ours.limits) >= 2 and ours.skipped


def test_an_undeclared_source_breaks_like_a_declared_one_with_the_api_defaults() -> None:
    campaign, _, _, _ = _scenario()
    declared = campaign.spec.model_copy(update={"sources": [Source(name="plain")]})
    assert breakers.breaker_policies(declared)["plain"] == breakers.UNDECLARED_SOURCE_POLICY
    assert breakers.breaker_policy(campaign.spec, "nowhere-declared") == breakers.UNDECLARED_SOURCE_POLICY
    assert breakers.cooldown_of(campaign.spec, "nowhere-declared") == dt.timedelta(
        seconds=Source.model_fields["cooldown_seconds"].default
    )


def test_the_plan_and_the_operator_agree_on_the_default_pending_grace() -> None:
    """A pod Pending just under the operator's default grace is not stuck for either of them."""
    campaign, shards, jobs, pods = _scenario()
    grace = OperatorSettings(identity="t", leader_election=False).worker_pending_grace_seconds
    young = {"metadata": {"name": "p3", "creationTimestamp": t(grace - 1)}, "status": {"phase": "Pending"}}
    old = {"metadata": {"name": "p4", "creationTimestamp": t(grace + 1)}, "status": {"phase": "Pending"}}
    for pod, stuck in ((young, 1), (old, 2)):
        inputs = observe.dispatch_inputs(campaign, shards, jobs, [*pods, pod], NOW, items_total=30)
        assert inputs.workers.stuck_pending_pods == stuck


def test_breaker_states_fold_history_after_the_watermark_only() -> None:
    campaign, shards, _, _ = _scenario()
    states = observe.breaker_states(campaign, shards)
    assert states["large"].state.value == "Open"
    assert states["large"].opened_at == NOW - dt.timedelta(seconds=98)
    assert states["small"].consecutive_rate_limited == 1  # from the status, nothing new
    later = campaign.model_copy(
        update={"status": campaign.current_status.model_copy(update={"history_folded_until": NOW})}
    )
    assert "large" not in observe.breaker_states(later, shards)


def test_breaker_states_fold_each_shards_history_above_its_folded_sequence() -> None:
    """With status.historyFolded (this release's operator wrote it), sequences decide which entries
    are new, not their times: historyFoldedUntil, however late, is no longer read."""
    campaign, shards, _, _ = _scenario()

    def folded(marks: dict[str, int]) -> Campaign:
        update = {"history_folded": marks, "history_folded_until": NOW + dt.timedelta(hours=1)}
        return campaign.model_copy(update={"status": campaign.current_status.model_copy(update=update)})

    assert observe.breaker_states(folded({}), shards)["large"].state.value == "Open"
    two = observe.breaker_states(folded({"papers-00001": 1}), shards)["large"]
    assert two.state.value == "Closed" and two.consecutive_rate_limited == 2
    assert "large" not in observe.breaker_states(folded({"papers-00001": 3}), shards)


def test_breaker_policies_come_from_the_declared_sources() -> None:
    campaign, *_ = _scenario()
    assert observe.breaker_policies(campaign.spec) == {
        "large": BreakerPolicy(3, dt.timedelta(seconds=600)),
        "small": BreakerPolicy(3, dt.timedelta(seconds=300)),
    }


def test_plan_view_reports_the_planners_reason_and_skips() -> None:
    campaign, shards, jobs, pods = _scenario()
    view = plan_view(campaign, shards, jobs, pods, {}, NOW, 30)
    plan = view.plan
    # A worker pod stuck Pending as long as the grace: no new Jobs (the first limit to lift).
    assert plan.reason is LimitReason.CLUSTER_FULL
    assert len(plan.start_workers) == 0
    # The large source's breaker opened from history the status has not folded: its shard goes to
    # the fallback. The shard in backoff waits.
    assert plan.routes["papers-00001"].source == "small"
    assert "backoff until" in plan.skipped["papers-00003"]
    data = view.as_dict()
    assert data["dryRun"] is True
    assert data["reason"] == str(plan.reason)
    assert data["observed"]["workers"] == {
        "aliveJobs": 1,
        "aliveSlots": 1,
        "runningPods": 1,
        "stuckPendingPods": 1,
    }
    assert data["observed"]["shardsNotYetCut"] == 8
    assert set(data["plan"]["skipped"]) == set(plan.skipped)


def test_plan_of_a_suspended_campaign_is_limited_by_suspend() -> None:
    campaign = Campaign.parse(campaign_body(items=2, suspend=True))
    shards = parse_shards([shard_body("papers", 0, "Pending"), shard_body("papers", 1, "Pending")])
    view = plan_view(campaign, shards, [], [], {}, NOW, 2)
    assert view.plan.reason is LimitReason.SUSPENDED
    assert view.plan.pause == ("papers-00000", "papers-00001")
    assert view.plan.claimable == ()


def _lease(holder: str | None, renewed_seconds_ago: float, duration: int = 30) -> dict:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "renewTime": t(renewed_seconds_ago) + ""}
    if holder:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": "x"}, "spec": spec}


@pytest.mark.parametrize(
    ("attempt", "lease", "expected"),
    [
        (1, _lease("w-1", 100), Action.RECLAIM),  # expired 70 s ago
        (3, _lease("w-1", 100), Action.BLOCK),  # ... on the last attempt
        (1, _lease(None, 1), Action.RECLAIM),  # released while the shard still says Running
        (1, _lease("w-1", 5), None),  # alive
    ],
)
def test_expired_claims_predict_the_lease_sweep(attempt: int, lease: dict, expected: Action | None) -> None:
    campaign = Campaign.parse(campaign_body(items=1, leaseSeconds=30, maxAttempts=3))
    running = {"owner": "w-1", "lastHeartbeat": t(100)}
    shards = parse_shards([shard_body("papers", 0, "Running", attempt=attempt, status=running)])
    found = observe.expired_claims(campaign, shards, {"papers-00000": lease}, NOW)
    assert [e.action for e in found] == ([expected] if expected else [])
    if expected:
        assert found[0].attempt == attempt and found[0].max_attempts == 3


def test_expired_claims_ignore_shards_that_are_not_running() -> None:
    campaign = Campaign.parse(campaign_body(items=1))
    shards = parse_shards([shard_body("papers", 0, "Pending")])
    assert observe.expired_claims(campaign, shards, {"papers-00000": _lease("w", 1000)}, NOW) == []


def test_the_plan_names_the_slots_of_the_jobs_it_would_start() -> None:
    assert _jobs_text(()) == NONE
    assert _jobs_text((1, 1, 1)) == "3", "one slot a pod reads as before: a count of Jobs"
    assert _jobs_text((8, 8, 4)) == "3 (slots 8, 8, 4)"


# A worker pod as a kubelet reports it when the Secret its env names does not exist.
MISSING_SECRET_POD = {
    "metadata": {"name": "papers-worker-1-abcde", "creationTimestamp": t(5)},
    "status": {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "worker",
                "ready": False,
                "state": {
                    "waiting": {
                        "reason": "CreateContainerConfigError",
                        "message": 'secret "shardops-s3" not found',
                    }
                },
            }
        ],
    },
}


def test_the_plan_names_a_worker_that_cannot_start_as_its_limit() -> None:
    campaign = Campaign.parse(campaign_body(items=4, shard_size=1, maxConcurrency=2))
    shards = parse_shards([shard_body("papers", i, "Pending") for i in range(4)])
    job = {"metadata": {"name": "papers-worker-1", "creationTimestamp": t(5)}, "status": {}}
    view = plan_view(campaign, shards, [job], [MISSING_SECRET_POD], {}, NOW, 4)
    assert view.plan.reason is LimitReason.WORKERS_FAILING
    assert view.plan.start_workers == ()
    text = render_plan(view)
    limited = next(line for line in text.splitlines() if line.startswith("Limited by:"))
    assert "WorkersFailing" in limited and "CreateContainerConfigError" in limited
    assert 'secret "shardops-s3" not found' in limited


def test_the_plan_names_a_quota_refusal_as_a_full_cluster() -> None:
    campaign = Campaign.parse(campaign_body(items=4, shard_size=1, maxConcurrency=2))
    shards = parse_shards([shard_body("papers", i, "Pending") for i in range(4)])
    job = {"metadata": {"name": "papers-worker-1", "creationTimestamp": t(1000)}, "status": {}}
    refusal = 'pods "papers-worker-1-x" is forbidden: exceeded quota: compute, requested: pods=1'
    view = plan_view(campaign, shards, [job], [], {}, NOW, 4, {"papers-worker-1": refusal})
    assert view.plan.reason is LimitReason.CLUSTER_FULL
    assert "exceeded quota: compute" in render_plan(view)


def test_the_plan_names_a_job_kueue_holds_as_waiting_for_quota_not_a_full_cluster() -> None:
    campaign = Campaign.parse(
        campaign_body(
            items=4,
            shard_size=1,
            maxConcurrency=2,
            worker={"image": "i", "command": ["c"], "queueName": "lq"},
        )
    )
    shards = parse_shards([shard_body("papers", i, "Pending") for i in range(4)])
    held = {
        "metadata": {
            "name": "papers-worker-1",
            "creationTimestamp": t(1000),
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {"suspend": True},
        "status": {},
    }
    said = "couldn't assign flavors to pod set main: insufficient quota for pods in flavor default"
    queue = QueueState("lq", messages={"papers-worker-1": said})
    view = plan_view(campaign, shards, [held], [], {}, NOW, 4, {}, queue)
    assert view.plan.reason is LimitReason.WAITING_FOR_QUOTA and view.plan.start_workers == ()
    text = render_plan(view)
    limited = next(line for line in text.splitlines() if line.startswith("Limited by:"))
    assert limited == (
        f"Limited by: WaitingForQuota: 1 worker Job(s) wait for quota in LocalQueue lq: Kueue: {said}; "
        "no new workers until admitted"
    )
    assert "0 stuck Pending, 1 held by Kueue for quota" in text
    assert "ClusterFull" not in text and "WorkersFailing" not in text


def test_the_plan_names_a_source_that_does_not_exist_as_its_limit() -> None:
    llm = {
        "baseUrl": "http://own/v1",
        "model": "m",
        "messages": [{"role": "user", "content": "{{ item.n }}"}],
    }
    fix = "spec.sources[0].sourceRef: no Source team in namespace ns: create a Source named team there"
    condition = {
        "type": "SourceUnresolved",
        "status": "True",
        "reason": "SourceNotFound",
        "message": f"{fix}; its workers wait until then",
        "lastTransitionTime": t(60),
    }
    campaign = Campaign.parse(
        campaign_body(
            items=2,
            sources=[{"name": "team", "sourceRef": {"name": "team"}}],
            worker={"image": "img", "command": ["shardops", "llm"], "llm": llm},
            status={"conditions": [condition]},
        )
    )
    shards = parse_shards([shard_body("papers", i, "Pending") for i in range(2)])
    view = plan_view(campaign, shards, [], [], {}, NOW, 2)
    assert view.plan.reason is LimitReason.SOURCE_UNRESOLVED and view.plan.start_workers == ()
    limited = next(line for line in render_plan(view).splitlines() if line.startswith("Limited by:"))
    assert limited.startswith(f"Limited by: SourceUnresolved: {fix}")
