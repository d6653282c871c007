"""How a campaign's worker pods run: image, command, environment, resources, slots."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
)

from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    Quantity,
    SpecModel,
)
from shardops.api.enums import Workload
from shardops.api.llm import LlmSpec
from shardops.api.names import DNS_LABEL_MAX

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A DNS-1123 label: a LocalQueue's name as a label value (at most 63 characters).
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# The most slots (shards at once) of one worker pod: its threads share one process's GIL, so past a
# few dozen they add waiting, not throughput.
MAX_WORKER_SLOTS = 64
# The command of the built-in LLM worker (spec.worker.llm), as the Campaign spells it.
LLM_COMMAND = ("shardops", "llm")
# In a persistent command's environment from its start: it reads its shards' requests from stdin
# (spec.worker.persistent's protocol; `shardops llm` speaks it too).
PERSISTENT_ENV = "SHARDOPS_PERSISTENT"
# Slots a pod of I/O-bound work (spec.worker.workload IOBound, the built-in LLM worker's default)
# gets when spec.worker.slots and spec.worker.resources are both unset. Its shards wait on other
# systems (a fraction of a core each), so one pod's start, API client and watches serve 8 of them,
# and pods stay few on any cluster (spreading an I/O-bound call over nodes buys it nothing). Not
# when resources are set: those were sized for one command per pod (the documented rule is "what
# one command needs x slots"), and 8 commands could outgrow them. CPU-bound (or undeclared) work
# keeps one slot a pod: on a cluster of many nodes its pods spread over them; packed 8 to a pod
# without requests they would crowd one node.
IO_BOUND_DEFAULT_SLOTS = 8


class EnvVar(SpecModel):
    """An environment variable for the worker's command."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str = Field(default="", max_length=32768, description='Variable value. Default "".')


class ResourceRequirements(SpecModel):
    """CPU and memory for each worker pod, as in a core/v1 container."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description=(
            'Resources reserved per worker pod, for example {cpu: "500m", memory: 256Mi}. Default none.'
        ),
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Resources a worker pod may use at most, for example {memory: 1Gi}. Default none.",
    )


# Bounds of the pod placement fields: what a real spec needs, far below what would load the Job.
MAX_PULL_SECRETS = 16

MAX_NODE_SELECTOR = 32

MAX_TOLERATIONS = 32

LABEL_VALUE_MAX = 63

QUALIFIED_NAME_MAX = 317  # a label or taint key: prefix (DNS subdomain, 253) + "/" + name (63)


class PullSecretReference(SpecModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the campaign's namespace."""

    name: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Secret holding the registry credentials.",
    )


class Toleration(SpecModel):
    """A core/v1 Toleration of the worker pods: lets them run on nodes with a matching taint."""

    key: str | None = Field(
        default=None,
        max_length=QUALIFIED_NAME_MAX,
        description="Taint key the toleration matches. Empty with operator Exists: every taint.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists (any value) or Equal (value below). Default: Equal."
    )
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, description="Taint value matched with operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect matched. Empty: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        description="With effect NoExecute: how long the pod stays bound after the taint appears.",
    )


