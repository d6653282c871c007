"""Healing objects an earlier release left: chart 0.1.0 put kopf's finalizer on every Campaign.

That release reconciled periodically with a kopf timer, and kopf gives every object with a timer
its finalizer, so deleting such a Campaign (or its namespace) waits for a running operator. This
release needs no finalizer (scheduler/ticker.py says why), so it removes the old one from every
Campaign it sees carrying it: the `old-finalizer` watch handler calls `remove` for each, on the
operator's first listing and on any later event. Only that entry goes, by a JSON patch guarded by
a test of the entry (k8s/finalizers.py): finalizers of other controllers stay. A Campaign that was
already being deleted then finishes deleting, as the user asked.

Shards never carried it (kopf adds it only for timers, daemons and deletion handlers, and the
Shard handler has only ever been an event watcher), so the operator neither looks for it there nor
holds the permission to patch Shards.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shardops.api.names import KOPF_FINALIZER
from shardops.k8s.api import CAMPAIGNS, Kube
from shardops.k8s.finalizers import finalizers_of, remove_finalizer
from shardops.scheduler.metrics import Metrics

log = logging.getLogger(__name__)


def carries_old_finalizer(body: Mapping[str, Any]) -> bool:
    return KOPF_FINALIZER in finalizers_of(body)


def remove(kube: Kube, metrics: Metrics, namespace: str, name: str, body: Mapping[str, Any]) -> bool:
    """Remove the old finalizer from one Campaign; True when this call did."""
    if not remove_finalizer(kube, CAMPAIGNS, namespace, name, KOPF_FINALIZER, body=body):
        return False
    metrics.old_finalizers_removed.inc()
    deleting = " (it was being deleted: the deletion now completes)" if _deleting(body) else ""
    log.info(
        "campaign %s/%s: removed the finalizer %s an earlier release left; Campaigns need none%s",
        namespace,
        name,
        KOPF_FINALIZER,
        deleting,
    )
    return True


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))
