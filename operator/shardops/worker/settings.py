"""Worker configuration from the environment (prefix SHARDOPS_), as the operator's Jobs set it."""

from __future__ import annotations

import os
import secrets
import socket
from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from shardops.api.worker import MAX_WORKER_SLOTS
from shardops.clock import ClockSkewSettings

# In-cluster, the namespace of the pod's service account: the usual fallback when the Job does not
# set SHARDOPS_NAMESPACE.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
IDENTITY_MAX = 253
_SUFFIX_CHARS = 6
# Room for a slot's suffix ("-63") after the process's identity.
_SLOT_CHARS = 3


class WorkerSettings(ClockSkewSettings):
    """Everything not taken from the Campaign. The campaign's own settings (lease, heartbeat, idle
    time, attempts, backoff) come from its spec, so all workers of a campaign agree on them."""

    model_config = SettingsConfigDict(env_prefix="SHARDOPS_", extra="ignore", populate_by_name=True)

    namespace: str | None = Field(
        default=None, description="Namespace of the campaign; default: the service account's, else default."
    )
    pod_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("POD_NAME", "SHARDOPS_POD_NAME"),
        description="Base of the holder identity (the Job sets it from the downward API).",
    )
    campaign_uid: str | None = Field(
        default=None,
        description=(
            "The uid of the Campaign whose Job started this worker (the Job sets it). A Campaign of "
            "the same name with another uid is a new one applied after that was deleted: the worker "
            "exits instead of working for it with the deleted one's image and settings."
        ),
    )
    idle_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Exit after this long without a claimable shard; default: spec.idleSeconds.",
    )
    result_max_bytes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Size cap of a shard's stored result (and item results); default: the store's own "
            "(900 KiB for ConfigMaps, 256 MiB for S3)."
        ),
    )
    store_retry_seconds: float = Field(
        default=120.0,
        ge=0,
        description=(
            "How long a worker keeps its claim and retries while the result store is unreachable "
            "before it records the attempt as failed (class unavailable)."
        ),
    )
    claim_candidates: int = Field(
        default=5,
        ge=1,
        description="Pick at random among the first K claimable shards so workers spread out.",
    )
    poll_seconds: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Wait between looks for a claimable shard. With watches a worker also looks as soon as a "
            "shard appears, changes phase or finishes; the poll catches what only the clock changes "
            "(a backoff ending, a lease running out)."
        ),
    )
    watch: bool = Field(
        default=True,
        description=(
            "Keep the campaign and its unfinished shards current through watches, so a look for work "
            "costs the API server no request; false: read them (a GET and a list) on every look."
        ),
    )
    tick_seconds: float = Field(
        default=0.1,
        gt=0,
        description=(
            "How often the command's results file is read; its exit (and a persistent command's "
            "answer) ends the wait at once."
        ),
    )
    term_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        description="On shutdown, how long the command may take to exit after SIGTERM before SIGKILL.",
    )
    work_dir: Path | None = Field(default=None, description="Where per-attempt temp dirs go; default TMPDIR.")
    keep_work_dir: bool = Field(default=False, description="Keep per-attempt dirs for debugging.")
    max_shards: int = Field(
        default=0, ge=0, description="Exit after this many shards (each slot); 0 means no limit."
    )
    slots: int = Field(
        default=1,
        ge=1,
        le=MAX_WORKER_SLOTS,
        description=(
            "Shards this process runs at once (spec.worker.slots; the operator's Job sets it): each "
            "slot claims, heartbeats and runs its own under its own holder identity."
        ),
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "Serve the worker's Prometheus figures (shardops_worker_*) on /metrics at this port; 0 "
            "picks a free one (logged as event metrics-serving). Unset: no endpoint. The operator "
            "sets it on worker pods when SHARDOPS_WORKER_METRICS_PORT is set."
        ),
    )
    metrics_host: str = Field(default="0.0.0.0", description="Address /metrics listens on.")
    metrics_linger_seconds: float = Field(
        default=30.0,
        ge=0,
        le=600,
        description=(
            "With a metrics port: after the last shard, keep serving /metrics until one scrape has "
            "read the final figures, at most this long (SIGTERM ends it at once); 0: exit at once. "
            "Keep it above the scrape interval."
        ),
    )
    log_level: str = Field(default="INFO")

    @cached_property
    def identity(self) -> str:
        """The Lease holder identity: pod name (or host-pid) plus a random suffix, unique per process,
        so two processes in one pod (or a restarted container) never pass for each other."""
        base = self.pod_name or f"{socket.gethostname()}-{os.getpid()}"
        suffix = secrets.token_hex(_SUFFIX_CHARS // 2)
        return f"{base[: IDENTITY_MAX - _SUFFIX_CHARS - 1 - _SLOT_CHARS]}-{suffix}"

    def identity_of(self, slot: int) -> str:
        """A slot's holder identity: the process's for slot 0 (a worker of one slot holds as every
        worker did), with the slot's number after it for the others. Unique per slot and process."""
        return self.identity if slot == 0 else f"{self.identity}-{slot}"

    def resolved_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
