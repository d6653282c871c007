"""The Campaign resource: a body of work, how to run it, and how it is going.

The defaults in this module are the only ones: the CRD's `default:` values are generated from
them, and the operator parses every object through these models.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    computed_field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    SOURCE_NAME_MAX,
    SOURCE_NAME_PATTERN,
    Condition,
    Item,
    Quantity,
    ResourceModel,
    SourceName,
    SpecModel,
    StatusModel,
    TokenCounts,
    cel_rules,
    find_condition,
    keeping_first,
    schema_default,
    set_condition,
    truncating,
    without_inline_items,
)
from shardops.api.enums import BreakerState, CampaignPhase, StallPolicy, StoreType
from shardops.api.llm import CONFIG_ENV, LlmSpec
from shardops.api.names import CAMPAIGN_KIND

# Inline items are stored in the Campaign object (etcd caps objects at ~1.5 MiB) and the
# API server's CEL cost estimate needs a bound; bigger campaigns use itemsFrom.
MAX_INLINE_ITEMS = 10000
MAX_SOURCES = 32
# Bounds the lists of shard names in the status; the counts carry the full numbers.
MAX_LISTED_SHARDS = 50
BREAKER_REASON_MAX = 1024
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
CONFIGMAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# S3 bucket naming rules (lowercase, digits, dots, hyphens; 3-63 characters).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
PREFIX_PATTERN = r"^[A-Za-z0-9!_.*'()/-]*$"
DEFAULT_S3_PREFIX = "shardops"
# The ConfigMap store's ceiling: two ConfigMaps of results (and a small pointer) per shard in etcd,
# which has a 2 GiB default quota for the whole cluster and keeps every object in the API server's
# memory. Beyond this many work shards a campaign needs an S3 store.
CONFIGMAP_STORE_MAX_SHARDS = 1000
# Ten years: longer is "forever", which is what leaving the retention unset says.
MAX_RETENTION_SECONDS = 10 * 365 * 24 * 3600
# The most slots (shards at once) of one worker pod: its threads share one process's GIL, so past a
# few dozen they add waiting, not throughput.
MAX_WORKER_SLOTS = 64
# The largest spec.errorThreshold.window: the status keeps that many folded completions.
MAX_ERROR_WINDOW = 1000


# --- Bounds on a campaign's items: every one a tenant's input, read by the shared operator ---------
# The largest object `itemsFrom.object` may name, compressed or not: the operator reads it as a
# stream (memory bounded by the window), but a campaign's input this large is a mistake to refuse
# before it costs hours of counting.
MAX_ITEMS_OBJECT_BYTES = 64 * 1024**3
# The longest line of items (bytes, UTF-8, without its newline) any reader holds: lines are split as
# the bytes stream in, so one line is all the memory an input costs. An item is carried by its Shard,
# whose items may take 1 MiB (logic.shard_items): a longer line could never be cut into a shard.
MAX_ITEM_LINE_BYTES = 1024 * 1024
# The most bytes a gzip object may inflate to: the same ceiling as an uncompressed object, so that
# compressing an input never lets more through than uploading it plain.
MAX_ITEMS_DECOMPRESSED_BYTES = MAX_ITEMS_OBJECT_BYTES
# The most a gzip input may inflate per byte, once past GZIP_RATIO_GRACE_BYTES of output. JSONL
# compresses 5-20 times, repetitive JSONL about 100; a decompression bomb inflates ~1000 times, so it
# is refused after reading a few MiB, before it costs minutes of the operator's CPU.
MAX_GZIP_RATIO = 200
GZIP_RATIO_GRACE_BYTES = 8 * 1024 * 1024
# The most items of one itemsFrom ConfigMap: the operator holds them parsed (a Python object each)
# for the campaign's whole run, and a 1 MiB ConfigMap of `{}` lines would be 350,000 objects.
MAX_CONFIGMAP_ITEMS = 100_000
# The most items of one itemsFrom object: each (re)read counts them all, and the finalize shard reads
# them once more; past ten million, split the input into several campaigns.
MAX_OBJECT_ITEMS = 10_000_000
# How deep an item's JSON may nest: Python's parser recurses per level, so a line of 100,000 `[`
# would raise RecursionError (not a ValueError) in the middle of the operator's pass.
MAX_ITEM_DEPTH = 64
# The schema an item's `source` key must meet: the Shard's spec.source (api.shard), which the API
# server checks on every shard cut from it.
ITEM_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": SOURCE_NAME_MAX,
    "pattern": SOURCE_NAME_PATTERN,
}


class ItemsOverLimit(ValueError):
    """An input of items passes one of the bounds above: the message names the input, the line (or
    the count) and the limit, and goes on the campaign's Ready condition as is."""

    def __init__(self, where: str, what: str, limit: int, fix: str, unit: str = "") -> None:
        super().__init__(f"{where}: {what}, over the limit of {limit:,}{unit}: {fix}")
        self.where = where
        self.limit = limit


