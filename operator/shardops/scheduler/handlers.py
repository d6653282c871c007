"""kopf wiring only: which events reach which plain function. Every decision lives in `reconcile`.

Handlers are registered on an explicit registry by `register`, called in `main` after the settings
are loaded, so the tick interval comes from the environment and not from import time.
"""

from __future__ import annotations

from typing import Any

import kopf

from shardops import API_GROUP, API_VERSION
from shardops.api.common import plain
from shardops.api.names import CAMPAIGN_LABEL, CAMPAIGN_PLURAL, SHARD_PLURAL
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings, reconciler: Reconciler) -> None:
    campaigns = (API_GROUP, API_VERSION, CAMPAIGN_PLURAL)
    # kopf's own client login, from the same in-cluster config or kubeconfig the Kube client uses.
    kopf.on.login(id="login", registry=registry)(kopf.login_via_client)

    # A failed pass is retried by the next tick anyway; the backoff only keeps kopf from hammering.
    @kopf.on.resume(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    @kopf.on.create(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    @kopf.on.update(*campaigns, id="campaign-reconcile", registry=registry, backoff=settings.tick_seconds)
    def campaign_changed(*, namespace: str | None, name: str, **_: Any) -> None:
        reconciler.kick(namespace or "", name)

    @kopf.timer(*campaigns, id="campaign-tick", interval=settings.tick_seconds, registry=registry)
    def campaign_tick(*, namespace: str | None, name: str, **_: Any) -> None:
        reconciler.kick(namespace or "", name)

    @kopf.on.event(
        API_GROUP,
        API_VERSION,
        SHARD_PLURAL,
        id="shard-changed",
        registry=registry,
        labels={CAMPAIGN_LABEL: kopf.PRESENT},
    )
    def shard_changed(*, namespace: str | None, body: kopf.Body, **_: Any) -> None:
        reconciler.shard_event(namespace or "", plain(body))
