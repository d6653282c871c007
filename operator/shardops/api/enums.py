"""Vocabulary shared by every layer: phases, classes and states. The single source for these names."""

from __future__ import annotations

from enum import StrEnum


class ShardPhase(StrEnum):
    """Where a shard is in its life: docs/architecture.md, "Shard state machine"."""

    QUEUED = "Queued"
    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    FAILED = "Failed"
    BLOCKED = "Blocked"
    PAUSED = "Paused"

    @property
    def terminal(self) -> bool:
        """Done, Failed and Blocked leave only through an explicit retry action."""
        return self in TERMINAL_SHARD_PHASES


TERMINAL_SHARD_PHASES = frozenset({ShardPhase.DONE, ShardPhase.FAILED, ShardPhase.BLOCKED})


class ShardClass(StrEnum):
    """`work` shards carry items; `finalize` shards close the campaign (merge, validate, report)."""

    WORK = "work"
    FINALIZE = "finalize"


class CampaignPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    PAUSED = "Paused"
    SUSPENDED = "Suspended"
    FINALIZING = "Finalizing"
    SUCCEEDED = "Succeeded"
    COMPLETED = "Completed"
    INVALID = "Invalid"


# The phases a campaign ends in: its work is over (every shard Done, or some gave up: Completed).
FINISHED_PHASES = frozenset({CampaignPhase.SUCCEEDED, CampaignPhase.COMPLETED})


class ErrorClass(StrEnum):
    """Why an attempt failed. Retryable ones back off; the rest end the shard at once."""

    RATE_LIMITED = "rate-limited"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    UNKNOWN = "unknown"
    UNAUTHORIZED = "unauthorized"
    INVALID_INPUT = "invalid-input"
    NOT_FOUND = "not-found"
    OVER_BUDGET = "over-budget"
    RESULT_TOO_LARGE = "result-too-large"
    BAD_OUTPUT = "bad-output"
    COMMAND_NOT_FOUND = "command-not-found"

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE_ERROR_CLASSES


RETRYABLE_ERROR_CLASSES = frozenset(
    {ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT, ErrorClass.UNAVAILABLE, ErrorClass.UNKNOWN}
)


# The classes an item's own failure may have without failing its shard: the request (or the answer
# to it) is wrong for that item alone, so the item is recorded as errored and the rest go on. The
# other non-retryable classes (unauthorized, not-found, over-budget, ...) hold for every item alike.
ITEM_ERROR_CLASSES = frozenset({ErrorClass.INVALID_INPUT, ErrorClass.BAD_OUTPUT})


class Workload(StrEnum):
    """What a worker's shards mostly do (spec.worker.workload): the hint its slots default from."""

    # Waiting on other systems (HTTP and LLM calls, object storage): a fraction of a core each.
    IO_BOUND = "IOBound"
    # Computing: a core each, or an unknown share of one.
    CPU_BOUND = "CPUBound"


class LlmRequestFormat(StrEnum):
    """How the built-in LLM worker turns an item into a request (spec.worker.llm.format)."""

    # The item's fields fill the block's message templates; one chat completion per item.
    CHAT = "chat"
    # The item is a line of an OpenAI Batch API input file, sent as written.
    OPENAI_BATCH = "openai-batch"


class BreakerState(StrEnum):
    CLOSED = "Closed"
    OPEN = "Open"
    HALF_OPEN = "HalfOpen"


class SourceKind(StrEnum):
    """The kinds of shared source a Campaign's spec.sources[].sourceRef may name (cert-manager's
    Issuer/ClusterIssuer split): one of the campaign's namespace, or one of the whole cluster."""

    SOURCE = "Source"
    CLUSTER_SOURCE = "ClusterSource"


class StallPolicy(StrEnum):
    """What the scheduler does when a shard heartbeats without progress for the stall window."""

    REPORT = "Report"
    REVOKE = "Revoke"


