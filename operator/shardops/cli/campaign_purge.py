"""`kubectl campaign purge NAME --yes`: delete a campaign and every result it stored.

Results outlive their Campaign on purpose (re-applying it reuses them); purge is how they go.
Nothing is deleted while the Campaign exists: purge collects the campaign's idempotency keys
(its live Shards and its ledger), deletes the Campaign and waits until it is gone, then deletes
the stored results of those keys, the ledger and the uploaded inputs. Without --yes it only says
what it would delete.
"""

from __future__ import annotations

import time

from shardops.cli.campaign_client import EXIT_OK, bad_state, no_access
from shardops.cli.campaign_results import cli_store
from shardops.cli.command import Context, load
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, NotFound
from shardops.state import ledger
from shardops.store.configmap import purge_names
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store

GONE_TIMEOUT_SECONDS = 120.0


def run_purge(ctx: Context) -> int:
    _, campaign, _, shards = load(ctx, ctx.args.name)
    store = cli_store(ctx, campaign)
    keys = {s.spec.idempotency_key for s in shards}
    folded = campaign.current_status.folded
    uid = campaign.metadata.uid or ""
    try:
        if isinstance(store, S3Store) and folded.total:
            records = ledger.first_records(store.read_ledger(campaign.name, uid), folded)
            keys |= {str(r["idempotencyKey"]) for r in records.values()}
    except StoreUnavailable as error:
        raise no_access(f"cannot read the ledger: {error}") from None
    where = store.describe()
    if not ctx.args.yes:
        ctx.out(
            f"would delete campaign {campaign.namespace}/{campaign.name} and the stored results of its "
            f"{len(keys)} shard key(s) in {where}; nothing was deleted: add --yes to delete"
        )
        return EXIT_OK
    kube = ctx.client.kube
    ctx.client.call(
        f"delete campaign {campaign.name}", lambda: kube.delete(CAMPAIGNS, campaign.namespace, campaign.name)
    )
    deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
    while True:
        try:
            kube.get(CAMPAIGNS, campaign.namespace, campaign.name)
        except NotFound:
            break
        if time.monotonic() > deadline:
            raise bad_state(
                f"campaign {campaign.name} is still there after {GONE_TIMEOUT_SECONDS:g}s; nothing purged"
            )
        time.sleep(0.5)
    deleted = 0
    try:
        if isinstance(store, S3Store):
            for key in sorted(keys):
                deleted += store.delete_key(key)
            deleted += store.delete_prefix(store.ledger_prefix(campaign.name, uid))
            deleted += store.delete_prefix(store.input_prefix(campaign.name))
        else:
            for key in sorted(keys):
                for name in purge_names(kube, campaign.namespace, key, campaign.name):
                    try:
                        kube.delete(CONFIGMAPS, campaign.namespace, name)
                        deleted += 1
                    except NotFound:
                        continue
    except StoreUnavailable as error:
        raise no_access(
            f"campaign deleted and {deleted} stored object(s) with it, but the store stopped answering: "
            f"{error}; the rest is still in {where}"
        ) from None
    ctx.out(
        f"purged campaign {campaign.namespace}/{campaign.name}: {deleted} stored object(s) of "
        f"{len(keys)} shard key(s) deleted from {where}"
    )
    return EXIT_OK