class ItemsObject(SpecModel):
    """An object of JSONL items in the campaign's S3 result store (or another bucket of it)."""

    key: str = Field(
        min_length=1,
        max_length=1024,
        description=(
            "Object key, for example inputs/survey.jsonl.gz: one JSON object (item) per line, blank lines "
            "skipped; gzip-compressed when it ends in .gz (or its bytes start with the gzip magic)."
        ),
    )
    bucket: str | None = Field(
        default=None,
        min_length=3,
        max_length=63,
        pattern=BUCKET_PATTERN,
        description="Bucket of the object. Default: the campaign's result store bucket.",
    )


def parse_item_line(line: str, number: int, where: str) -> Item | None:
    """One JSONL line as an item (None for a blank line); ValueError naming `where` and the line
    (ItemsOverLimit for a line too long or nested too deep)."""
    if not line.strip():
        return None
    if len(line) > MAX_ITEM_LINE_BYTES:  # characters: a bound below the bytes, checked cheaply
        raise line_too_long(where, number, None)
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{where} line {number}: not valid JSON ({error.msg}); write one JSON object per line"
        ) from None
    except RecursionError:
        raise _too_deep(where, number) from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} line {number}: an item must be a JSON object, got {type(value).__name__}")
    if _depth(value) > MAX_ITEM_DEPTH:
        raise _too_deep(where, number)
    problem = item_source_problem(value)
    if problem is not None:
        raise ValueError(f"{where} line {number}: {problem}")
    return value


def line_too_long(where: str, number: int, index: int | None) -> ItemsOverLimit:
    """The line `number` (item `index`, when known) is longer than MAX_ITEM_LINE_BYTES."""
    item = "the item" if index is None else f"item {index}"
    return ItemsOverLimit(
        f"{where} line {number}",
        f"{item} alone is longer than one item may be",
        MAX_ITEM_LINE_BYTES,
        "an item is carried by its Shard: keep large payloads in object storage and pass their keys as items",
        unit=" bytes",
    )


def _too_deep(where: str, number: int) -> ItemsOverLimit:
    return ItemsOverLimit(
        f"{where} line {number}",
        "the item nests deeper than the levels of JSON an item may have",
        MAX_ITEM_DEPTH,
        "flatten the item",
    )


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (bounded by the line's length)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_ITEM_DEPTH:
            return deepest
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def item_source_problem(item: Mapping[str, Any]) -> str | None:
    """Why an item's `source` key could not name the source of its Shard (ITEM_SOURCE_SCHEMA), or
    None. Checked on every input path, so a shard the API server would refuse is never cut."""
    if "source" not in item:
        return None
    source = item["source"]
    if not isinstance(source, str):
        return f"source must be a string (a source name), got {type(source).__name__}"
    if not 1 <= len(source) <= SOURCE_NAME_MAX or re.fullmatch(SOURCE_NAME_PATTERN, source) is None:
        shown = source if len(source) <= 80 else source[:80] + "..."
        return (
            f"source {shown!r} is not a source name: 1 to {SOURCE_NAME_MAX} letters, digits, '-', '_' "
            f"or '.', starting and ending with a letter or digit ({SOURCE_NAME_PATTERN})"
        )
    return None


def check_inline_items(items: Sequence[Item]) -> None:
    """ValueError naming the first inline item (spec.items[i]) whose source is refused: the CRD
    refuses it at admission, but a campaign stored under an older CRD may still hold one."""
    for index, item in enumerate(items):
        problem = item_source_problem(item)
        if problem is not None:
            raise ValueError(f"spec.items[{index}]: {problem}")


class ItemsFrom(SpecModel):
    """Where to read the campaign's items when they are too many to list inline: a ConfigMap key
    (at most 1 MiB in all) or an object in the S3 result store (any size, read as a stream)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(rules.ITEMS_FROM_ONE_SOURCE, rules.ITEMS_FROM_CONFIGMAP_KEY)
    )

    config_map_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of a ConfigMap in the campaign's namespace.",
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=CONFIGMAP_KEY_PATTERN,
        description=(
            "Key in that ConfigMap whose value is JSONL: one JSON object (item) per line, "
            "blank lines skipped."
        ),
    )
    object: ItemsObject | None = Field(
        default=None,
        description=(
            "An object in the result store (S3) holding the items as JSONL, optionally gzip-compressed; "
            "kubectl campaign apply --items FILE uploads a local file and sets this."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> ItemsFrom:
        if (self.object is not None) == (self.config_map_name is not None or self.key is not None):
            raise ValueError(rules.ITEMS_FROM_ONE_SOURCE.message)
        if (self.config_map_name is None) != (self.key is None):
            raise ValueError(rules.ITEMS_FROM_CONFIGMAP_KEY.message)
        return self

    def describe(self) -> str:
        if self.object is not None:
            return f"object {self.object.key}" + (
                f" in bucket {self.object.bucket}" if self.object.bucket else ""
            )
        return f"ConfigMap {self.config_map_name} key {self.key}"

    def parse_items(self, text: str) -> list[Item]:
        """The items in the ConfigMap value `text` (JSONL).

        Raises ValueError naming the ConfigMap, key and line, so the operator can put the reason
        on the campaign's Invalid condition as is.
        """
        where = f"ConfigMap {self.config_map_name} key {self.key}"
        items: list[Item] = []
        for number, line in enumerate(text.splitlines(), start=1):
            item = parse_item_line(line, number, where)
            if item is None:
                continue
            if len(items) >= MAX_CONFIGMAP_ITEMS:  # the value itself is bounded: 1 MiB a ConfigMap
                raise ItemsOverLimit(
                    f"{where} line {number}",
                    "more items than one ConfigMap may hold",
                    MAX_CONFIGMAP_ITEMS,
                    "upload the items as an object (kubectl campaign apply --items FILE) instead",
                )
            items.append(item)
        return items


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
        nodeSelector, tolerations, and spec.worker's
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
            "idempotency key: it changes how the command runs, not its results. Default: unset, a process "
            "per shard."
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
            "for idleSeconds. Not part of the idempotency key. Default: unset, one slot per pod."
        ),
    )

    def slots_per_pod(self) -> int:
        """spec.worker.slots, 1 when unset."""
        return self.slots or 1


class Backoff(SpecModel):
    """Delay before a retryable failure is retried: min(base * 2^(attempt-1), cap), with jitter."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.BACKOFF_BASE_WITHIN_CAP))

    base_seconds: float = Field(
        default=2,
        gt=0,
        le=3600,
        description=(
            "Delay after the first failed attempt, in seconds; doubles with every further attempt. Default 2."
        ),
    )
    cap_seconds: float = Field(
        default=120,
        gt=0,
        le=86400,
        description="Longest delay between attempts, in seconds. Default 120.",
    )

    @model_validator(mode="after")
    def _base_within_cap(self) -> Backoff:
        if self.base_seconds > self.cap_seconds:
            raise ValueError(rules.BACKOFF_BASE_WITHIN_CAP.message)
        return self


class Stall(SpecModel):
    """When a running shard that keeps heartbeating without progress counts as stuck."""

    policy: StallPolicy = Field(
        default=StallPolicy.REPORT,
        description=(
            "What to do with a stuck shard: Report raises an event and the Stalled condition and lets "
            "it run; Revoke also takes its lease away so another worker retries it (attempt+1). "
            "Default Report."
        ),
    )
    heartbeats: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Consecutive heartbeats without progress after which a shard is stuck. Default 2.",
    )


