"""Pure builders: the objects the operator creates, the views `logic/` decides on, the status it writes.

No I/O here; `reconcile` reads the cluster, calls these and `logic/`, and writes what they return.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from shardops.api.campaign import BreakerStatus, Campaign, CampaignSpec, CampaignStatus, ShardCounts
from shardops.api.common import JSON, Condition, Item, set_condition
from shardops.api.enums import BreakerState, ShardClass, ShardPhase
from shardops.api.llm import source_api_key_env
from shardops.api.names import (
    API_GROUP_VERSION,
    CAMPAIGN_LABEL,
    CLASS_LABEL,
    KUEUE_QUEUE_LABEL,
    ROLE_LABEL,
    SHARD_KIND,
    WORKER_NUMBER_ANNOTATION,
    WORKER_SLOTS_ANNOTATION,
    derived_name,
)
from shardops.api.worker import WorkerSpec
from shardops.k8s.jobs import WORKER_ROLE
from shardops.logic.aggregate import Aggregate
from shardops.logic.breaker import CLOSED_BREAKER, SourceBreaker, effective
from shardops.logic.conditions import DesiredCondition
from shardops.logic.idempotency import idempotency_key, items_digest
from shardops.state import breakers, shardview

# The non-root user of the shardops image (Dockerfile), the same as the chart's operator pod.
WORKER_UID = 65532
WORKER_TMP = "/tmp"
# The worker ServiceAccount the chart creates (charts/shardops, values workers.serviceAccount).
DEFAULT_WORKER_SERVICE_ACCOUNT = "shardops-worker"
JOB_TTL_SECONDS = 300
# The worker gets SIGTERM, releases its claim (not charged as an attempt) and stops its command.
WORKER_GRACE_SECONDS = 30
# oldestPendingSeconds changes every second; rewriting the status only for it would turn an idle
# campaign into a stream of writes. It is refreshed with any other change, or once it is this stale.
OLDEST_PENDING_SLACK_SECONDS = 30.0


def owner_reference(campaign: Campaign) -> JSON:
    """The Campaign as controller owner: deleting it garbage-collects shards and worker Jobs."""
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": campaign.kind,
        "name": campaign.name,
        "uid": campaign.metadata.uid,
        "controller": True,
    }


def shard_slice(total: int, shard_size: int, index: int) -> tuple[int, int]:
    """[start, end) of shard `index`'s items: FIFO, shardSize each, the last one may be short."""
    start = index * shard_size
    return start, min(start + shard_size, total)


def shard_source(items: Sequence[Item], default_source: str | None) -> str | None:
    """The first source an item names, else the campaign's default: a shard calls one source."""
    for item in items:
        named = item.get("source")
        if isinstance(named, str) and named:
            return named
    return default_source


def shard_body(campaign: Campaign, index: int, items: Sequence[Item]) -> JSON:
    """A work Shard holding its slice of the items (copied in: the worker never re-reads the source)."""
    spec = campaign.spec
    start, end = shard_slice(len(items), spec.shard_size, index)
    chunk = list(items[start:end])
    body_spec: JSON = {
        "campaign": campaign.name,
        "index": index,
        "shardClass": str(ShardClass.WORK),
        "items": chunk,
        "itemRange": {"start": start, "end": end},
        "idempotencyKey": idempotency_key(campaign.name, chunk, spec.worker.identity()),
    }
    source = shard_source(chunk, spec.default_source)
    if source is not None:
        body_spec["source"] = source
    return _shard(campaign, shardview.shard_name(campaign.name, index), ShardClass.WORK, body_spec)


def finalize_shard_body(campaign: Campaign, items: Sequence[Item]) -> JSON:
    """The closing shard. Its input is the campaign's shape and its items (in order) with the work
    worker's identity (image, command, env, ...): what the results it reads follow from, so
    re-running an unchanged campaign finds its result and a changed item or worker runs the closing
    step again; its own worker's identity is the key's worker. One pass over the items, once per
    campaign (a streamed input is read once more)."""
    finalize = campaign.spec.finalize
    if finalize is None:
        raise ValueError(f"campaign {campaign.name} has no spec.finalize")
    work_shards = campaign.spec.expected_shards(len(items))
    shape = {
        "finalize": campaign.name,
        "items": len(items),
        "shards": work_shards,
        "inputs": items_digest(items),
        "worker": campaign.spec.worker.identity(),
    }
    body_spec: JSON = {
        "campaign": campaign.name,
        "index": work_shards,
        "shardClass": str(ShardClass.FINALIZE),
        "idempotencyKey": idempotency_key(campaign.name, shape, finalize.identity()),
    }
    return _shard(campaign, shardview.finalize_name(campaign.name), ShardClass.FINALIZE, body_spec)


