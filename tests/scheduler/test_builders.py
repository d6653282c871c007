"""Pure builders of the operator: child objects, views for logic/, breakers and status."""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal

import pytest

from shardops.api.campaign import Campaign, CampaignStatus
from shardops.api.common import Condition
from shardops.api.enums import BreakerState, CampaignPhase, ShardClass, ShardPhase, StoreType
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus
from shardops.logic import conditions
from shardops.logic.aggregate import CampaignFacts, aggregate
from shardops.logic.breaker import SourceBreaker, effective
from shardops.logic.idempotency import idempotency_key
from shardops.logic.leases import Renewals
from shardops.logic.queues import QueueState
from shardops.logic.shardview import ItemProgress
from shardops.logic.timefmt import micro_time
from shardops.scheduler import builders
from shardops.state import breakers, shardview, workers
from tests.fakekube import merge_patch
from tests.schedulerkit import T0, campaign, entry, shard


def parsed(**spec: object) -> Campaign:
    body = campaign(**spec)  # type: ignore[arg-type]
    body["metadata"]["namespace"] = "ns"
    return Campaign.parse(body)


# --- child objects ------------------------------------------------------------------------------------


def test_shard_body_cuts_fifo_slices_with_a_stable_key() -> None:
    items = [{"id": i} for i in range(7)]
    camp = parsed(items=items, shardSize=3)
    body = builders.shard_body(camp, 2, items)
    assert body["metadata"]["name"] == "camp-00002"
    assert body["metadata"]["labels"] == {"shardops.dev/campaign": "camp", "shardops.dev/class": "work"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "shardops.dev/v1alpha1",
            "kind": "Campaign",
            "name": "camp",
            "uid": "uid-camp",
            "controller": True,
        }
    ]
    assert body["spec"]["items"] == [{"id": 6}] and body["spec"]["itemRange"] == {"start": 6, "end": 7}
    assert body["spec"]["idempotencyKey"] == idempotency_key("camp", [{"id": 6}], camp.spec.worker.identity())
    assert Shard.parse(body).spec.item_count == 1, "a valid Shard"


def env(**variables: str) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in variables.items()]


def work_key(**worker: object) -> str:
    camp = parsed(worker={"image": "img", "command": ["agent"], **worker})
    return str(builders.shard_body(camp, 0, camp.spec.items or [])["spec"]["idempotencyKey"])


def test_the_work_key_follows_the_image_and_env_the_result_depends_on() -> None:
    base = work_key(env=env(MODEL="a", TEMP="0"))
    assert base != work_key(image="img:2", env=env(MODEL="a", TEMP="0")), "another image, other results"
    assert base != work_key(env=env(MODEL="b", TEMP="0")), "a changed value"
    assert base != work_key(env=env(MODEL="a")), "a variable removed"
    assert base != work_key(env=env(MODEL="a", TEMP="0", EMPTY="")), "a variable set to empty is set"
    assert base == work_key(env=env(TEMP="0", MODEL="a")), "the order of distinct names does not matter"
    overridden = [{"name": "MODEL", "value": "old"}, *env(TEMP="0", MODEL="a")]
    assert base == work_key(env=overridden), "a later duplicate wins, as in a pod"
    assert base != work_key(env=[*env(MODEL="a", TEMP="0"), {"name": "MODEL", "value": "old"}])
    elsewhere = {"resources": {"limits": {"memory": "1Gi"}}, "serviceAccountName": "other"}
    assert base == work_key(env=env(MODEL="a", TEMP="0"), **elsewhere), "where it runs is not what it does"


def test_results_version_forces_new_keys_for_unchanged_work() -> None:
    base = work_key()
    assert base == work_key(), "unchanged work reuses its results"
    assert base != work_key(resultsVersion="2")
    assert work_key(resultsVersion="2") != work_key(resultsVersion="3")
    assert work_key(resultsVersion="2") == work_key(resultsVersion="2")