class RateLimit(SpecModel):
    """How much of a source all of the campaign's workers together may use per minute."""

    requests_per_minute: float | None = Field(
        default=None, gt=0, description="Requests per minute across all workers. Default: no limit."
    )
    tokens_per_minute: float | None = Field(
        default=None,
        gt=0,
        description="Tokens (prompt + completion) per minute across all workers. Default: no limit.",
    )


class Source(SpecModel):
    """An upstream the work depends on (an LLM API, a model, a site), with its own circuit breaker."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.FALLBACK_NOT_SELF))

    name: SourceName = Field(
        description="Name that items and shards refer to; letters, digits, '-', '_' and '.', at most 63."
    )
    fallback: SourceName | None = Field(
        default=None,
        description=(
            "Another declared source to use while this one's breaker is open. Default: none, shards of this "
            "source wait for the cooldown."
        ),
    )
    breaker_threshold: int = Field(
        default=3,
        ge=1,
        le=100,
        description=(
            "Consecutive rate-limited failures of this source that open its breaker and stop claiming "
            "its shards. Default 3."
        ),
    )
    cooldown_seconds: int = Field(
        default=300,
        ge=1,
        le=86400,
        description=(
            "Seconds an open breaker waits before letting one trial shard through (half-open). Default 300."
        ),
    )
    rate_limit: RateLimit | None = Field(
        default=None,
        description=(
            "Requests and tokens per minute for this source across all the campaign's workers; the "
            "built-in LLM worker paces itself to its share, limit / maxConcurrency. Default: no limit."
        ),
    )

    @model_validator(mode="after")
    def _fallback_not_self(self) -> Source:
        if self.fallback is not None and self.fallback == self.name:
            raise ValueError(rules.FALLBACK_NOT_SELF.message)
        return self


class Budget(SpecModel):
    """A spending cap in the unit the command reports cost in (for example USD or tokens)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.BUDGET_PER_SHARD_WITHIN_LIMIT))

    limit: float = Field(
        gt=0,
        description=(
            "Total cost the campaign may spend. With maxPerShard a work shard starts only while spent, plus "
            "what the running shards may still spend (maxPerShard less their cost), plus its own "
            "maxPerShard stays within limit; without it nothing bounds what the shards running at the warn "
            "ratio spend. At the limit unclaimed shards are Paused and running ones finish; that is not a "
            "failure. Work the budget holds back (condition BudgetHeld) starts again when limit is raised. "
            "Required."
        ),
    )
    warn_ratio: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description=(
            "Fraction of limit (between 0 and 1, exclusive) from which only finalize shards start and "
            "the BudgetWarning condition is set. Default 0.8."
        ),
    )
    max_per_shard: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Cost one shard may spend over all its attempts; a shard that exceeds it fails with class "
            "over-budget. Each work shard reserves it of limit when it starts, which keeps the campaign's "
            "spend within limit. At most limit. Default: no per-shard cap (and no reservation)."
        ),
    )

    @model_validator(mode="after")
    def _per_shard_within_limit(self) -> Budget:
        if self.max_per_shard is not None and self.max_per_shard > self.limit:
            raise ValueError(rules.BUDGET_PER_SHARD_WITHIN_LIMIT.message)
        return self


