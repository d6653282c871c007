"""Kubernetes Events for every state transition. The event's name goes into the shard's history and
lastError, so a reader can go from a Blocked shard straight to the event that explains it."""

from __future__ import annotations

import datetime as dt
import secrets

from shardops.api.common import JSON
from shardops.k8s.api import EVENTS, AlreadyExists, ApiError, KubeClient
from shardops.logic.timefmt import micro_time as format_micro_time

NOTE_LIMIT = 1024


def regarding(obj: JSON) -> JSON:
    """The object reference an Event points at, from the object as the API server returned it."""
    metadata = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "uid": metadata.get("uid"),
    }


def event_body(
    target: JSON,
    *,
    reason: str,
    note: str,
    action: str,
    controller: str,
    instance: str,
    now: dt.datetime,
    warning: bool = False,
    name: str | None = None,
) -> JSON:
    ref = regarding(target)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name or f"{ref['name']}.{secrets.token_hex(6)}", "namespace": ref["namespace"]},
        "eventTime": format_micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": action[:128],
        "reason": reason[:128],
        "regarding": ref,
        "note": note[:NOTE_LIMIT],
        "type": "Warning" if warning else "Normal",
    }


def new_event_name(target: JSON) -> str:
    """Pick the name first, so it can be written into the shard status with the same transition."""
    return f"{(target.get('metadata') or {}).get('name')}.{secrets.token_hex(6)}"


def record(kube: KubeClient, body: JSON) -> str | None:
    """Create the Event; an event that cannot be written must not stop the transition it describes.

    Its name is random and chosen here, so a create sent again after a lost answer (`k8s.api`
    repeats named creates after a 5xx) answers AlreadyExists for this very Event: it is written.
    A duplicate Event would be harmless anyway (Events are what a person reads, not state)."""
    try:
        kube.create(EVENTS, body["metadata"]["namespace"], body)
    except AlreadyExists:
        pass
    except ApiError:
        return None
    return str(body["metadata"]["name"])