class WorkerSpec(SpecModel):
    """The command that processes items, and the pod it runs in."""

    image: str = Field(
        min_length=1,
        max_length=4096,
        description=(
            "Container image of the worker pods. It must contain the shardops worker runtime and the command."
        ),
    )
    command: list[Annotated[str, Field(max_length=4096)]] = Field(
        min_length=1,
        max_length=64,
        description=(
            "Command that processes one shard, run by the shardops worker runtime: it reads the items "
            "from the JSONL file $SHARDOPS_ITEMS_FILE and appends one JSON result line per item to "
            "$SHARDOPS_RESULTS_FILE. Exit 0 means done; exit 75 or $SHARDOPS_ERROR_FILE with a "
            "retryable class means retry later."
        ),
    )
    args: list[Annotated[str, Field(max_length=32768)]] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments appended to command. Default none.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Environment variables for the command. Default none.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory requests and limits of each worker pod. Default none.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "ServiceAccount the worker pods run as; it needs the shardops worker role. "
            "Default: the one the shardops chart installs."
        ),
    )
    image_pull_secrets: list[PullSecretReference] | None = Field(
        default=None,
        max_length=MAX_PULL_SECRETS,
        description=(
            "Secrets (in the campaign's namespace) the worker pods pull image with, for a private "
            "registry. Default: the chart's workers.imagePullSecrets."
        ),
    )
    node_selector: dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]] | None = Field(
        default=None,
        max_length=MAX_NODE_SELECTOR,
        description=(
            "Node labels the worker pods must run on, for example {pool: batch}. "
            "Default: the chart's workers.nodeSelector."
        ),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        max_length=MAX_TOLERATIONS,
        description=(
            "Taints the worker pods tolerate (for nodes reserved for batch work). "
            "Default: the chart's workers.tolerations."
        ),
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_LABEL_MAX,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "Kueue LocalQueue (in the campaign's namespace) the worker Jobs are admitted through: each "
            "Job is labelled kueue.x-k8s.io/queue-name, Kueue keeps it suspended until the queue's "
            "ClusterQueue has quota for its pod, and the campaign says it waits for quota (condition "
            "WaitingForQuota) meanwhile, starting no further Jobs. Default: none, Jobs start at once."
        ),
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "PriorityClass of the worker pods; with queueName, also the priority Kueue queues and "
            "preempts the worker Jobs by. Default: none (the cluster's default priority)."
        ),
    )
    llm: LlmSpec | None = Field(
        default=None,
        description=(
            "Settings of the built-in LLM worker: set command to [shardops, llm] and describe the request "
            "here (endpoint, model, templated messages, prices). Default: none, the command is your own."
        ),
    )
    results_version: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "Any text, part of the idempotency key of every shard this worker runs, like the image, "
            "command, args and env: a campaign applied again with another value computes those shards "
            "again instead of reusing stored results (for example after an image was re-pushed under "
            "the same tag). Shards already cut keep their key. Default: none."
        ),
    )

    def full_command(self) -> list[str]:
        """command followed by args, as the worker runtime executes it."""
        return [*self.command, *self.args]

    def env_dict(self) -> dict[str, str]:
        """env as a mapping; a later entry wins over an earlier one of the same name, as in a pod."""
        return {var.name: var.value for var in self.env}

    def identity(self) -> dict[str, Any]:
        """What the idempotency key takes of the worker: what decides a result, so a change of any of
        it computes again and a change of the rest of the worker reuses stored results.

        In: the image as written (a tag re-pushed with other content is the same text: pin a
        digest, or change resultsVersion); command + args; env as name=value pairs, a later
        duplicate winning as in a pod, so the order of distinct names does not matter. The whole
        env, worker settings such as SHARDOPS_CLAIM_CANDIDATES included: the command sees all of it,
        and a variable it reads cannot be told from one it ignores. env holds literal values only
        (EnvVar has no valueFrom), so nothing in it is read from a Secret or ConfigMap behind the
        key's back. Also in: the LLM requests the built-in worker makes (`LlmSpec.identity`) and
        resultsVersion, which exists only to be in the key.
        Out: what changes how or where the work runs, or what it costs, not its result: the LLM
        prices, timeout and API-key Secrets, resources, serviceAccountName, imagePullSecrets,
        nodeSelector, tolerations, queueName, priorityClassName, and spec.worker's
        persistent and slots (one process serving many shards, or several at once, computes what
        one process per shard does)."""
        identity: dict[str, Any] = {
            "image": self.image,
            "command": self.full_command(),
            "env": self.env_dict(),
        }
        if self.llm is not None:
            identity["llm"] = self.llm.identity()
        if self.results_version is not None:
            identity["resultsVersion"] = self.results_version
        return identity