def test_persistent_and_slots_are_not_in_the_keys_they_compute_what_a_process_per_shard_does() -> None:
    assert work_key(persistent=True) == work_key() == work_key(persistent=False)
    assert work_key(slots=8) == work_key() == work_key(slots=1)

    def finalize_key(**work: object) -> str:
        camp = parsed(
            worker={"image": "img", "command": ["agent"], **work}, finalize={"image": "i", "command": ["m"]}
        )
        return str(builders.finalize_shard_body(camp, camp.spec.items or [])["spec"]["idempotencyKey"])

    assert finalize_key(persistent=True) == finalize_key()
    assert finalize_key(persistent=True) != finalize_key(persistent=True, env=env(MODEL="b")), (
        "the key still moves"
    )


def test_shard_source_is_the_first_named_else_the_default() -> None:
    assert builders.shard_source([{"a": 1}, {"source": "B"}, {"source": "C"}], "A") == "B"
    assert builders.shard_source([{"a": 1}], "A") == "A"
    assert builders.shard_source([{"source": 7}], None) is None


def test_finalize_shard_has_no_items_and_a_key_of_the_campaign_shape() -> None:
    camp = parsed(finalize={"image": "img", "command": ["merge"]})
    body = builders.finalize_shard_body(camp, camp.spec.items or [])
    assert body["metadata"]["name"] == "camp-finalize"
    assert body["spec"]["shardClass"] == "finalize" and "items" not in body["spec"]
    assert body["spec"]["index"] == 4
    assert Shard.parse(body).spec.is_finalize


def test_the_finalize_key_follows_the_items_and_the_work_it_reads_the_results_of() -> None:
    def key(items: list[dict[str, int]], command: str = "agent", **work: object) -> str:
        worker, finalize = {"image": "img", "command": [command], **work}, {"image": "i", "command": ["m"]}
        camp = parsed(items=items, worker=worker, finalize=finalize)
        return str(builders.finalize_shard_body(camp, camp.spec.items or [])["spec"]["idempotencyKey"])

    items = [{"n": i} for i in range(4)]
    assert key(items) == key([dict(item) for item in items]), "an unchanged campaign finds its result"
    assert key(items) != key([*items[:3], {"n": 99}]), "one changed item runs the closing step again"
    assert key(items) != key(items, command="other"), "other work, other results"
    assert key(items) != key(items, image="img:2"), "another work image, other results"
    assert key(items) != key(items, env=env(MODEL="b")), "another work env, other results"
    assert key(items) != key(items, resultsVersion="2"), "recomputed work, a recomputed closing step"


def test_the_finalize_key_follows_its_own_image_env_and_results_version() -> None:
    def key(**finalize: object) -> str:
        camp = parsed(finalize={"image": "i", "command": ["m"], **finalize})
        return str(builders.finalize_shard_body(camp, camp.spec.items or [])["spec"]["idempotencyKey"])

    base = key(env=env(FORMAT="csv", LANG="en"))
    assert base == key(env=env(LANG="en", FORMAT="csv"))
    assert base != key(image="i:2", env=env(FORMAT="csv", LANG="en"))
    assert base != key(env=env(FORMAT="json", LANG="en"))
    assert base != key(env=env(FORMAT="csv", LANG="en"), resultsVersion="2")

    def work_key_with(finalize_image: str) -> str:
        camp = parsed(finalize={"image": finalize_image, "command": ["m"]})
        return str(builders.shard_body(camp, 0, camp.spec.items or [])["spec"]["idempotencyKey"])

    assert work_key_with("i") == work_key_with("i:2"), "the closing step's image is not the work's"


