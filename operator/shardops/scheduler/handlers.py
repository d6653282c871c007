"""kopf wiring only: which events reach which plain function. Every decision lives in `reconcile`.

Handlers are registered on an explicit registry by `register`, called in `main` after the settings
are loaded, so the tick interval comes from the environment and not from import time.

No handler here makes kopf add its finalizer (no timer, no daemon, no deletion handler), so a
Campaign deletes without a running operator; the periodic reconcile is `ticker.CampaignTicker`,
fed by the `campaign-index` watch handler. tests/test_operator_wiring.py keeps it that way.
"""

from __future__ import annotations

from typing import Any

import kopf

from shardops import API_GROUP, API_VERSION
from shardops.api.common import plain
from shardops.api.names import CAMPAIGN_LABEL, CAMPAIGN_PLURAL, SHARD_PLURAL
from shardops.scheduler import old_finalizer
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings
from shardops.scheduler.ticker import CampaignTicker


def register(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    reconciler: Reconciler,
    ticker: CampaignTicker,
) -> None:
    campaigns = (API_GROUP, API_VERSION, CAMPAIGN_PLURAL)
    # kopf's own client login, from the same in-cluster config or kubeconfig the Kube client uses.
    kopf.on.login(id="login", registry=registry)(kopf.login_via_client)

    # A failed pass is retried by the next tick anyway; the backoff only keeps kopf from hammering.
    @kopf.on.resume(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    @kopf.on.create(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    @kopf.on.update(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    def campaign_changed(*, namespace: str | None, name: str, **_: Any) -> None:
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
