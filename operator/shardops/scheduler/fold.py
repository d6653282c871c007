"""The finished shards (Done, and Failed or Blocked but the newest few: `ledger.foldable`) folded
into the campaign's ledger (`LedgerFold`), in three crash-safe steps:
the ledger segment (`record`), the status write that counts it (the pass's), then deleting the
Shards and their Leases (`delete`).

A segment whose status write is lost is ignored by readers (its indices are not in doneRanges) and
written again later. Only S3 stores fold, and only those the operator holds credentials for;
ConfigMap campaigns (at most 1000 shards) keep their finished shards."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from shardops.api.enums import ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.k8s import campaigns, events
from shardops.k8s.api import LEASES, SHARDS, ApiError, KubeClient, NotFound
from shardops.k8s.shards import Actor
from shardops.scheduler.observed import Observed
from shardops.state import ledger
from shardops.store.finished import commit_recorded
from shardops.store.installation import Stores
from shardops.store.records import StoreUnavailable

log = logging.getLogger(__name__)

# The Event of a pass that folded gave-up shards: they leave the cluster but still need a person.
GAVE_UP_FOLDED = "GaveUpShardsFolded"

# Finished shards one pass folds at most (one ledger segment, one status write); more wait a pass.
MAX_FOLD = 500


class LedgerFold:
    def __init__(self, kube: KubeClient, stores: Stores, series: events.EventSeries) -> None:
        self.kube = kube
        self.stores = stores
        self.series = series

    def record(self, seen: Observed, previous: FoldedShards) -> tuple[list[Shard], FoldedShards]:
        """Write the ledger segment of the finished shards to fold this pass; the shards it holds and
        what status.folded becomes (`previous`, the status's with this pass's retry applied, and
        no shards, when nothing was written).

        Before it, each shard's recorded result is committed for reuse (`commit_recorded`: a no-op
        where its worker committed it, as it does unless it died right after its Done write)."""
        # At most MAX_FOLD: one segment a pass, whatever the campaign's size.
        candidates = ledger.foldable(seen.shards.values(), previous)[:MAX_FOLD]
        store = self.stores.ledger(seen.campaign)
        if not candidates or store is None:
            return [], previous
        folded = ledger.fold(previous, candidates, seen.campaign.spec.error_threshold.window)
        try:
            # One conditional PUT a shard, answered "already there" when its worker committed.
            for shard in candidates:
                if shard.phase is ShardPhase.DONE:
                    commit_recorded(store, shard)
            store.write_ledger(
                seen.campaign.name,
                seen.campaign.metadata.uid or "",
                folded.sequence,
                [ledger.record(s) for s in candidates],
            )
        except StoreUnavailable as error:
            log.warning("campaign %s: ledger not written, folding later: %s", seen.campaign.name, error)
            return [], previous
        return candidates, folded

    def announce(self, seen: Observed, folded: Sequence[Shard], actor: Actor, now: dt.datetime) -> None:
        """After the status write that counts them: the campaign's one Warning Event for gave-up
        shards folded into the ledger, its series raised by the number this pass folded (an Event a
        pass kept one alive per failed shard of a large campaign: each pass folds about one). Its
        note, written once, names the first of them and where all of them are."""
        gave_up = sorted(s.name for s in folded if s.phase in ledger.GAVE_UP)
        if not gave_up:
            return
        name = seen.campaign.name
        body = campaigns.series_event_body(
            seen.body,
            reason=GAVE_UP_FOLDED,
            note=(
                "Failed/Blocked shards folded into the ledger, as many as the series counts (the first: "
                f"{gave_up[0]}): kubectl campaign results {name} --failed lists them and why, kubectl "
                f"campaign retry {name} runs them again"
            ),
            actor=actor,
            now=now,
            warning=True,
        )
        self.series.add(self.kube, body, len(gave_up), now)

    def delete(self, seen: Observed, shards: Sequence[Shard]) -> None:
        """Delete Shards the ledger and the status already hold, each with its Lease.

        The Lease goes with its Shard, not at the garbage collector's pace: the collector removes it
        by owner reference, but it can fall behind a campaign that folds fast, and the Leases alive
        are bounded by the window only if they go with their Shards. Right before the Shard: the
        collector reads every dependent it still knows of an owner deleted (0.99 GETs per shard
        measured when the Lease went after), none once it has seen the Lease go. A finished shard
        needs no Lease (nobody claims it again; a retried one is cut anew), so a crash between the
        two leaves a Shard the next pass deletes; a Lease left behind (a refused delete) is the
        collector's, as before."""
        for shard in shards:
            self._delete_lease_of(shard)
            try:
                self.kube.delete(SHARDS, shard.namespace, shard.name)
            except NotFound:
                pass
            except ApiError as error:
                log.warning("deleting folded shard %s failed, next pass retries: %s", shard.name, error)
                return
            seen.shards.pop(shard.name, None)

    def _delete_lease_of(self, shard: Shard) -> None:
        try:
            self.kube.delete(LEASES, shard.namespace, shard.name)
        except NotFound:
            pass
        except ApiError as error:
            log.info("the Lease of folded shard %s is left to the garbage collector: %s", shard.name, error)