def test_worker_job_is_owned_labelled_retried_by_us_and_cleaned_up() -> None:
    camp = parsed(worker={"image": "img", "command": ["agent"], "env": [{"name": "K", "value": "v"}]})
    job = builders.worker_job_body(camp, camp.spec.worker, "sa-default")
    labels = {"shardops.dev/campaign": "camp", "shardops.dev/role": "worker"}
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert job["metadata"]["name"] == "camp-worker-1" and job["metadata"]["labels"] == labels
    assert job["metadata"]["annotations"] == {
        "shardops.dev/worker-number": "1",
        "shardops.dev/worker-slots": "1",
    }
    assert "generateName" not in job["metadata"], "a fixed name: a repeated create finds its Job"
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    assert (job["spec"]["backoffLimit"], job["spec"]["ttlSecondsAfterFinished"]) == (0, 300)
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 30
    assert pod["serviceAccountName"] == "sa-default" and pod["automountServiceAccountToken"] is True
    assert container["image"] == "img" and container["command"] == [
        "shardops",
        "worker",
        "--campaign",
        "camp",
    ]
    env = {v["name"]: v for v in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SHARDOPS_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["SHARDOPS_CAMPAIGN_UID"]["value"] == camp.metadata.uid
    assert env["K"]["value"] == "v"
    assert env["SHARDOPS_SLOTS"]["value"] == "1"
    assert "resources" not in container


PLACED = {
    "image": "registry.example.com/team/agent:1",
    "command": ["agent"],
    "imagePullSecrets": [{"name": "team-registry"}],
    "nodeSelector": {"pool": "batch"},
    "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
}
INSTALLATION = builders.WorkerPodDefaults(
    image_pull_secrets=("mirror",),
    node_selector={"pool": "general"},
    tolerations=({"key": "shared", "operator": "Exists"},),
    resources={"requests": {"cpu": "100m"}},
)


def test_a_queued_worker_job_is_labelled_for_kueue_and_its_pods_keep_the_selector_labels() -> None:
    camp = parsed(
        worker={"image": "img", "command": ["agent"], "queueName": "team-a", "priorityClassName": "batch-low"}
    )
    job = builders.worker_job_body(camp, camp.spec.worker, "sa-default")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "batch-low"
    assert "suspend" not in job["spec"], "Kueue's webhook suspends it; the operator creates it as any Job"
    plain = builders.worker_job_body(parsed(), parsed().spec.worker, "sa-default")
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    assert "priorityClassName" not in plain["spec"]["template"]["spec"]


def test_worker_pods_are_placed_as_the_campaign_says() -> None:
    camp = parsed(worker=PLACED)
    pod = builders.worker_job_body(camp, camp.spec.worker, "sa", pod_defaults=INSTALLATION)["spec"][
        "template"
    ]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "team-registry"}]
    assert pod["spec"]["nodeSelector"] == {"pool": "batch"}
    assert pod["spec"]["tolerations"] == [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m"},
        "limits": {"memory": "1Gi"},
    }
    # Where the pod runs is not what it computes: the shards' keys do not change.
    assert work_key(**PLACED) == work_key(image=PLACED["image"], command=["agent"])


def test_worker_pods_take_the_installations_placement_for_what_the_campaign_leaves_unset() -> None:
    camp = parsed(worker={"image": "img", "command": ["agent"], "nodeSelector": {}})
    pod = builders.worker_job_body(camp, camp.spec.worker, "sa", pod_defaults=INSTALLATION)["spec"][
        "template"
    ]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror"}]
    assert pod["spec"]["tolerations"] == [{"key": "shared", "operator": "Exists"}]
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m"}}
    # An explicit empty selector is the campaign's choice: any node.
    assert "nodeSelector" not in pod["spec"]
    bare = builders.worker_job_body(camp, camp.spec.worker, "sa")["spec"]["template"]["spec"]
    assert not {"imagePullSecrets", "nodeSelector", "tolerations"} & set(bare)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("tolerations", [{"key": "k", "operator": "Maybe"}], "operator"),
        ("tolerations", [{"key": "k", "effect": "NoRun"}], "effect"),
        ("imagePullSecrets", [{"name": "Not_A_Name"}], "name"),
        ("nodeSelector", {"pool": "x" * 64}, "nodeSelector"),
    ],
)
def test_bad_placement_is_refused_naming_the_field(field: str, value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parsed(worker={"image": "img", "command": ["agent"], field: value})


def test_a_worker_job_of_several_slots_says_so_to_its_pod_and_to_the_planner() -> None:
    """The env tells the worker how many shards to run at once; the annotation is what the planner
    counts (`state.workers.job_slots`); a SHARDOPS_SLOTS of the campaign's env does not win."""
    camp = parsed(
        worker={
            "image": "img",
            "command": ["a"],
            "slots": 8,
            "env": [{"name": "SHARDOPS_SLOTS", "value": "2"}],
        }
    )
    job = builders.worker_job_body(camp, camp.spec.worker, "sa", number=3, slots=5)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [v["value"] for v in env if v["name"] == "SHARDOPS_SLOTS"][-1] == "5"
    assert workers.job_slots(job) == 5
    assert workers.job_slots({"metadata": {"name": "old"}}) == 1, "a Job of an earlier release has one"
    assert workers.job_slots({"metadata": {"annotations": {"shardops.dev/worker-slots": "x"}}}) == 1
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    counts = workers.worker_counts(
        [job, done, {"metadata": {"name": "old"}}], [], now, dt.timedelta(minutes=1)
    )
    assert (counts.alive_jobs, counts.alive_slots) == (2, 6), "a finished Job's slots are not alive"


def test_worker_job_gets_the_result_stores_credentials_from_its_secret_never_as_values() -> None:
    camp = parsed()
    plain = builders.worker_job_body(camp, camp.spec.worker, "sa")
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & {
        v["name"] for v in plain["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    status = CampaignStatus(
        result_store=ResultStoreStatus(type=StoreType.S3, bucket="b", credentials_secret="creds")
    )
    with_store = camp.model_copy(update={"status": status})
    env = builders.worker_job_body(with_store, camp.spec.worker, "sa")
    variables = {v["name"]: v for v in env["spec"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert variables[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "creds", "key": key}}}


def test_worker_job_uses_the_campaign_service_account_resources_and_a_name_that_fits() -> None:
    camp = parsed(
        worker={
            "image": "img",
            "command": ["agent"],
            "serviceAccountName": "mine",
            "resources": {"requests": {"cpu": "500m"}},
        }
    )
    camp = camp.model_copy(update={"metadata": camp.metadata.model_copy(update={"name": "x" * 60})})
    job = builders.worker_job_body(camp, camp.spec.worker)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "500m"}}
    assert len(job["metadata"]["name"]) <= 63