def _shard(campaign: Campaign, name: str, shard_class: ShardClass, spec: JSON) -> JSON:
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": SHARD_KIND,
        "metadata": {
            "name": name,
            "namespace": campaign.namespace,
            "labels": {CAMPAIGN_LABEL: campaign.name, CLASS_LABEL: str(shard_class)},
            "ownerReferences": [owner_reference(campaign)],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class WorkerMetricsEndpoint:
    """Worker pods serve their shardops_worker_* figures on this port (OperatorSettings.worker_metrics)."""

    port: int
    # None: the worker's own default (WorkerSettings.metrics_linger_seconds).
    linger_seconds: float | None = None


# The container port's name: the chart's PodMonitor scrapes worker pods by it.
WORKER_METRICS_PORT_NAME = "metrics"


def worker_metrics_env(metrics: WorkerMetricsEndpoint) -> list[JSON]:
    """The worker settings (WorkerSettings.metrics_port, .metrics_linger_seconds) that turn /metrics on."""
    env: list[JSON] = [{"name": "SHARDOPS_METRICS_PORT", "value": str(metrics.port)}]
    if metrics.linger_seconds is not None:
        env.append({"name": "SHARDOPS_METRICS_LINGER_SECONDS", "value": f"{metrics.linger_seconds:g}"})
    return env


@dataclass(frozen=True)
class WorkerPodDefaults:
    """The installation's worker pod placement (chart values workers.imagePullSecrets, .nodeSelector,
    .tolerations, .resources), each used where the Campaign's spec.worker leaves that field unset:
    a Campaign's own value replaces the default whole, never merges with it."""

    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[JSON, ...] = ()
    resources: JSON = field(default_factory=dict)


NO_WORKER_POD_DEFAULTS = WorkerPodDefaults()


def worker_pod_placement(worker: WorkerSpec, defaults: WorkerPodDefaults) -> JSON:
    """imagePullSecrets, nodeSelector and tolerations of a worker pod: the Campaign's, else the
    installation's; absent when neither sets one."""
    pull_secrets = (
        [ref.name for ref in worker.image_pull_secrets]
        if worker.image_pull_secrets is not None
        else list(defaults.image_pull_secrets)
    )
    node_selector = dict(worker.node_selector if worker.node_selector is not None else defaults.node_selector)
    tolerations = (
        [t.to_dict() for t in worker.tolerations]
        if worker.tolerations is not None
        else [dict(t) for t in defaults.tolerations]
    )
    placement: JSON = {}
    if pull_secrets:
        placement["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    if node_selector:
        placement["nodeSelector"] = node_selector
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


def worker_resources(worker: WorkerSpec, defaults: WorkerPodDefaults) -> JSON:
    """The container's resources: the Campaign's requests and limits when it sets any, else the
    installation's."""
    own = {k: v for k, v in worker.resources.to_dict().items() if v}
    return own or {k: dict(v) for k, v in defaults.resources.items() if v}


def worker_job_name(campaign_name: str, number: int) -> str:
    """`<campaign>-worker-<number>`; a Job's name becomes the `job-name` label of its pods, so a long
    campaign name is cut short with a hash of it (`api.names.derived_name`) to fit in 63."""
    return derived_name(campaign_name, f"-worker-{number}")


def worker_job_body(
    campaign: Campaign,
    worker: WorkerSpec,
    default_service_account: str = DEFAULT_WORKER_SERVICE_ACCOUNT,
    metrics: WorkerMetricsEndpoint | None = None,
    *,
    number: int = 1,
    slots: int = 1,
    pod_defaults: WorkerPodDefaults = NO_WORKER_POD_DEFAULTS,
) -> JSON:
    """One worker: `shardops worker` claims shards until none is left, then exits; `slots` of them
    at once (spec.worker.slots, or fewer for the last Job of a start), each its own claim.

    `number`: the Job's number in the campaign (`state.workers.next_worker_number`), which names it.
    A fixed name, never generateName: a create sent again after its answer was lost finds the Job it
    made (409) instead of making a second one beyond maxConcurrency.

    backoffLimit 0: a failed pod is not retried by the Job controller; retries are the scheduler's
    (backoff, attempts, breakers), and the operator starts a new Job when work remains.

    `metrics`: the pod serves /metrics on a named container port (for a PodMonitor); after the
    campaign's env, so the installation's port, the one the PodMonitor scrapes, wins.

    `pod_defaults`: the installation's pull secrets, node selector, tolerations and resources, for
    what spec.worker leaves unset.
    """
    labels = {CAMPAIGN_LABEL: campaign.name, ROLE_LABEL: WORKER_ROLE}
    env: list[JSON] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "SHARDOPS_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # WorkerSettings.campaign_uid: a worker outliving its deleted Campaign leaves a new one alone.
        *(
            [{"name": "SHARDOPS_CAMPAIGN_UID", "value": campaign.metadata.uid}]
            if campaign.metadata.uid
            else []
        ),
        # Before the campaign's env, so a campaign can still point TMPDIR elsewhere (later wins).
        {"name": "TMPDIR", "value": WORKER_TMP},
        *store_credentials_env(campaign),
        *({"name": var.name, "value": var.value} for var in worker.env),
        # The built-in LLM worker's API keys, from the Secrets its block names (never from the spec).
        # Optional: a missing Secret then fails the shard as unauthorized, naming it, instead of
        # leaving the pod unstartable.
        *(
            {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key, "optional": True}},
            }
            for name, ref in (worker.llm.api_key_env() if worker.llm else [])
        ),
        # The keys of the shared Sources the campaign's sources refer to (status.sourceShares).
        *(
            {
                "name": source_api_key_env(share.source),
                "valueFrom": {
                    "secretKeyRef": {
                        "name": share.api_key_secret.name,
                        "key": share.api_key_secret.key,
                        "optional": True,
                    }
                },
            }
            for share in campaign.current_status.source_shares
            if worker.llm is not None and share.api_key_secret is not None
        ),
        *(worker_metrics_env(metrics) if metrics is not None else []),
        # After the campaign's env: the planner counts the slots the annotation below says.
        {"name": "SHARDOPS_SLOTS", "value": str(slots)},
    ]
    container: JSON = {
        "name": "worker",
        "image": worker.image,
        "command": ["shardops", "worker", "--campaign", campaign.name],
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        # The root filesystem is read-only: the items, results and error files of each attempt go here.
        "volumeMounts": [{"name": "tmp", "mountPath": WORKER_TMP}],
    }
    if metrics is not None:
        container["ports"] = [
            {"name": WORKER_METRICS_PORT_NAME, "containerPort": metrics.port, "protocol": "TCP"}
        ]
    resources = worker_resources(worker, pod_defaults)
    if resources:
        container["resources"] = resources
    # The queue label on the Job only: Kueue admits Jobs; their pods keep the selector's labels.
    job_labels = {**labels, KUEUE_QUEUE_LABEL: worker.queue_name} if worker.queue_name else labels
    priority = {"priorityClassName": worker.priority_class_name} if worker.priority_class_name else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": worker_job_name(campaign.name, number),
            "namespace": campaign.namespace,
            "labels": job_labels,
            "annotations": {WORKER_NUMBER_ANNOTATION: str(number), WORKER_SLOTS_ANNOTATION: str(slots)},
            "ownerReferences": [owner_reference(campaign)],
        },
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": worker.service_account_name or default_service_account,
                    # The worker ServiceAccount leaves token mounting off; workers are pods that call the API.
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": WORKER_GRACE_SECONDS,
                    # The restricted Pod Security Standard, as the operator's own pod has it, so
                    # worker pods are admitted in namespaces that enforce it.
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": WORKER_UID,
                        "runAsGroup": WORKER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    **worker_pod_placement(worker, pod_defaults),
                    **priority,
                },
            },
        },
    }