class StoreType(StrEnum):
    """Where shard results (and item results for resuming) are kept."""

    CONFIG_MAP = "ConfigMap"
    S3 = "S3"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Every condition a Campaign can carry; `kubectl wait --for=condition=<type>` uses these names."""

    READY = "Ready"
    BACKPRESSURED = "Backpressured"
    CLUSTER_FULL = "ClusterFull"
    BUDGET_WARNING = "BudgetWarning"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    BUDGET_HELD = "BudgetHeld"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    STALLED = "Stalled"
    BREAKER_OPEN = "BreakerOpen"
    COMPLETE = "Complete"
    SCHEDULED = "Scheduled"
    WORKERS_FAILING = "WorkersFailing"
    ERROR_THRESHOLD = "ErrorThreshold"
    WAITING_FOR_QUOTA = "WaitingForQuota"
    SOURCE_UNRESOLVED = "SourceUnresolved"


class ConditionReason(StrEnum):
    """Every reason a Campaign condition can give, grouped by the condition that uses it."""

    # Ready
    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    NO_ITEMS = "NoItems"
    ITEMS_NOT_FOUND = "ItemsNotFound"
    ITEMS_KEY_NOT_FOUND = "ItemsKeyNotFound"
    ITEMS_INVALID = "ItemsInvalid"
    ITEMS_CHANGED = "ItemsChanged"
    ITEMS_OUTSIDE_NAMESPACE = "ItemsOutsideNamespace"
    RESULT_STORE_TOO_SMALL = "ResultStoreTooSmall"
    RESULT_STORE_UNAVAILABLE = "ResultStoreUnavailable"
    IN_OPERATOR_NAMESPACE = "InOperatorNamespace"
    STORE_SECRET_MISSING = "StoreSecretMissing"
    # Backpressured
    WITHIN_BACKLOG = "WithinBacklog"
    BACKLOG_FULL = "BacklogFull"
    # ClusterFull
    WORKERS_SCHEDULED = "WorkersScheduled"
    WORKER_PODS_PENDING = "WorkerPodsPending"
    # BudgetWarning, BudgetExhausted, BudgetHeld
    NO_BUDGET = "NoBudget"
    WITHIN_BUDGET = "WithinBudget"
    WARN_RATIO_REACHED = "WarnRatioReached"
    LIMIT_REACHED = "LimitReached"
    # BudgetHeld: no work shard is held by the budget; or none fits next to the running shards'
    # reservations, which free what they do not spend as they finish; or none fits and none runs.
    NOTHING_HELD = "NothingHeld"
    RESERVED_BY_RUNNING = "ReservedByRunning"
    NO_ROOM_FOR_SHARD = "NoRoomForShard"
    # Degraded
    NO_FAILURES = "NoFailures"
    SHARDS_GAVE_UP = "ShardsGaveUp"
    # Suspended
    SPEC_SUSPEND = "SpecSuspend"
    HELD_BY_ERROR_THRESHOLD = "HeldByErrorThreshold"
    ACTIVE = "Active"
    # Stalled
    PROGRESSING = "Progressing"
    NO_PROGRESS = "NoProgress"
    # BreakerOpen
    ALL_CLOSED = "AllClosed"
    SOURCE_RATE_LIMITED = "SourceRateLimited"
    # Complete
    SUCCEEDED = "Succeeded"
    COMPLETED_WITH_FAILURES = "CompletedWithFailures"
    IN_PROGRESS = "InProgress"
    # Scheduled
    LEADER = "Leader"
    LEADER_RENEWAL_FAILING = "LeaderRenewalFailing"
    # WorkersFailing
    WORKERS_HEALTHY = "WorkersHealthy"
    WORKER_JOBS_FAILING = "WorkerJobsFailing"
    # ErrorThreshold
    WITHIN_ERROR_THRESHOLD = "WithinErrorThreshold"
    TOO_MANY_ERRORS = "TooManyErrors"
    # WaitingForQuota (spec.worker.queueName): no worker Job held by Kueue; some held until their
    # ClusterQueue has quota; or held because the LocalQueue named does not exist.
    NO_WORKER_QUEUED = "NoWorkerQueued"
    QUEUED_BY_KUEUE = "QueuedByKueue"
    LOCAL_QUEUE_NOT_FOUND = "LocalQueueNotFound"
    # SourceUnresolved (spec.sources[].sourceRef): every Source named exists and serves the campaign's
    # namespace; or one does not exist; or a ClusterSource does not list the namespace.
    SOURCES_RESOLVED = "SourcesResolved"
    SOURCE_NOT_FOUND = "SourceNotFound"
    SOURCE_NOT_ALLOWED = "SourceNotAllowed"
    # Ready of a Source or ClusterSource: usable; its key Secret (or the key in it) is missing; a
    # ClusterSource that lists no namespace serves nobody.
    SOURCE_USABLE = "SourceUsable"
    KEY_SECRET_MISSING = "KeySecretMissing"
    NO_NAMESPACES = "NoNamespaces"
    # Events on a Source or ClusterSource: its one breaker opened (every campaign on it moves to its
    # fallback) or closed again (a probe succeeded).
    SOURCE_BREAKER_OPENED = "BreakerOpened"
    SOURCE_BREAKER_CLOSED = "BreakerClosed"
