"""Operator configuration from the environment (prefix SHARDOPS_), read once in `main` before kopf starts.

Nothing reads these at import time: the handlers are registered by `handlers.register(registry,
settings, ...)` after the settings exist, so a tick interval from the environment really applies.
"""

from __future__ import annotations

import json
import socket
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from shardops import API_GROUP
from shardops.api.store import (
    MAX_RETENTION_SECONDS,
)
from shardops.api.worker import PullSecretReference, ResourceRequirements, Toleration
from shardops.clock import ClockSkewSettings
from shardops.scheduler.builders import (
    DEFAULT_WORKER_SERVICE_ACCOUNT,
    WorkerMetricsEndpoint,
    WorkerPodDefaults,
)
from shardops.state import observe
from shardops.store.installation import InstallationStore

REPORTING_CONTROLLER = f"{API_GROUP}/operator"


def _hostname() -> str:
    return socket.gethostname()


class OperatorSettings(ClockSkewSettings, InstallationStore):
    """Defaults suit a cluster; the e2e tests shorten the tick and the leader lease through the env."""

    model_config = SettingsConfigDict(env_prefix="SHARDOPS_", extra="ignore", populate_by_name=True)

    tick_seconds: float = Field(
        default=5.0, gt=0, le=3600, description="Interval of the campaign-level periodic reconcile."
    )
    # Short, because a pass is what tops the backlog up: a cut is bounded by backlogRatio x running,
    # so a campaign of short shards (few Running at any instant) gets at most that many new ones per
    # pass, and its throughput is about backlogRatio x running / this interval (Little's law: running
    # = throughput x time Running). At 1 s a zero-work campaign ran at 4.7 shards/s; at 0.25 s the
    # passes' own length (each O(window)) spaces them instead (benchmarks/, "versus").
    min_reconcile_interval_seconds: float = Field(
        default=0.25,
        ge=0,
        le=60,
        description="Shard changes closer together than this share one reconcile of their campaign.",
    )
    reconcile_threads: int = Field(
        default=16,
        ge=1,
        le=256,
        description=(
            "Threads for reconcile passes (kopf's sync handlers and the periodic tick): about the "
            "number of campaigns that may be reconciling at the same moment."
        ),
    )
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces to watch, comma-separated or a JSON list; empty means the whole cluster.",
    )
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of /metrics and /healthz; 0 picks a free port."
    )
    metrics_host: str = Field(default="0.0.0.0", description="Address /metrics and /healthz listen on.")
    kubeconfig: str | None = Field(
        default=None, description="Kubeconfig path; default: in-cluster config, else $KUBECONFIG."
    )
    identity: str = Field(
        default_factory=_hostname,
        validation_alias=AliasChoices("SHARDOPS_IDENTITY", "SHARDOPS_POD_NAME", "POD_NAME", "identity"),
        min_length=1,
        max_length=253,
        description="This replica's name in the leader Lease and in Events: the pod name, else the hostname.",
    )
    pod_uid: str | None = Field(
        default=None,
        validation_alias=AliasChoices("SHARDOPS_POD_UID", "POD_UID", "pod_uid"),
        description=(
            "metadata.uid of this replica's pod (downward API). With it a restarted container takes the "
            "leader Lease its dead predecessor in the same pod held at once, instead of after a lease."
        ),
    )
    leader_election: bool = Field(
        default=True, description="false: reconcile without a leader Lease (one replica only)."
    )
    leader_election_lease_name: str = Field(default="shardops-operator", min_length=1, max_length=253)
    leader_election_namespace: str = Field(
        default="default",
        validation_alias=AliasChoices(
            "SHARDOPS_LEADER_ELECTION_NAMESPACE", "POD_NAMESPACE", "leader_election_namespace"
        ),
        min_length=1,
        description="Namespace of the leader Lease: the operator's own (POD_NAMESPACE) in a cluster.",
    )
    leader_election_lease_seconds: int = Field(
        default=15,
        ge=3,
        le=300,
        description="A leader silent this long is replaced; takeover takes at most this plus one retry.",
    )
    leader_election_renew_seconds: float = Field(
        default=5.0, gt=0, description="How often the leader renews its Lease."
    )
    leader_election_retry_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often a standby looks at the Lease (and a failed renewal is retried).",
    )
    loop_stall_seconds: float = Field(
        default=20.0,
        gt=0,
        description="An event loop silent this long counts as frozen: /healthz fails, renewals stop.",
    )
    worker_pending_grace_seconds: float = Field(
        default=observe.DEFAULT_PENDING_GRACE.total_seconds(),
        gt=0,
        description="A worker pod Pending this long (or Unschedulable) is stuck: the cluster is full.",
    )
    allow_campaigns_in_operator_namespace: bool = Field(
        default=False,
        description=(
            "Run Campaigns of the operator's own namespace (leader_election_namespace) too. Off: they are "
            "refused (InOperatorNamespace), since their workers could take the leader Lease there; the "
            "chart's workers.allowReleaseNamespace turns it on, for single-namespace sandboxes."
        ),
    )
    worker_service_account: str = Field(
        default=DEFAULT_WORKER_SERVICE_ACCOUNT,
        min_length=1,
        description="ServiceAccount of worker pods when spec.worker.serviceAccountName is unset.",
    )
    # The chart's workers.imagePullSecrets, .nodeSelector, .tolerations, .resources (JSON), checked
    # with the Campaign's own models: a value a Campaign could not carry stops the operator at start.
    worker_image_pull_secrets: list[PullSecretReference] = Field(
        default_factory=list, description="Worker pods' imagePullSecrets unless spec.worker sets them."
    )
    worker_node_selector: dict[str, str] = Field(
        default_factory=dict, description="Worker pods' nodeSelector unless spec.worker sets one."
    )
    worker_tolerations: list[Toleration] = Field(
        default_factory=list, description="Worker pods' tolerations unless spec.worker sets them."
    )
    worker_resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Worker containers' requests and limits unless spec.worker.resources sets any.",
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "Worker pods serve their shardops_worker_* figures on /metrics at this port (a container "
            "port named metrics, for a PodMonitor); unset: worker pods serve no metrics."
        ),
    )
    worker_metrics_linger_seconds: float | None = Field(
        default=None,
        ge=0,
        le=600,
        description=(
            "How long an exiting worker waits for one scrape of its final figures (the worker's "
            "SHARDOPS_METRICS_LINGER_SECONDS); unset: the worker's default."
        ),
    )
    result_retention_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETENTION_SECONDS,
        description=(
            "Keep a finished campaign's S3 results this long, then delete them once no Campaign of "
            "its name exists (spec.resultStore.retentionSeconds overrides it); unset: until purged."
        ),
    )
    retention_sweep_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How often the leader looks for results past their retention (one LIST of the records).",
    )
    log_level: str = Field(default="INFO")

    def operator_namespace_problem(self, namespace: str, campaign: str) -> str | None:
        """Why the Campaign `campaign` of `namespace` is refused, or None: the operator runs no campaign
        beside its own leader Lease, which a worker's command there could take (docs/security.md)."""
        if self.allow_campaigns_in_operator_namespace or namespace != self.leader_election_namespace:
            return None
        return (
            f"Campaign {campaign} is in namespace {namespace}, where the shardops operator runs: its workers "
            "would run your command beside the operator's leader Lease and could take it over. Apply the "
            "Campaign in a team namespace the operator watches (chart values watch.namespaces and "
            "workers.namespaces); only a single-namespace sandbox sets workers.allowReleaseNamespace=true"
        )

    def worker_pod_defaults(self) -> WorkerPodDefaults:
        """The installation's worker pod placement, for what a Campaign's spec.worker leaves unset."""
        return WorkerPodDefaults(
            image_pull_secrets=tuple(ref.name for ref in self.worker_image_pull_secrets),
            node_selector=dict(self.worker_node_selector),
            tolerations=tuple(t.to_dict() for t in self.worker_tolerations),
            resources={k: v for k, v in self.worker_resources.to_dict().items() if v},
        )

    def worker_metrics(self) -> WorkerMetricsEndpoint | None:
        """Where worker pods serve /metrics, or None when they serve none."""
        if self.worker_metrics_port is None:
            return None
        return WorkerMetricsEndpoint(self.worker_metrics_port, self.worker_metrics_linger_seconds)

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        # Both spellings: "a,b" by hand, and a JSON list as the chart renders it ('[]', '["a","b"]').
        if isinstance(value, str) and value.strip().startswith("["):
            return json.loads(value)
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _renew_within_lease(self) -> OperatorSettings:
        # A leader must renew several times per lease, or one slow request costs it the leadership.
        if self.leader_election_renew_seconds * 2 >= self.leader_election_lease_seconds:
            raise ValueError(
                "SHARDOPS_LEADER_ELECTION_RENEW_SECONDS must be less than half of "
                "SHARDOPS_LEADER_ELECTION_LEASE_SECONDS"
            )
        return self

    @property
    def renew_deadline_seconds(self) -> float:
        """How long a leader keeps acting without a successful renewal: two thirds of the lease, so it
        stops before a standby (which waits the whole lease) can take over."""
        return self.leader_election_lease_seconds * 2 / 3
