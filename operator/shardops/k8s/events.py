"""Kubernetes Events: one per campaign-level report, and one series per campaign and reason for what
happens to its shards (`EventSeries`). The series' name goes into the shard's history and
lastError, so a reader can go from a Blocked shard straight to the Event that counts it."""

from __future__ import annotations

import datetime as dt
import secrets

from shardops.api.common import JSON
from shardops.k8s.api import EVENTS, AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from shardops.logic.timefmt import micro_time as format_micro_time

NOTE_LIMIT = 1024
# An object name's longest (a DNS subdomain).
NAME_LIMIT = 253


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
    # A cluster-scoped object's Events live in `default`, where Kubernetes puts them; its reference
    # keeps no namespace.
    namespace = ref["namespace"] or "default"
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name or f"{ref['name']}.{secrets.token_hex(6)}", "namespace": namespace},
        "eventTime": format_micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": action[:128],
        "reason": reason[:128],
        "regarding": ref,
        "note": note[:NOTE_LIMIT],
        "type": "Warning" if warning else "Normal",
    }


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


def series_name(campaign: str, reason: str) -> str:
    """The name of a campaign's one Event for `reason` (`EventSeries`). Known without a read, so a
    shard's history and lastError name it in the very write of the transition, written by a worker
    that never posts it."""
    suffix = f".{reason.lower()}"
    return campaign[: NAME_LIMIT - len(suffix)] + suffix


def occurrences(event: JSON) -> int:
    """How many times an Event says it happened: its series count, 1 for a single one."""
    return int((event.get("series") or {}).get("count") or 1)


def with_occurrences(event: JSON, count: int, now: dt.datetime) -> JSON:
    """`event` counting `count` occurrences, the last one `now`. Only the series changes: an
    events.k8s.io Event's note, reason and object are immutable once written."""
    if count < 2:  # the API server wants a series to count at least two
        return event
    return {**event, "series": {"count": count, "lastObservedTime": format_micro_time(now)}}


class EventSeries:
    """One Event per campaign and reason whose series count grows, for what happens once per shard
    (a failed attempt, a shard given up, a lease expired, a retry): the namespace holds at most
    `len(reasons)` such Events per campaign however many shards fail, where an Event per
    transition kept one per failed shard alive for the API server's hour (issue 31: 739 in a
    500,000-item campaign, over the window bound). It is what client-go's event correlator does
    with repeats of one object and reason, with the count kept by the one process that writes:
    the operator's leader, once a pass, for what the pass's history fold found. So the writes are
    at most one per reason and pass, never one per shard; the shards themselves, their history
    and lastError, status.recentFailures and the ledger keep who failed and why.

    Memory: the Event as last written, per campaign and reason, for the campaigns this process
    serves (`forget` drops a campaign found gone)."""

    def __init__(self) -> None:
        # (namespace, campaign, reason) -> the Event as last written.
        self._written: dict[tuple[str, str, str], JSON] = {}

    def add(self, kube: KubeClient, body: JSON, count: int, now: dt.datetime) -> str | None:
        """Count `count` more occurrences in the campaign's Event `body` (built by `event_body`
        with `series_name`): created with them the first time, else its series count raised
        (one PUT; on a Conflict, one read and the PUT again). Its name, or None when it could not
        be written (an Event must not stop the pass that reports it)."""
        if count < 1:
            return None
        namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
        key = (namespace, str(body["regarding"]["name"]), str(body["reason"]))
        known = self._written.get(key)
        try:
            for _ in range(3):  # bounded: a create that met an existing Event, then one Conflict
                if known is None:
                    try:
                        created = kube.create(EVENTS, namespace, with_occurrences(body, count, now))
                    except AlreadyExists:  # written before this process led (or its answer was lost)
                        known = kube.get(EVENTS, namespace, name)
                        continue
                    self._written[key] = created
                    return name
                try:
                    raised = with_occurrences(known, occurrences(known) + count, now)
                    self._written[key] = kube.replace(EVENTS, namespace, name, raised)
                    return name
                except NotFound:  # expired (the API server keeps an Event an hour after its last write)
                    known = None
                except Conflict:
                    known = kube.get(EVENTS, namespace, name)
        except ApiError:
            pass
        self._written.pop(key, None)
        return None

    def forget(self, namespace: str, campaign: str) -> None:
        for key in [k for k in self._written if k[:2] == (namespace, campaign)]:
            del self._written[key]