@pytest.mark.parametrize("length", [1, 40, 50, 55, 62, 63])
def test_worker_job_names_fit_a_label_and_keep_long_campaigns_apart(length: int) -> None:
    """A Job's name is its pods' job-name label: at most 63 characters, a DNS-1123 label."""
    name = "c" * (length - 1) + "a"
    other = "c" * (length - 1) + "b"
    for number in (1, 12345, 10**9):
        job_name = builders.worker_job_name(name, number)
        assert len(job_name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job_name), job_name
        assert job_name.endswith(f"-worker-{number}")
        assert job_name == builders.worker_job_name(name, number), "the same name on every pass"
        assert job_name != builders.worker_job_name(other, number), "two campaigns, two names"
        assert job_name != builders.worker_job_name(name, number + 1)
    assert builders.worker_job_name("camp", 7) == "camp-worker-7", "short names are kept whole"


def test_finalize_only_work_uses_the_finalize_spec() -> None:
    camp = parsed(finalize={"image": "final", "command": ["merge"]})
    assert builders.worker_spec_for(camp.spec, [ShardClass.FINALIZE]).image == "final"
    assert builders.worker_spec_for(camp.spec, [ShardClass.WORK, ShardClass.FINALIZE]).image == "img"
    assert builders.worker_spec_for(camp.spec, []).image == "img"


# --- views ---------------------------------------------------------------------------------------------


def test_shard_view_of_a_fresh_shard_is_queued() -> None:
    view = shardview.shard_view(Shard.parse(shard("camp", 3, None)))
    assert view.phase is ShardPhase.QUEUED and view.attempt == 1 and view.index == 3


def test_shard_view_uses_the_real_source_while_running() -> None:
    body = shard("camp", 0, "Running", items=[{"id": 0, "source": "A"}], source="B")
    body["spec"]["source"] = "A"
    history = [
        entry("Pending", T0, "Materialized"),
        entry("Running", T0 + dt.timedelta(seconds=5), "Claimed"),
    ]
    body["status"]["history"] = history
    view = shardview.shard_view(Shard.parse(body))
    assert view.source == "B" and view.since == T0 + dt.timedelta(seconds=5)
    body["status"]["phase"] = "Pending"
    assert shardview.shard_view(Shard.parse(body)).source == "A"