class S3Location(SpecModel):
    """An S3-compatible bucket (AWS S3, GCS interoperability, Ceph RGW, R2, SeaweedFS, ...)."""

    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description=(
            "URL of the S3 API, for example http://seaweedfs.storage:8333. Default: the installation's "
            "(chart value resultStore.s3.endpoint); unset there too: AWS S3 of the region."
        ),
    )
    region: str | None = Field(
        default=None, max_length=64, description="Region to sign requests for. Default: the installation's."
    )
    bucket: str | None = Field(
        default=None,
        min_length=3,
        max_length=63,
        pattern=BUCKET_PATTERN,
        description="Bucket that holds results (it must exist). Default: the installation's.",
    )
    prefix: str | None = Field(
        default=None,
        max_length=512,
        pattern=PREFIX_PATTERN,
        description=(
            "Key prefix of every object shardops writes. Default: the installation's, "
            f'else "{DEFAULT_S3_PREFIX}".'
        ),
    )
    credentials_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "Secret in the campaign's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "given to workers as environment variables. Default: the installation's; unset there too: "
            "the client's default credential chain (workload identity, instance profile)."
        ),
    )


class ResultStoreSpec(SpecModel):
    """Where this campaign keeps its results; unset fields take the installation's settings."""

    type: StoreType | None = Field(
        default=None,
        description=(
            "S3 (an object store: any result volume) or ConfigMap (zero dependencies, for small "
            f"campaigns: at most {CONFIGMAP_STORE_MAX_SHARDS} work shards and results under 900 KiB "
            "each). Default: the installation's (chart value resultStore.type)."
        ),
    )
    s3: S3Location | None = Field(default=None, description="Overrides of the installation's S3 settings.")
    retention_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETENTION_SECONDS,
        description=(
            "How long the campaign's stored results are kept after it finished (S3 store): the "
            "operator then deletes them, its ledger and uploaded inputs, once no Campaign of this "
            "name exists in the namespace (a re-applied one reuses them; its own finish restarts "
            "the clock). Default: the installation's (chart value resultStore.retentionSeconds); "
            "unset there too: kept until `kubectl campaign purge`. ConfigMap results are kept "
            "until purged."
        ),
    )


def retention_of(spec: ResultStoreSpec | None, installation: int | None) -> int | None:
    """The campaign's result retention: its own, else the installation's (None: until purged)."""
    own = spec.retention_seconds if spec is not None else None
    return own if own is not None else installation


class ResultStoreStatus(StatusModel):
    """The result store a campaign uses, fixed when the operator first sees it: later changes of
    the installation's defaults do not split one campaign's results across stores."""

    type: StoreType = Field(description="S3 or ConfigMap.")
    endpoint: str | None = Field(default=None, description="S3 API URL; unset: AWS S3.")
    region: str | None = Field(default=None, description="Region requests are signed for.")
    bucket: str | None = Field(default=None, description="Bucket of the results.")
    prefix: str = Field(default=DEFAULT_S3_PREFIX, description="Key prefix of every object.")
    credentials_secret: str | None = Field(
        default=None, description="Secret workers get S3 credentials from; unset: the default chain."
    )


def resolve_result_store(spec: ResultStoreSpec | None, installation: ResultStoreStatus) -> ResultStoreStatus:
    """The campaign's store: its own settings over the installation's, field by field.

    `installation` carries the installation's S3 settings whatever its default type, so a campaign
    may choose S3 on an installation whose default is ConfigMap.
    """
    kind = (spec.type if spec is not None else None) or installation.type
    if kind is StoreType.CONFIG_MAP:
        return ResultStoreStatus(type=kind)
    own = (spec.s3 if spec is not None else None) or S3Location()
    return ResultStoreStatus(
        type=kind,
        endpoint=own.endpoint or installation.endpoint,
        region=own.region or installation.region,
        bucket=own.bucket or installation.bucket,
        prefix=own.prefix if own.prefix is not None else installation.prefix,
        credentials_secret=own.credentials_secret or installation.credentials_secret,
    )


class ErrorThreshold(SpecModel):
    """When the campaign stops claiming because its attempts keep failing for good (a broken
    template, a revoked key), instead of spending shard after shard on the same mistake."""

    consecutive: int = Field(
        default=5,
        ge=0,
        le=10000,
        description=(
            "Non-retryable failures in a row (no shard Done between them) that hold the campaign; "
            "0 turns this rule off. Default 5."
        ),
    )
    ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "Share of the last window attempts that failed non-retryably above which the campaign is "
            "held; 1 turns this rule off. Default 0.5."
        ),
    )
    window: int = Field(
        default=20,
        ge=1,
        le=MAX_ERROR_WINDOW,
        description="Latest attempts the ratio is taken over (it waits for that many). Default 20.",
    )


MAX_RETRY_SHARDS = 1000


