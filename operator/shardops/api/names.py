"""Kubernetes names of the shardops API: group, kinds, plurals, labels.

Every layer that talks to the API server (k8s/, operator/, cli/, e2e/) imports these instead of
spelling the strings, so a rename is one edit here plus `make manifests`.
"""

from __future__ import annotations

from typing import Final

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

# Labels from docs/architecture.md ("Objects"). Shards, Leases, worker Jobs and result
# ConfigMaps carry the campaign label so "everything of campaign X" is one label selector.
CAMPAIGN_LABEL: Final = f"{API_GROUP}/campaign"
CLASS_LABEL: Final = f"{API_GROUP}/class"
ROLE_LABEL: Final = f"{API_GROUP}/role"
IDEMPOTENCY_KEY_LABEL: Final = f"{API_GROUP}/idempotency-key"

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
