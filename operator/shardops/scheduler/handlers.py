"""kopf wiring only: which events reach which plain function. Every decision lives in `reconcile`.

Handlers are registered on an explicit registry by `register`, called in `main` after the settings
are loaded, so the tick interval comes from the environment and not from import time.

No handler here makes kopf add its finalizer (no timer, no daemon, no deletion handler), so a
Campaign deletes without a running operator; the periodic reconcile is `ticker.CampaignTicker`,
fed by the `campaign-index` watch handler. tests/scheduler/test_main.py keeps it that way.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import kopf

from shardops import API_GROUP, API_VERSION
from shardops.api.common import plain
from shardops.api.names import CAMPAIGN_LABEL, CAMPAIGN_PLURAL, SHARD_PLURAL
from shardops.scheduler import old_finalizer
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings
from shardops.scheduler.ticker import CampaignTicker


class SpecGenerations:
    """Which request of each Campaign this process has reconciled on: its uid, its metadata.generation
    (the API server raises it with every change of the spec, never with a status write) and its
    `shardops.dev/` annotations (`kubectl campaign cancel/resume` set them with the spec or alone).
    Bounded by the Campaigns the operator watches (an entry goes with its Campaign's DELETED event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[str, int, frozenset[tuple[str, str]]]] = {}

    def changed(self, event_type: str | None, namespace: str, name: str, metadata: Mapping[str, Any]) -> bool:
        """True for a Campaign's first event in this process and for a new request (or a new Campaign
        of the same name); False for its other events, and for its deletion (forgotten)."""
        key = (namespace, name)
        annotations = metadata.get("annotations") or {}
        ours = frozenset((k, str(v)) for k, v in annotations.items() if k.startswith(f"{API_GROUP}/"))
        request = (str(metadata.get("uid") or ""), int(metadata.get("generation") or 0), ours)
        with self._lock:
            if event_type == "DELETED":
                self._seen.pop(key, None)
                return False
            if self._seen.get(key) == request:
                return False
            self._seen[key] = request
            return True


def register(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    reconciler: Reconciler,
    ticker: CampaignTicker,
) -> None:
    campaigns = (API_GROUP, API_VERSION, CAMPAIGN_PLURAL)
    # kopf's own client login, from the same in-cluster config or kubeconfig the Kube client uses.
    kopf.on.login(id="login", registry=registry)(kopf.login_via_client)

    # A pass when a Campaign is first seen (created, or listed at start) and when its spec changes,
    # not on the operator's own status writes. An event handler, not kopf's change handlers: those
    # keep the last handled spec in an annotation, a second copy of every inline item that doubles
    # what each write of the object sends and breaks on a spec over half the annotation limit
    # (256 KiB), kopf #1087. A failed pass is retried by the next tick (ticker.py).
    specs = SpecGenerations()

    @kopf.on.event(*campaigns, id="campaign-reconcile", registry=registry)
    def campaign_changed(
        *, type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        if specs.changed(type, namespace or "", name, body.get("metadata", {})):
            reconciler.kick(namespace or "", name)

    # Every watch event of a Campaign (the first listing included) keeps the ticker's index: async,
    # so it runs on the event loop where the ticker's tasks live, and it does no I/O.
    @kopf.on.event(*campaigns, id="campaign-index", registry=registry)
    async def campaign_seen(
        *, type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        gone = type == "DELETED" or bool(body.get("metadata", {}).get("deletionTimestamp"))
        ticker.seen(namespace or "", name, gone=gone)

    @kopf.on.event(
        *campaigns,
        id="old-finalizer",
        registry=registry,
        when=lambda body, **_: old_finalizer.carries_old_finalizer(body),
    )
    def campaign_with_old_finalizer(
        *, type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        if type != "DELETED":
            old_finalizer.remove(reconciler.kube, reconciler.metrics, namespace or "", name, plain(body))

    @kopf.on.event(
        API_GROUP,
        API_VERSION,
        SHARD_PLURAL,
        id="shard-changed",
        registry=registry,
        labels={CAMPAIGN_LABEL: kopf.PRESENT},
    )
    def shard_changed(*, namespace: str | None, body: kopf.Body, **_: Any) -> None:
        # kopf's view as it is, not a plain() copy: four fields are read, on every event of every
        # shard (most of them change nothing the reconcile cares about).
        reconciler.shard_event(namespace or "", body)