# The keys of a result store's credentials Secret: the variables S3 clients read by default.
STORE_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def store_credentials_env(campaign: Campaign) -> list[JSON]:
    """Worker env from the result store's credentials Secret (never values copied into the Job)."""
    location = campaign.current_status.result_store
    if location is None or location.credentials_secret is None:
        return []
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": location.credentials_secret, "key": key}}}
        for key in STORE_CREDENTIAL_KEYS
    ]


def worker_spec_for(spec: CampaignSpec, claimable_classes: Iterable[ShardClass]) -> WorkerSpec:
    """The finalize step's image and resources when only finalize work is left; else the worker's."""
    classes = set(claimable_classes)
    if spec.finalize is not None and classes == {ShardClass.FINALIZE}:
        return spec.finalize
    return spec.worker


# --- views for logic/ ------------------------------------------------------------------------------


# --- breakers -------------------------------------------------------------------------------------


def breakers_to_status(
    spec: CampaignSpec,
    states: Mapping[str, SourceBreaker],
    reasons: Mapping[str, str],
    previous: CampaignStatus,
    now: dt.datetime,
) -> list[BreakerStatus]:
    """Every declared source (Closed ones too, so `kubectl get -o yaml` shows them) and any other
    source that has tripped, with the state the clock gives now."""
    names = list(spec.source_names)
    names += sorted(s for s in states if s not in names)
    old_reasons = {b.source: b.reason for b in previous.breakers}
    out: list[BreakerStatus] = []
    for name in names:
        b = states.get(name, CLOSED_BREAKER)
        state = effective(b, now, breakers.cooldown_of(spec, name))
        reason = reasons.get(name, old_reasons.get(name)) if state is not BreakerState.CLOSED else None
        out.append(
            BreakerStatus(
                source=name,
                state=state,
                consecutive_failures=b.consecutive_rate_limited,
                opened_at=b.opened_at,
                reason=reason,
            )
        )
    return out