class RetryRequest(SpecModel):
    """A recorded request to retry the shards that gave up."""

    generation: int = Field(
        default=0,
        ge=0,
        description=(
            "Increase by one to retry the Blocked and Failed shards (all of them, or those in shards) "
            "once, with their attempts reset. The operator acts once per value and records it in "
            "status.lastRetryGeneration. Default 0."
        ),
    )
    shards: list[Annotated[str, Field(min_length=1, max_length=DNS_SUBDOMAIN_MAX)]] | None = Field(
        default=None,
        max_length=MAX_RETRY_SHARDS,
        description=(
            "Names of the Blocked/Failed shards to retry with this generation; unset or empty: all of "
            "them. A listed shard that is not Blocked or Failed is skipped (the operator's event says so). "
            "Written by kubectl campaign retry --shard/--blocked/--failed together with the generation."
        ),
    )


class CampaignSpec(SpecModel):
    """What to process and how: items, the worker command, concurrency, leases, retries, sources, budget."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            rules.ITEMS_XOR_ITEMS_FROM,
            rules.HEARTBEAT_UNDER_HALF_LEASE,
            rules.SOURCE_NAMES_UNIQUE,
            rules.FALLBACK_DECLARED,
            rules.DEFAULT_SOURCE_DECLARED,
            rules.LLM_ENDPOINTS_DECLARED,
            *rules.IMMUTABLE_CAMPAIGN_INPUTS.values(),
        )
    )

    items: list[Item] | None = Field(
        default=None,
        max_length=MAX_INLINE_ITEMS,
        # The API server refuses an item whose source no Shard could carry, at admission.
        json_schema_extra={
            "items": {
                "type": "object",
                "additionalProperties": True,
                "properties": {
                    "source": {
                        **ITEM_SOURCE_SCHEMA,
                        "description": "The source this item calls (a name in spec.sources). Default: "
                        "spec.defaultSource.",
                    }
                },
            }
        },
        description=(
            "The work, inline: one JSON object per unit of work, passed to the command as is; an "
            "item's optional `source` key picks its source. "
            f"At most {MAX_INLINE_ITEMS}; use itemsFrom for more. Set exactly one of items and itemsFrom."
        ),
    )
    items_from: ItemsFrom | None = Field(
        default=None,
        description="The work, from a ConfigMap key holding JSONL. Set exactly one of items and itemsFrom.",
    )
    shard_size: int = Field(
        default=10,
        ge=1,
        description="Items per shard; one shard is one claim and one run of the command. Default 10.",
    )
    worker: ItemsWorkerSpec = Field(
        description="The command that processes a shard's items, and its pod. Required."
    )
    finalize: WorkerSpec | None = Field(
        default=None,
        description=(
            "A closing step (merge, validate, report) run once after every work shard is Done, Failed "
            "or Blocked. Default: none."
        ),
    )
    max_concurrency: int = Field(
        default=6,
        ge=1,
        le=1000,
        description="Most shards running, and worker pods alive, at any time. Default 6.",
    )
    backlog_ratio: int = Field(
        default=5,
        ge=1,
        description=(
            "More shards are made claimable only while Pending <= backlogRatio * max(Running, 1). Default 5."
        ),
    )
    lease_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description=(
            "How long a claim lasts without a heartbeat, in seconds. An expired lease makes the shard "
            "claimable again with attempt+1. Default 120."
        ),
    )
    heartbeat_seconds: int | None = Field(
        default=None,
        ge=1,
        le=1800,
        description=(
            "Seconds between worker heartbeats (which renew the lease and report progress). Must be "
            "less than half of leaseSeconds. Default leaseSeconds/3."
        ),
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Attempts per shard; after the last retryable failure the shard is Blocked. Default 3.",
    )
    backoff: Backoff = Field(
        default_factory=Backoff,
        json_schema_extra=schema_default(Backoff),
        description="Delay before retrying a retryable failure. Default base 2s, cap 120s.",
    )
    stall: Stall = Field(
        default_factory=Stall,
        json_schema_extra=schema_default(Stall),
        description=(
            "When a shard without progress is stuck, and what happens "
            "then. Default: report after 2 heartbeats."
        ),
    )
    sources: list[Source] | None = Field(
        default=None,
        max_length=MAX_SOURCES,
        description=(
            f"Upstreams the work calls, each with a circuit breaker and an optional fallback. At most "
            f"{MAX_SOURCES}, names unique. Default none."
        ),
    )
    default_source: SourceName | None = Field(
        default=None,
        description="The source a shard uses when its items do not name one; must be declared in sources.",
    )
    budget: Budget | None = Field(default=None, description="Spending cap. Default: unlimited.")
    suspend: bool = Field(
        default=False,
        description="true stops claiming new shards (running ones finish); false resumes. Default false.",
    )
    priority: int = Field(
        default=0,
        ge=-1000000,
        le=1000000,
        description="Higher-priority campaigns' shards are dispatched first when workers compete. Default 0.",
    )
    retry: RetryRequest = Field(
        default_factory=RetryRequest,
        json_schema_extra=schema_default(RetryRequest),
        description="Bump retry.generation to retry Blocked and Failed shards once.",
    )
    error_threshold: ErrorThreshold = Field(
        default_factory=ErrorThreshold,
        json_schema_extra=schema_default(ErrorThreshold),
        description=(
            "When too many attempts fail non-retryably, stop claiming (condition ErrorThreshold, phase "
            "Suspended) until a person runs kubectl campaign resume. Default 5 in a row, or more than "
            "half of the last 20."
        ),
    )
    idle_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Seconds a worker waits for a claimable shard before it exits. Default 30.",
    )
    result_store: ResultStoreSpec | None = Field(
        default=None,
        description="Where results are kept. Default: the installation's result store.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=365 * 24 * 3600,
        description=(
            "Seconds after the campaign finished (Succeeded or Completed) when the operator deletes "
            "it, with its Shards and worker Jobs; stored results stay (they follow their own "
            "retention). Default: kept until deleted."
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> CampaignSpec:
        # All violations at once, so a user fixes a manifest in one round trip.
        problems: list[str] = []
        if (self.items is None) == (self.items_from is None):
            problems.append(rules.ITEMS_XOR_ITEMS_FROM.message)
        if self.heartbeat_seconds is not None and self.heartbeat_seconds * 2 >= self.lease_seconds:
            problems.append(rules.HEARTBEAT_UNDER_HALF_LEASE.message)
        names = self.source_names
        if len(set(names)) != len(names):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            problems.append(f"{rules.SOURCE_NAMES_UNIQUE.message} (duplicated: {', '.join(duplicates)})")
        undeclared = [s for s in self.sources or [] if s.fallback is not None and s.fallback not in names]
        if undeclared:
            detail = ", ".join(f"{s.name} -> {s.fallback}" for s in undeclared)
            problems.append(f"{rules.FALLBACK_DECLARED.message} ({detail})")
        if self.default_source is not None and self.default_source not in names:
            problems.append(f"{rules.DEFAULT_SOURCE_DECLARED.message} ({self.default_source})")
        llm_undeclared = [
            e.name for e in (self.worker.llm.sources if self.worker.llm else []) if e.name not in names
        ]
        if llm_undeclared:
            problems.append(f"{rules.LLM_ENDPOINTS_DECLARED.message} ({', '.join(llm_undeclared)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_heartbeat_seconds(self) -> float:
        """heartbeatSeconds, or leaseSeconds/3 when unset."""
        if self.heartbeat_seconds is not None:
            return float(self.heartbeat_seconds)
        return self.lease_seconds / 3

    @property
    def source_names(self) -> list[str]:
        """Names of the declared sources, in declaration order."""
        return [source.name for source in self.sources or []]

    def source(self, name: str) -> Source | None:
        """The declared source of that name, or None."""
        return next((s for s in self.sources or [] if s.name == name), None)

    def command_settings(self, worker: WorkerSpec) -> dict[str, str]:
        """Environment the worker runtime adds for `worker`'s command: the built-in LLM worker's
        settings (its block, the sources' rate limits, maxConcurrency for the per-worker share)."""
        if worker.llm is None:
            return {}
        config = {
            "llm": worker.llm.to_dict(),
            "maxConcurrency": self.max_concurrency,
            "rateLimits": {
                s.name: s.rate_limit.to_dict() for s in self.sources or [] if s.rate_limit is not None
            },
        }
        return {CONFIG_ENV: json.dumps(config, separators=(",", ":"))}

    def expected_shards(self, items_total: int) -> int:
        """Number of work shards for `items_total` items (the finalize shard not included)."""
        return math.ceil(items_total / self.shard_size)

    @property
    def inline_items_total(self) -> int | None:
        """Number of inline items, or None when they come from itemsFrom."""
        if self._counted_items is not None:
            return self._counted_items
        return None if self.items is None else len(self.items)

    @property
    def items_left_out(self) -> bool:
        """True when parsed by `Campaign.parse_items_counted`: spec.items reads as [] and only
        `inline_items_total` is true to the object."""
        return self._counted_items is not None

    # Set only by Campaign.parse_items_counted.
    _counted_items: int | None = PrivateAttr(default=None)


class IndexRange(StatusModel):
    """Shard indices start (inclusive) to end (exclusive)."""

    start: int = Field(ge=0, description="First index.")
    end: int = Field(ge=0, description="Index after the last one.")


class FoldedShards(StatusModel):
    """Done work shards whose facts were written to the campaign's ledger (index range, key, result
    reference and fingerprint, attempts, cost, owner, history) and whose Shard objects were then
    deleted, so a campaign keeps a bounded number of objects however many shards it has. A shard
    counts as folded exactly when its index is in doneRanges."""

    shards: int = Field(default=0, ge=0, description="Number of folded shards (all Done).")
    items: int = Field(default=0, ge=0, description="Items in the folded shards.")
    cost: float = Field(default=0, ge=0, description="Cost of the folded shards, in the budget's unit.")
    tokens: TokenCounts = Field(
        default_factory=TokenCounts, description="Tokens the folded shards used, summed."
    )
    attempts: int = Field(default=0, ge=0, description="Attempts the folded shards took, summed.")
    done_ranges: list[IndexRange] = Field(
        default_factory=list,
        description=(
            "Indices of the folded shards as sorted, disjoint ranges: a few, since shards finish "
            "roughly in order (one range per gap left by a shard not yet folded)."
        ),
    )
    sequence: int = Field(default=0, ge=0, description="Folds so far; names the next ledger segment.")
    recent_completions: list[AwareDatetime] = Field(
        default_factory=list,
        max_length=MAX_ERROR_WINDOW,
        description=(
            "When the latest folded shards completed (as many as spec.errorThreshold.window): the "
            "error threshold still counts their successes after their Shards are gone."
        ),
    )

    def ranges(self) -> list[tuple[int, int]]:
        return [(r.start, r.end) for r in self.done_ranges]


class ShardCounts(StatusModel):
    """How many shards are in each phase."""

    queued: int = Field(
        default=0,
        ge=0,
        description=(
            "Shards not yet claimable because they are not yet cut from the items (or cut, not materialized)."
        ),
    )
    pending: int = Field(default=0, ge=0, description="Shards waiting to be claimed (includes backing off).")
    running: int = Field(default=0, ge=0, description="Shards claimed by a worker.")
    done: int = Field(default=0, ge=0, description="Shards finished successfully.")
    failed: int = Field(default=0, ge=0, description="Shards that hit a non-retryable error.")
    blocked: int = Field(default=0, ge=0, description="Shards that used up maxAttempts.")
    paused: int = Field(default=0, ge=0, description="Shards held back by the budget or by suspend.")
    total: int = Field(default=0, ge=0, description="Shards known so far, in any phase.")
    materialized: int = Field(default=0, ge=0, description="Shards that exist as Shard objects.")

    @property
    def terminal(self) -> int:
        """Done + Failed + Blocked."""
        return self.done + self.failed + self.blocked


class BreakerStatus(StatusModel):
    """The circuit breaker of one source."""

    source: str = Field(max_length=SOURCE_NAME_MAX, description="Name of the source.")
    state: BreakerState = Field(
        default=BreakerState.CLOSED,
        description=(
            "Closed: shards are claimed. Open: not claimed (fallback used if any). HalfOpen: one trial."
        ),
    )
    consecutive_failures: int = Field(
        default=0, ge=0, description="Rate-limited failures in a row; a success resets it."
    )
    opened_at: AwareDatetime | None = Field(default=None, description="When the breaker last opened.")
    reason: Annotated[str | None, BeforeValidator(truncating(BREAKER_REASON_MAX))] = Field(
        default=None,
        max_length=BREAKER_REASON_MAX,
        description="Why the breaker opened, from the last failure.",
    )


class SourceCooldown(StatusModel):
    """A source that answered rate-limited with a wait (Retry-After): no worker calls it before `until`."""

    source: str = Field(max_length=SOURCE_NAME_MAX, description="Name of the source.")
    until: AwareDatetime = Field(description="When the source may be called again (RFC 3339).")
    shard: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX, description="The shard whose call was told to wait."
    )