def test_materialized_items_from_the_highest_work_index() -> None:
    shards = [Shard.parse(shard("camp", i, "Done")) for i in (0, 1, 2)]
    shards.append(Shard.parse(shard("camp", 3, "Pending", shard_class="finalize")))
    assert shardview.cut_items(shards, 5, 12) == 12
    assert shardview.cut_items(shards[:2], 5, 12) == 10
    assert shardview.cut_items([], 5, 12) == 0


def _lease(holder: str | None, renewed: dt.datetime) -> dict:
    spec: dict = {"leaseDurationSeconds": 30, "leaseTransitions": 2}
    if holder:
        spec.update(holderIdentity=holder, renewTime=micro_time(renewed))
    return {"metadata": {"name": "s"}, "spec": spec}


def test_a_claims_silence_is_timed_from_its_holders_renewals_on_the_observers_clock() -> None:
    monotonic = [0.0]
    seen = Renewals(lambda: monotonic[0])
    # The holder's leaseUntil is an hour ahead of this machine's clock: it decides nothing.
    running = Shard.parse(
        shard("c", 0, "Running", owner="w1", leaseUntil=(T0 + dt.timedelta(hours=1)).isoformat())
    )
    assert shardview.claim_silence(seen, running, None) == 0.0
    monotonic[0] = 12.0
    assert shardview.claim_silence(seen, running, None) == 12.0
    # The owner's Lease renewed past what the shard shows (its status write has not landed): renewed.
    assert shardview.claim_silence(seen, running, _lease("w1", T0 + dt.timedelta(hours=1))) == 0.0
    monotonic[0] = 15.0
    assert shardview.claim_silence(seen, running, _lease("w1", T0 + dt.timedelta(hours=1))) == 3.0
    # A released Lease on a Running shard: nobody works on it.
    assert shardview.claim_silence(seen, running, _lease(None, T0)) == math.inf
    # Taken over by w2 after the shard was written: w2's claim is first seen now, whatever its times.
    assert shardview.claim_silence(seen, running, _lease("w2", T0 - dt.timedelta(days=1))) == 0.0
    assert shardview.taken_over(running, _lease("w2", T0)) and not shardview.taken_over(
        running, _lease("w1", T0)
    )
    obs = shardview.lease_observation(running, _lease("w1", T0), 30, 10, T0, 3.0)
    assert (obs.lease_until, obs.silent_seconds) == (T0 + dt.timedelta(seconds=30), 3.0)


def test_a_one_look_view_predicts_from_the_holders_timestamps() -> None:
    body = shard("c", 0, "Running", history=[entry("Running", T0, "Claimed")])
    silent = shardview.one_look_silence(Shard.parse(body), None, 30, T0 + dt.timedelta(seconds=40))
    assert silent == 40.0  # claimed at T0, never renewed: by this machine's clock, 40 s


def test_worker_counts() -> None:
    now = T0 + dt.timedelta(minutes=10)
    jobs = [
        {"metadata": {}, "status": {}},
        {"metadata": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}},
        {"metadata": {}, "status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}},
        {"metadata": {"deletionTimestamp": "x"}, "status": {}},
    ]
    old = micro_time(T0)
    pods = [
        {"metadata": {"creationTimestamp": old}, "status": {"phase": "Running"}},
        {"metadata": {"creationTimestamp": old}, "status": {"phase": "Pending"}},
        {
            "metadata": {"creationTimestamp": micro_time(now)},
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            },
        },
        {"metadata": {"creationTimestamp": micro_time(now)}, "status": {"phase": "Pending"}},
        {"metadata": {"creationTimestamp": old, "deletionTimestamp": old}, "status": {"phase": "Pending"}},
    ]
    counts = workers.worker_counts(jobs, pods, now, dt.timedelta(minutes=2))
    assert (counts.alive_jobs, counts.running_pods, counts.stuck_pending_pods) == (1, 1, 2)


# --- breakers --------------------------------------------------------------------------------------------