class ItemsWorkerSpec(WorkerSpec):
    """spec.worker: the worker of the work shards, which may keep its command running from shard to
    shard. spec.finalize is a plain WorkerSpec: the closing step runs once, a process kept for a next
    shard would serve none."""

    # Unset, not false, by default: a CRD default would write the field into every Campaign, and worker
    # images of earlier releases (their models forbid unknown fields) could no longer read any.
    persistent: bool | None = Field(
        default=None,
        description=(
            "Keep one process of the command per worker pod, serving shard after shard, instead of "
            "starting it for every shard: no interpreter start and imports per shard, and connections, "
            "clients and rate-limit state kept. The command must speak the persistent protocol: started "
            "with SHARDOPS_PERSISTENT=1, it reads one JSON line {shard, env} per shard from stdin, runs "
            "that shard with env's SHARDOPS_* variables exactly as a command started for it would, then "
            'writes one line {"shard": <its name>, "exit": <the exit code such a run would have>} to '
            "stdout (its logs go to stderr); end of input ends it. A crash or a stop (stall, lost lease, "
            "cost cap, shutdown) ends the process, and the next shard starts a new one. Not part of the "
            "idempotency key: it changes how the command runs, not its results. Default: unset, which is "
            "on for the built-in LLM worker (command [shardops, llm] without args, which speaks the "
            "protocol: an interpreter start per shard would cost more than most requests) and a process "
            "per shard for any other command (shardops cannot know whether it speaks the protocol)."
        ),
    )
    # Unset by default, for the reason persistent is.
    slots: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKER_SLOTS,
        description=(
            "Shards one worker pod runs at once: its slots, each claiming, heartbeating and running its "
            "own shard (and its own command process) under its own Lease holder identity, all in one "
            "worker process sharing its start, API client and watches. A pod start costs the same for "
            "1 slot or 16, so short shards and calls that mostly wait (LLM requests) go further per "
            "core with more slots. maxConcurrency still caps the running shards of the campaign; the "
            "operator starts ceil(slots wanted / slots) pods. resources are per pod: size them for "
            "`slots` commands at once. The pod exits when none of its slots found a claimable shard "
            "for idleSeconds. Not part of the idempotency key. Default: unset, which is 8 when workload is "
            "IOBound and resources are unset (shards that mostly wait need a fraction of a core each) "
            "and 1 otherwise (CPU-bound work spreads over the nodes one pod each; resources set were "
            "sized for one command)."
        ),
    )

    # Unset by default, for the reason persistent is.
    workload: Workload | None = Field(
        default=None,
        description=(
            "What the shards mostly do, the hint slots default from: IOBound (waiting on other systems: "
            "HTTP and LLM calls, object storage) or CPUBound (computing). Only defaults follow from it; "
            "slots set explicitly win. Not part of the idempotency key. Default: unset, which is IOBound "
            "for the built-in LLM worker (spec.worker.llm) and CPUBound for any other command."
        ),
    )

    def work_kind(self) -> Workload:
        """spec.worker.workload; unset, IOBound for the built-in LLM worker, else CPUBound."""
        if self.workload is not None:
            return self.workload
        return Workload.IO_BOUND if self.llm is not None else Workload.CPU_BOUND

    def slots_per_pod(self) -> int:
        """spec.worker.slots; unset, what the work is decides (IO_BOUND_DEFAULT_SLOTS, else 1)."""
        if self.slots is not None:
            return self.slots
        sized = bool(self.resources.requests or self.resources.limits)
        if self.work_kind() is Workload.IO_BOUND and not sized:
            return IO_BOUND_DEFAULT_SLOTS
        return 1

    def runs_persistent(self) -> bool:
        """spec.worker.persistent; unset, on for the built-in LLM worker's own command (it speaks the
        protocol), off for any other (whether it does is not shardops's to guess)."""
        if self.persistent is not None:
            return self.persistent
        return tuple(self.full_command()) == LLM_COMMAND