ShardNames = Annotated[list[str], BeforeValidator(keeping_first(MAX_LISTED_SHARDS))]


class ItemsPin(StatusModel):
    """What spec.itemsFrom held when the operator first read it: a later read that finds other
    content is refused (its shards were cut, and their results keyed, from this content)."""

    source: str = Field(max_length=2048, description="The input, as spec.itemsFrom names it.")
    etag: str | None = Field(
        default=None, max_length=1024, description="The object's ETag (itemsFrom.object)."
    )
    uid: str | None = Field(default=None, max_length=128, description="The ConfigMap's uid.")
    resource_version: str | None = Field(
        default=None, max_length=128, description="The ConfigMap's resourceVersion when it was read."
    )
    sha256: str | None = Field(
        default=None, max_length=64, description="SHA-256 of the ConfigMap key's value, what is compared."
    )

    def differs(self, now: ItemsPin) -> bool:
        """True when `now` (a later read of the same input) holds other content than this pin."""
        if self.etag is not None and now.etag is not None:
            return self.etag != now.etag
        if self.sha256 is not None and now.sha256 is not None:
            return self.sha256 != now.sha256
        return False

    def describe(self) -> str:
        if self.etag is not None:
            return f"ETag {self.etag}"
        return f"SHA-256 {(self.sha256 or '')[:12]}, resourceVersion {self.resource_version}"