def test_each_source_keeps_its_own_cooldown_through_the_planner() -> None:
    camp = parsed(
        sources=[{"name": "A", "cooldownSeconds": 10}, {"name": "B", "cooldownSeconds": 100}],
        items=[{"id": 1}],
    )
    states = {
        "A": SourceBreaker(BreakerState.OPEN, 3, T0),
        "B": SourceBreaker(BreakerState.OPEN, 3, T0),
        "C": SourceBreaker(BreakerState.CLOSED, 1, None),
    }
    planned = breakers.planner_breakers(camp.spec, states)
    at = T0 + dt.timedelta(seconds=10)
    assert (
        effective(planned.states["A"], at - dt.timedelta(microseconds=1), planned.cooldown)
        is BreakerState.OPEN
    )
    assert effective(planned.states["A"], at, planned.cooldown) is BreakerState.HALF_OPEN
    assert effective(planned.states["B"], at, planned.cooldown) is BreakerState.OPEN
    assert effective(planned.states["C"], at, planned.cooldown) is BreakerState.CLOSED


def test_breakers_round_trip_through_the_status() -> None:
    camp = parsed(
        sources=[{"name": "A", "fallback": "B", "cooldownSeconds": 10}, {"name": "B"}], items=[{"id": 1}]
    )
    states = {"A": SourceBreaker(BreakerState.OPEN, 3, T0), "X": SourceBreaker(BreakerState.CLOSED, 1, None)}
    listed = builders.breakers_to_status(
        camp.spec, states, {"A": "429s"}, CampaignStatus(), T0 + dt.timedelta(seconds=11)
    )
    assert [(b.source, b.state) for b in listed] == [
        ("A", BreakerState.HALF_OPEN),
        ("B", BreakerState.CLOSED),
        ("X", BreakerState.CLOSED),
    ]
    assert listed[0].reason == "429s" and listed[1].reason is None
    back = breakers.breakers_from_status(CampaignStatus(breakers=listed))
    assert back["A"] == SourceBreaker(BreakerState.OPEN, 3, T0), "HalfOpen is read back as Open"
    assert back["X"].consecutive_rate_limited == 1


# --- status ------------------------------------------------------------------------------------------------


def test_merge_conditions_uses_the_api_rule_and_stamps_the_generation() -> None:
    first = builders.merge_conditions([], [conditions.suspended(True)], T0, 1)
    later = T0 + dt.timedelta(minutes=1)
    same = builders.merge_conditions(first, [conditions.suspended(True)], later, 2)
    flipped = builders.merge_conditions(same, [conditions.suspended(False)], later, 2)
    assert isinstance(first[0], Condition) and first[0].observed_generation == 1
    assert same[0].last_transition_time == T0 and same[0].observed_generation == 2
    assert flipped[0].last_transition_time == later and flipped[0].status == "False"


def _status(oldest: float | None = None, pending: int = 0) -> CampaignStatus:
    return CampaignStatus(phase=CampaignPhase.RUNNING, oldest_pending_seconds=oldest, spent=1.0).model_copy(
        update={"counts": CampaignStatus().counts.model_copy(update={"pending": pending})}
    )


def test_status_differs_ignores_small_drifts_of_the_oldest_pending_age() -> None:
    assert builders.status_differs(None, _status())
    assert not builders.status_differs(_status(10.0), _status(25.0))
    assert builders.status_differs(_status(10.0), _status(40.0))
    assert builders.status_differs(_status(None), _status(1.0))
    assert builders.status_differs(_status(10.0, pending=1), _status(11.0, pending=2))


def test_campaign_status_counts_the_unmaterialized_as_queued() -> None:
    views = [shardview.shard_view(Shard.parse(shard("c", i, "Done", cost=0.5))) for i in range(2)]
    agg = aggregate(views, T0, CampaignFacts(False, ItemProgress(10, 2, 1), Decimal(4), 0.8))
    status = builders.campaign_status(
        agg,
        builders.StatusFacts(
            generation=3,
            items_total=10,
            work_shards_total=10,
            has_finalize=True,
            uncut_shards=9,
            cut_shards=2,
            materialized=2,
            breakers=[],
            conditions=[],
            last_retry_generation=1,
            history_folded={"c-00000": 2, "c-00001": 2},
            history_folded_until=T0,
            budget_limit=Decimal(4),
        ),
        CampaignStatus(),
    )
    assert status.counts.queued == 9 and status.counts.done == 2 and status.counts.total == 10
    assert status.cut_shards == 2
    assert status.shards_total == 11 and status.budget_ratio == 0.25 and status.observed_generation == 3
    assert status.progress_text == "2/11"
    assert status.to_dict()["historyFolded"] == {"c-00000": 2, "c-00001": 2}


