"""Campaign I/O: read one, write its status, read its items from a ConfigMap, record its events."""

from __future__ import annotations

import datetime as dt
import hashlib

from shardops.api.common import JSON, Item
from shardops.api.enums import ConditionReason
from shardops.api.items import ItemsFrom, ItemsPin
from shardops.k8s import events
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, KubeClient, NotFound
from shardops.k8s.shards import Actor


class ItemsUnavailable(Exception):
    """The campaign's items cannot be read. `reason` is the Ready condition's reason, `message` says how
    to fix it; both go on the campaign as they are."""

    def __init__(self, reason: ConditionReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def get(kube: KubeClient, namespace: str, name: str) -> JSON | None:
    """The campaign as stored, or None once it is gone."""
    try:
        return kube.get(CAMPAIGNS, namespace, name)
    except NotFound:
        return None


def patch_status(
    kube: KubeClient, namespace: str, name: str, status: JSON, resource_version: str | None
) -> JSON:
    """One merge patch of the status subresource; Conflict when the campaign changed since it was read."""
    return kube.patch(
        CAMPAIGNS,
        namespace,
        name,
        {"status": status},
        resource_version=resource_version,
        subresource="status",
    )


def read_items(kube: KubeClient, namespace: str, source: ItemsFrom) -> tuple[list[Item], ItemsPin]:
    """The items in the ConfigMap key (JSONL) and what was read (ItemsPin: uid, resourceVersion,
    SHA-256 of the value), to compare a later read with."""
    if source.config_map_name is None or source.key is None:
        raise ValueError("spec.itemsFrom names an object, not a ConfigMap")
    where = f"ConfigMap {source.config_map_name} in namespace {namespace}"
    try:
        config_map = kube.get(CONFIGMAPS, namespace, source.config_map_name)
    except NotFound:
        raise ItemsUnavailable(
            ConditionReason.ITEMS_NOT_FOUND,
            f"spec.itemsFrom names {where}, which does not exist: create it with key {source.key} "
            "holding one JSON object per line, or fix spec.itemsFrom.configMapName",
        ) from None
    data = config_map.get("data") or {}
    if source.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise ItemsUnavailable(
            ConditionReason.ITEMS_KEY_NOT_FOUND,
            f"{where} has no key {source.key} (keys: {keys}): add it or fix spec.itemsFrom.key",
        )
    text = str(data[source.key])
    try:
        items = source.parse_items(text)
    except ValueError as error:
        raise ItemsUnavailable(ConditionReason.ITEMS_INVALID, f"{error}; fix that line in {where}") from None
    metadata = config_map.get("metadata") or {}
    return items, ItemsPin(
        source=source.describe(),
        uid=metadata.get("uid"),
        resource_version=metadata.get("resourceVersion"),
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
    )


def record_event(
    kube: KubeClient,
    campaign: JSON,
    *,
    reason: str,
    note: str,
    actor: Actor,
    now: dt.datetime,
    warning: bool = False,
) -> str | None:
    """An Event about the campaign itself (invalid spec, breaker opened, retry done); its name, or None."""
    return events.record(
        kube, event_body(campaign, reason=reason, note=note, actor=actor, now=now, warning=warning)
    )


def series_event_body(
    campaign: JSON, *, reason: str, note: str, actor: Actor, now: dt.datetime, warning: bool = False
) -> JSON:
    """The campaign's one Event for `reason`, for `events.EventSeries.add` to count occurrences in."""
    name = events.series_name(str((campaign.get("metadata") or {}).get("name")), reason)
    return event_body(campaign, reason=reason, note=note, actor=actor, now=now, warning=warning, name=name)


def event_body(
    campaign: JSON,
    *,
    reason: str,
    note: str,
    actor: Actor,
    now: dt.datetime,
    warning: bool,
    name: str | None = None,
) -> JSON:
    return events.event_body(
        campaign,
        reason=reason,
        note=note,
        action=reason,
        controller=actor.controller,
        instance=actor.instance,
        now=now,
        warning=warning,
        name=name,
    )