class CampaignStatus(StatusModel):
    """How the campaign is going, written by the operator only."""

    phase: CampaignPhase | None = Field(default=None, description="Where the campaign is in its life.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status was computed from."
    )
    counts: ShardCounts = Field(default_factory=ShardCounts, description="Shards per phase.")
    items_total: int | None = Field(default=None, ge=0, description="Number of items, once they were read.")
    shards_total: int | None = Field(
        default=None, ge=0, description="Expected number of work shards, once the items were read."
    )
    cut_shards: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Work shards cut from the items so far: shards are cut in index order, so this is the next "
            "index to cut. Workers read it instead of listing every shard."
        ),
    )
    spent: float = Field(default=0, ge=0, description="Cost reported so far, in the budget's unit.")
    tokens: TokenCounts = Field(
        default_factory=TokenCounts,
        description=(
            "Tokens the shards reported using so far (folded shards included), by kind; never goes down."
        ),
    )
    budget_ratio: float | None = Field(
        default=None, ge=0, description="spent / budget.limit; absent without a budget."
    )
    breakers: list[BreakerStatus] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["source"]},
        description="Circuit breaker of each source that has one.",
    )
    source_cooldowns: list[SourceCooldown] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["source"]},
        description=(
            "Sources told to wait by a rate-limited answer (Retry-After) and not yet past it: workers "
            "claim none of their shards and running ones pause their calls to them until then."
        ),
    )
    oldest_pending_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Age in seconds of the longest-waiting Pending shard (starvation signal).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Latest observations of the campaign's state, for example Ready, Stalled, BudgetWarning.",
    )
    blocked_shards: ShardNames = Field(
        default_factory=list,
        max_length=MAX_LISTED_SHARDS,
        description=f"Names of Blocked shards, at most {MAX_LISTED_SHARDS}; counts.blocked has the total.",
    )
    failed_shards: ShardNames = Field(
        default_factory=list,
        max_length=MAX_LISTED_SHARDS,
        description=f"Names of Failed shards, at most {MAX_LISTED_SHARDS}; counts.failed has the total.",
    )
    last_retry_generation: int = Field(
        default=0, ge=0, description="The spec.retry.generation the operator last acted on."
    )
    folded: FoldedShards = Field(
        default_factory=FoldedShards,
        description="Done shards already written to the ledger and deleted (counted in counts.done).",
    )
    items_pin: ItemsPin | None = Field(
        default=None,
        description=(
            "What spec.itemsFrom held when first read, recorded before the first shard is cut: content "
            "changed after that is refused. Unset for inline items."
        ),
    )
    result_store: ResultStoreStatus | None = Field(
        default=None,
        description=(
            "The result store this campaign uses, recorded before its first shard is cut. Unset on "
            "campaigns from before result stores were configurable: ConfigMap."
        ),
    )
    # One entry per live Shard with history (the window: pending, running, the shards that need a
    # person and a short tail of Done ones); a shard folded into the ledger and deleted leaves it.
    history_folded: dict[str, Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description=(
            "For each live Shard, the sequence (status.history[].sequence) of its newest history "
            "entry counted in the breakers: the operator counts the entries above it, each once, "
            "whatever the clocks of their writers, and a new leader continues from here. Entries of "
            "shards folded into the ledger and deleted are dropped, so it holds at most as many "
            "entries as there are live Shards. Absent on statuses written by releases before it."
        ),
    )
    history_folded_until: AwareDatetime | None = Field(
        default=None,
        description=(
            "Deprecated: historyFolded replaces it. The newest shard history entry time counted in "
            "the breakers, by which releases before historyFolded chose the entries to count (an "
            "entry written by a lagging clock could be missed). Still written for workers and "
            "operators of those releases; read only from a status without historyFolded: a live "
            "shard's entries up to this time are then taken as counted, once."
        ),
    )

    @computed_field(  # type: ignore[prop-decorator]
        description='Done/total shards as text, for example "8/10", shown by kubectl get.'
    )
    @property
    def progress_text(self) -> str:
        total = self.shards_total if self.shards_total is not None else self.counts.total
        return f"{self.counts.done}/{total}"

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, or None."""
        return find_condition(self.conditions, type_)

    def with_condition(self, condition: Condition) -> CampaignStatus:
        """A copy with `condition` set (lastTransitionTime kept when its status is unchanged)."""
        return self.model_copy(update={"conditions": set_condition(self.conditions, condition)})

    def breaker(self, source: str) -> BreakerStatus | None:
        """The breaker of that source, or None when it never tripped."""
        return next((b for b in self.breakers if b.source == source), None)


class Campaign(ResourceModel):
    """A Campaign: a body of long, flaky work that shardops splits into leased shards."""

    KIND = CAMPAIGN_KIND

    kind: str = Field(default=CAMPAIGN_KIND, description="Always Campaign.")
    spec: CampaignSpec = Field(description="Desired state.")
    status: CampaignStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name_fits_a_label(self) -> Campaign:
        name = self.metadata.name
        if name is not None and len(name) > rules.CAMPAIGN_NAME_MAX:
            raise ValueError(rules.CAMPAIGN_NAME_FITS_A_LABEL.message)
        return self

    @classmethod
    def parse_items_counted(cls, body: Mapping[str, Any]) -> Campaign:
        """`parse` for readers that need the campaign's shape and state, never its items (a worker's
        look for work, every second): inline spec.items, up to MAX_INLINE_ITEMS objects, are counted
        instead of copied and validated, so the parse costs what the rest of the object costs.
        spec.items then reads as [] (`spec.items_left_out` says so); `spec.inline_items_total`
        gives the count."""
        split = without_inline_items(body)
        if split is None:
            return cls.parse(body)
        lean, count = split
        campaign = cls.parse(lean)
        campaign.spec._counted_items = count
        return campaign

    @property
    def current_status(self) -> CampaignStatus:
        """status, or an empty one for a campaign the operator has not seen yet."""
        return self.status if self.status is not None else CampaignStatus()

    @property
    def retry_requested(self) -> bool:
        """True when spec.retry.generation is ahead of the one the operator last acted on."""
        return self.spec.retry.generation > self.current_status.last_retry_generation

    @property
    def spec_observed(self) -> bool:
        """True when the status reflects the current spec."""
        return self.current_status.observed_generation == self.generation