def test_the_status_patch_removes_the_shards_the_fold_map_dropped() -> None:
    """A merge patch merges maps key by key: a shard that left historyFolded is sent as null."""
    previous = CampaignStatus(history_folded={"c-00000": 4, "c-00001": 2})
    new = previous.model_copy(update={"history_folded": {"c-00001": 3, "c-00002": 1}})
    patch = builders.status_patch(previous, new)
    assert patch["historyFolded"] == {"c-00000": None, "c-00001": 3, "c-00002": 1}
    stored = merge_patch({"historyFolded": previous.to_dict()["historyFolded"]}, patch)
    assert stored["historyFolded"] == {"c-00001": 3, "c-00002": 1}
    emptied = builders.status_patch(previous, previous.model_copy(update={"history_folded": {}}))
    assert merge_patch(previous.to_dict(), emptied)["historyFolded"] == {}
    assert builders.status_patch(CampaignStatus(), new)["historyFolded"] == {"c-00001": 3, "c-00002": 1}


def test_a_job_that_never_got_a_pod_counts_as_stuck() -> None:
    now = T0 + dt.timedelta(minutes=10)
    jobs = [
        {"metadata": {"name": "w-1", "creationTimestamp": micro_time(T0)}, "status": {}},
        {"metadata": {"name": "w-2", "creationTimestamp": micro_time(T0)}, "status": {}},
        {"metadata": {"name": "w-3", "creationTimestamp": micro_time(now)}, "status": {}},
    ]
    pods = [{"metadata": {"labels": {"batch.kubernetes.io/job-name": "w-2"}}, "status": {"phase": "Running"}}]
    counts = workers.worker_counts(jobs, pods, now, dt.timedelta(minutes=2))
    assert (counts.alive_jobs, counts.running_pods, counts.stuck_pending_pods) == (3, 1, 1)


def _failed_job(name: str, at: dt.datetime) -> dict:
    condition = {
        "type": "Failed",
        "status": "True",
        "lastTransitionTime": micro_time(at),
        "reason": "BackoffLimitExceeded",
    }
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def test_workers_that_keep_failing_hold_new_jobs_until_quiet() -> None:
    now = T0 + dt.timedelta(minutes=10)
    recent = [_failed_job(f"w-{i}", now - dt.timedelta(seconds=10 * i)) for i in range(3)]
    old = [_failed_job("w-old", now - dt.timedelta(minutes=6))]
    failures = workers.worker_failures(recent + old, now)
    assert (
        failures.count == 3
        and failures.last_at == now
        and "w-0: BackoffLimitExceeded" in failures.last_reason
    )
    assert failures.holding(workers_at_cap=2, now=now)
    assert not failures.holding(workers_at_cap=4, now=now), "fewer failures than workers: not a pattern yet"
    assert not failures.holding(workers_at_cap=2, now=now + dt.timedelta(seconds=61)), (
        "quiet long enough: try again"
    )
    assert not workers.worker_failures(old, now).holding(1, now)
    assert "3 worker Job(s) failed" in failures.describe()


def _waiting_pod(name: str, reason: str, message: str = "", phase: str = "Pending") -> dict[str, object]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {
        "metadata": {"name": name, "creationTimestamp": micro_time(T0)},
        "status": {"phase": phase, "containerStatuses": [{"name": "worker", "state": {"waiting": waiting}}]},
    }


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("CreateContainerConfigError", 'secret "shardops-s3" not found'),
        ("ErrImagePull", 'failed to pull image "shardops:dev": not found'),
        ("ImagePullBackOff", 'Back-off pulling image "shardops:dev"'),
        ("InvalidImageName", 'Failed to apply default image tag "Bad:Name"'),
        ("CrashLoopBackOff", "back-off 40s restarting failed container"),
    ],
)
def test_a_pod_that_cannot_start_is_named_with_its_own_reason_and_not_counted_as_pending(
    reason: str, message: str
) -> None:
    now = T0 + dt.timedelta(minutes=10)
    phase = "Running" if reason == "CrashLoopBackOff" else "Pending"
    pods = [_waiting_pod("w-1-x", reason, message, phase)]
    counts = workers.worker_counts(
        [{"metadata": {"name": "w-1"}, "status": {}}], pods, now, dt.timedelta(minutes=2)
    )
    assert counts.cannot_start == f"pod w-1-x: container worker: {reason}: {message}"
    assert counts.stuck_pending_pods == 0, "a pod the kubelet cannot start is not a full cluster"