# --- status ---------------------------------------------------------------------------------------


def merge_conditions(
    current: Sequence[Condition], desired: Iterable[DesiredCondition], now: dt.datetime, generation: int
) -> list[Condition]:
    """Each desired condition set by `api.common.set_condition` (the metav1 rule), others kept."""
    merged = list(current)
    for d in desired:
        merged = set_condition(
            merged,
            Condition(
                type=str(d.type),
                status=str(d.status),
                reason=d.reason,
                message=d.message[:32768],
                observed_generation=generation,
                last_transition_time=now,
            ),
        )
    return merged


@dataclass(frozen=True)
class StatusFacts:
    """What the status says beyond the aggregate of the shards."""

    generation: int
    items_total: int
    work_shards_total: int
    has_finalize: bool
    uncut_shards: int
    cut_shards: int
    materialized: int
    breakers: list[BreakerStatus]
    conditions: list[Condition]
    last_retry_generation: int
    history_folded: dict[str, int]
    history_folded_until: dt.datetime | None
    budget_limit: Decimal | None


def campaign_status(agg: Aggregate, facts: StatusFacts, previous: CampaignStatus) -> CampaignStatus:
    counts = agg.counts
    oldest = agg.oldest_pending_age
    return previous.model_copy(
        update={
            "phase": agg.phase,
            "observed_generation": facts.generation,
            "counts": ShardCounts(
                queued=counts[ShardPhase.QUEUED] + facts.uncut_shards,
                pending=counts[ShardPhase.PENDING],
                running=counts[ShardPhase.RUNNING],
                done=counts[ShardPhase.DONE],
                failed=counts[ShardPhase.FAILED],
                blocked=counts[ShardPhase.BLOCKED],
                paused=counts[ShardPhase.PAUSED],
                total=agg.total_shards,
                materialized=facts.materialized,
            ),
            "items_total": facts.items_total,
            "cut_shards": facts.cut_shards,
            "shards_total": facts.work_shards_total + (1 if facts.has_finalize else 0),
            "spent": agg.spent,
            # A ratio, not money: a float is what it is for (a fraction shown and graphed).
            "budget_ratio": float(agg.spent / facts.budget_limit) if facts.budget_limit else None,
            "breakers": facts.breakers,
            "oldest_pending_seconds": round(oldest.total_seconds(), 1) if oldest is not None else None,
            "conditions": facts.conditions,
            "blocked_shards": list(agg.blocked),
            "failed_shards": list(agg.failed),
            "last_retry_generation": facts.last_retry_generation,
            "history_folded": facts.history_folded,
            "history_folded_until": facts.history_folded_until,
        }
    )


def status_patch(previous: CampaignStatus, new: CampaignStatus) -> JSON:
    """The merge patch that makes the stored status `new`. A merge patch merges maps key by key, so a
    key `new` dropped from historyFolded (a shard folded into the ledger, or gone) is sent as null:
    without it the API server would keep the old key, and the map would grow with every shard."""
    patch = new.to_merge_patch()
    dropped = set(previous.history_folded or {}) - set(new.history_folded or {})
    if dropped:
        patch["historyFolded"] = {**(patch.get("historyFolded") or {}), **dict.fromkeys(sorted(dropped))}
    return patch


def status_differs(old: CampaignStatus | None, new: CampaignStatus) -> bool:
    """Worth a write? Everything counts except small drifts of oldestPendingSeconds (see the slack)."""
    if old is None:
        return True
    before, after = old.to_dict(), new.to_dict()
    old_age, new_age = before.pop("oldestPendingSeconds", None), after.pop("oldestPendingSeconds", None)
    if before != after:
        return True
    if (old_age is None) != (new_age is None):
        return True
    return old_age is not None and abs(float(new_age) - float(old_age)) >= OLDEST_PENDING_SLACK_SECONDS
