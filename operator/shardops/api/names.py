"""Kubernetes names of the shardops API: group, kinds, plurals, labels.

Every layer that talks to the API server (k8s/, operator/, cli/, e2e/) imports these instead of
spelling the strings, so a rename is one edit here plus `make manifests`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from shardops import API_GROUP, API_VERSION

API_GROUP_VERSION: Final = f"{API_GROUP}/{API_VERSION}"
CATEGORY: Final = "shardops"

CAMPAIGN_KIND: Final = "Campaign"
CAMPAIGN_PLURAL: Final = "campaigns"
CAMPAIGN_SINGULAR: Final = "campaign"
CAMPAIGN_SHORT_NAME: Final = "camp"

SHARD_KIND: Final = "Shard"
SHARD_PLURAL: Final = "shards"
SHARD_SINGULAR: Final = "shard"
SHARD_SHORT_NAME: Final = "shard"

SOURCE_KIND: Final = "Source"
SOURCE_PLURAL: Final = "sources"
SOURCE_SINGULAR: Final = "source"
SOURCE_SHORT_NAME: Final = "src"

CLUSTER_SOURCE_KIND: Final = "ClusterSource"
CLUSTER_SOURCE_PLURAL: Final = "clustersources"
CLUSTER_SOURCE_SINGULAR: Final = "clustersource"
CLUSTER_SOURCE_SHORT_NAME: Final = "csrc"

# Labels from docs/architecture.md ("Objects"). Shards, Leases, worker Jobs and result
# ConfigMaps carry the campaign label so "everything of campaign X" is one label selector.
CAMPAIGN_LABEL: Final = f"{API_GROUP}/campaign"
CLASS_LABEL: Final = f"{API_GROUP}/class"
ROLE_LABEL: Final = f"{API_GROUP}/role"
IDEMPOTENCY_KEY_LABEL: Final = f"{API_GROUP}/idempotency-key"

# On a worker Job: its number in the campaign (the Job's name ends with it). The next Job takes one
# more than the highest number of the campaign's Jobs that exist, so a name is fixed before the
# create and a create sent again after a lost answer finds its own Job (409) instead of a second one.
WORKER_NUMBER_ANNOTATION: Final = f"{API_GROUP}/worker-number"
# On a worker Job: the slots of its pod (shards it runs at once, spec.worker.slots or fewer). The
# planner counts the slots of the alive Jobs, not the Jobs; a Job without it has one.
WORKER_SLOTS_ANNOTATION: Final = f"{API_GROUP}/worker-slots"

# On a worker Job whose spec.worker.queueName is set: the LocalQueue Kueue admits it through. Kueue's
# admission webhook suspends a Job created with it until the queue's ClusterQueue has quota for it.
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"

# A DNS-1123 label (and a label value, which a Job's name becomes on its pods) is at most 63 characters.
DNS_LABEL_MAX: Final = 63
# Hex digits of the hash that keeps names derived from long bases apart.
_DERIVED_HASH_LENGTH: Final = 8


def derived_name(base: str, suffix: str, limit: int = DNS_LABEL_MAX) -> str:
    """`base` + `suffix`, or, when that is longer than `limit`, `base` cut short followed by a hash
    of the whole of it, then `suffix`: two long bases that share their start still get two names,
    and a base always derives the same name. `base` is a campaign's name (at most 63 characters:
    the Campaign CRD refuses longer ones)."""
    whole = f"{base}{suffix}"
    if len(whole) <= limit:
        return whole
    digest = hashlib.sha256(base.encode("utf-8")).hexdigest()[:_DERIVED_HASH_LENGTH]
    keep = limit - len(suffix) - len(digest) - 1
    if keep < 1:
        raise ValueError(f"suffix {suffix!r} leaves no room for a name of at most {limit} characters")
    return f"{base[:keep].rstrip('-.')}-{digest}{suffix}"


# Field managers: the identities that write shard status (managedFields record them). The closing
# checklist of `kubectl campaign report` passes only when every shard status write is one of the
# first two; the admission policy in the chart enforces the same by service account.
OPERATOR_FIELD_MANAGER: Final = "shardops-operator"
WORKER_FIELD_MANAGER: Final = "shardops-worker"
CLI_FIELD_MANAGER: Final = "kubectl-campaign"
SHARDOPS_FIELD_MANAGERS: Final = frozenset({OPERATOR_FIELD_MANAGER, WORKER_FIELD_MANAGER})

# On a Shard the operator cut: the snapshot it planned the cut from (pending and running shards,
# and the shard's place in that pass's batch), so the backlog bound can be audited exactly.
PLANNED_FROM_ANNOTATION: Final = f"{API_GROUP}/planned-from"

# On a Campaign: when a person last resumed it (kubectl campaign resume). A campaign held by its
# error threshold claims again once this is later than the hold, and counts only the attempts after it.
RESUMED_ANNOTATION: Final = f"{API_GROUP}/resumed"

# On a Campaign: RFC 3339 time it was cancelled (kubectl campaign cancel, the Batch API's cancel).
CANCELLED_ANNOTATION: Final = f"{API_GROUP}/cancelled"


def cancel_patch(cancelled_at: str) -> dict[str, Any]:
    """The recorded cancel: suspend (no new claims; running shards finish) and say when (RFC 3339).
    One home for both writers of it, `kubectl campaign cancel` and the Batch API's cancel."""
    return {"spec": {"suspend": True}, "metadata": {"annotations": {CANCELLED_ANNOTATION: cancelled_at}}}


# On the operator's leader Lease: which process holds it, as "<pod uid>/<process token>". A restarted
# container finds its own pod's uid with another token there and knows that holder is dead (a pod
# runs one container of the operator at a time), so it takes over at once instead of after a lease.
LEADER_INSTANCE_ANNOTATION: Final = f"{API_GROUP}/leader-instance"

# The Shard field the CRD makes selectable (`fieldSelector=status.phase!=Done`).
SHARD_PHASE_FIELD: Final = ".status.phase"

# kopf's finalizer (its settings.persistence.finalizer). kopf adds it to an object only while a
# handler needs one: a timer, a daemon or a deletion handler that is not optional. None does any
# more (scheduler/ticker.py says why), so Campaigns and their namespaces delete without a running
# operator. Release 0.1.0 put it on every Campaign (its periodic reconcile was a kopf timer); the
# operator removes it wherever it still finds it (scheduler/old_finalizer.py), and
# docs/install.md says how to by hand.
KOPF_FINALIZER: Final = f"{API_GROUP}/kopf-finalizer"