def test_a_pod_still_starting_is_healthy() -> None:
    now = T0 + dt.timedelta(seconds=5)
    pods = [_waiting_pod("w-1-x", "ContainerCreating")]
    counts = workers.worker_counts(
        [{"metadata": {"name": "w-1"}, "status": {}}], pods, now, dt.timedelta(minutes=2)
    )
    assert counts.cannot_start is None and counts.stuck_detail is None


def test_an_unschedulable_pod_is_named_with_the_schedulers_words() -> None:
    unschedulable = {
        "metadata": {"name": "w-1-x", "creationTimestamp": micro_time(T0)},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                }
            ],
        },
    }
    counts = workers.worker_counts([], [unschedulable], T0, dt.timedelta(minutes=2))
    assert counts.stuck_pending_pods == 1
    assert counts.stuck_detail == "pod w-1-x: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def _held_job(name: str, uid: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "creationTimestamp": micro_time(T0),
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        },
        "spec": {"suspend": True},
        "status": {},
    }


def test_a_job_kueue_holds_suspended_waits_for_quota_and_is_neither_stuck_nor_failing() -> None:
    now = T0 + dt.timedelta(minutes=10)
    grace = dt.timedelta(minutes=2)
    jobs = [_held_job("w-1", "u1"), _held_job("w-2", "u2")]
    assert workers.podless_jobs(jobs, [], now, grace) == [], "no FailedCreate to look for: it is held"
    said = "couldn't assign flavors to pod set main: insufficient quota for pods in flavor default"
    queue = QueueState("team-a", messages={"w-2": said})
    counts = workers.worker_counts(jobs, [], now, grace, {}, queue)
    assert (counts.alive_jobs, counts.stuck_pending_pods, counts.cannot_start) == (2, 0, None)
    assert counts.queued_jobs == 2 and counts.queue_missing is None
    assert counts.queue_wait == f"2 worker Job(s) wait for quota in LocalQueue team-a: Kueue: {said}"
    missing = workers.worker_counts(jobs, [], now, grace, {}, QueueState("team-a", exists=False))
    assert missing.queue_missing is not None
    assert missing.queue_missing.startswith("spec.worker.queueName team-a: no LocalQueue team-a")
    assert "create it" in missing.queue_missing
    admitted = {**jobs[0], "spec": {"suspend": False}}
    assert workers.worker_counts([admitted], [], now, grace).queued_jobs == 0


def test_a_job_refused_its_pod_is_full_for_quota_and_failing_for_anything_else() -> None:
    now = T0 + dt.timedelta(minutes=10)
    jobs = [
        {"metadata": {"name": "w-1", "creationTimestamp": micro_time(T0)}, "status": {}},
        {"metadata": {"name": "w-2", "creationTimestamp": micro_time(T0)}, "status": {}},
        {"metadata": {"name": "w-3", "creationTimestamp": micro_time(now)}, "status": {}},
    ]
    grace = dt.timedelta(minutes=2)
    assert workers.podless_jobs(jobs, [], now, grace) == ["w-1", "w-2"]
    quota = 'pods "w-1-a" is forbidden: exceeded quota: compute, requested: cpu=1, limited: cpu=2'
    counts = workers.worker_counts(jobs, [], now, grace, {"w-1": quota})
    assert counts.stuck_pending_pods == 2 and counts.cannot_start is None
    assert counts.stuck_detail == f"Job w-1: FailedCreate: {quota}"
    policy = 'pods "w-2-a" is forbidden: violates PodSecurity "restricted:latest"'
    counts = workers.worker_counts(jobs, [], now, grace, {"w-2": policy})
    assert counts.cannot_start == f"Job w-2: FailedCreate: {policy}"
    assert counts.stuck_pending_pods == 1  # w-1: no pod past the grace, no word why
