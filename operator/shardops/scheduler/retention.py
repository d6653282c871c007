"""Result retention: a finished campaign's stored results go `retention` seconds after it finished,
once no Campaign of its name exists in its namespace.

Results outlive their Campaign on purpose (re-applying it reuses them), so the operator cannot
delete them when the Campaign goes; it records instead, when a campaign finishes, what it would have
to delete and when:

* **The record.** `<prefix>/_retention/<namespace>/<campaign>/<uid>-<finished>.json` in the
  installation's S3 store, written once (If-None-Match) per finish: the campaign's store location,
  when it finished, its retention, and the idempotency keys of its live Shards (folded ones are in
  its ledger, which the record names by uid). A campaign that finishes again (a retry) writes a new
  record; after an operator restart the write is refused as a duplicate, one PUT per campaign.
* **The sweep** (the leader, every `retention_sweep_seconds`) lists the records (bounded by the
  finished campaigns with a retention, not by their shards), groups them by namespace and name, and
  for a group whose every record expired and whose Campaign does not exist deletes, per record,
  each key's objects (attempts, item chunks, committed pointer) and the ledger, then the campaign's
  uploaded inputs, then the records. Conservative by construction: a name re-applied and finished
  later waits for its own retention; a Campaign of that name that exists keeps everything.
* **Only the leader deletes.** The sweep asks `is_leader` before every deletion and stops the moment
  the answer is no: a replica that lost its Lease (frozen, partitioned) never deletes behind the
  new leader's back; the election makes a replica stop leading before another may start.
* **Never under a new incarnation.** A Campaign re-applied under the name reuses the results by
  idempotency key. The name is marked as swept (`sweeping`) *before* the sweep checks that no
  Campaign of it exists, and a pass over a Campaign of that name waits while it is marked (the
  reconcile asks, `scheduler/reconcile.py`), so a new Campaign either exists at the check (nothing
  goes) or cuts its first shard after the sweep ended (and finds nothing to reuse). Both run in
  the leader, so the mark needs no store. Each key's committed pointer goes first: a key left half
  deleted (leadership lost mid-key) reads as no result, never as a pointer to a deleted object.

Only stores the operator holds credentials for (the installation's) are covered; a campaign with its
own credentialsSecret, and the ConfigMap store, keep results until `kubectl campaign purge`.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.common import JSON, Condition
from shardops.api.enums import ConditionType, StoreType
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus, retention_of
from shardops.k8s.api import CAMPAIGNS, Kube, NotFound
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store

log = logging.getLogger(__name__)

StoreFor = Callable[[str, ResultStoreStatus], S3Store | None]


class NotLeading(Exception):
    """This replica stopped leading during a sweep: it deletes nothing more."""


def finished_at(campaign: Campaign) -> dt.datetime | None:
    """When the campaign last finished (its Complete condition turned True), or None while it runs."""
    complete: Condition | None = campaign.current_status.condition(str(ConditionType.COMPLETE))
    if complete is None or complete.status != "True":
        return None
    return complete.last_transition_time


def record_body(
    campaign: Campaign,
    location: ResultStoreStatus,
    shards: Iterable[Shard],
    finished: dt.datetime,
    retention: int,
) -> JSON:
    """The retention record of one finish. `shards` are the campaign's live Shards (window-bounded
    with folding; with the ConfigMap store there is no record)."""
    return {
        "namespace": campaign.namespace,
        "campaign": campaign.name,
        "uid": campaign.metadata.uid or "",
        "finishedAt": finished.isoformat(),
        "retentionSeconds": retention,
        "expiresAt": (finished + dt.timedelta(seconds=retention)).isoformat(),
        "location": location.to_dict(),
        "keys": sorted({s.spec.idempotency_key for s in shards}),
    }


def expired(records: Sequence[Mapping[str, Any]], now: dt.datetime) -> bool:
    """Every record of one campaign name is past its expiry (a newer finish waits for its own)."""
    return bool(records) and all(dt.datetime.fromisoformat(str(r["expiresAt"])) <= now for r in records)


def group_of(name: str, root: str) -> tuple[str, str] | None:
    """(namespace, campaign) of a record name under `root`, None for anything else."""
    parts = name.removeprefix(root).split("/")
    if not name.startswith(root) or len(parts) != 3 or not parts[2].endswith(".json"):
        return None
    return parts[0], parts[1]


@dataclass
class Retention:
    """Records finishes and sweeps expired results. `store_for(namespace, location)` is the S3 store
    with the operator's credentials (None when only the campaign's workers hold them)."""

    kube: Kube
    installation: ResultStoreStatus
    default_seconds: int | None
    store_for: StoreFor
    is_leader: Callable[[], bool] = field(default=lambda: True)

    def __post_init__(self) -> None:
        # Records already written by this process (name): a finished campaign's every pass would
        # otherwise try the write again. Bounded by the finished campaigns seen since start.
        self._written: set[str] = set()
        # (namespace, campaign) whose results the sweep is deleting now: at most one at a time.
        self._sweeping: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def sweeping(self, namespace: str, campaign: str) -> bool:
        """True while the sweep deletes the results of an earlier campaign of this name: a pass
        over a Campaign of the name must cut nothing until then (it would reuse what goes)."""
        with self._lock:
            return (namespace, campaign) in self._sweeping

    def _leading(self) -> None:
        if not self.is_leader():
            raise NotLeading("this replica no longer leads: the retention sweep stops")

    def _index(self, namespace: str) -> S3Store | None:
        """The installation's S3 store, where the records of every namespace live."""
        if not self.installation.bucket:
            return None
        return self.store_for(namespace, self.installation.model_copy(update={"type": StoreType.S3}))

    def record(self, campaign: Campaign, shards: Iterable[Shard]) -> str | None:
        """Write the record of the campaign's latest finish, once; its name, or None when there is
        nothing to record (running, no retention, not an S3 store the operator can delete from)."""
        finished = finished_at(campaign)
        location = campaign.current_status.result_store
        retention = retention_of(campaign.spec.result_store, self.default_seconds)
        if finished is None or retention is None or location is None or location.type is not StoreType.S3:
            return None
        index = self._index(campaign.namespace)
        if index is None or self.store_for(campaign.namespace, location) is None:
            return None
        name = index.retention_name(campaign.name, campaign.metadata.uid or "", int(finished.timestamp()))
        if name in self._written:
            return name
        index.put_record(name, record_body(campaign, location, shards, finished, retention))
        self._written.add(name)
        log.info(
            "campaign %s/%s finished at %s: its results are kept %ds after that (record %s)",
            campaign.namespace,
            campaign.name,
            finished.isoformat(),
            retention,
            name,
        )
        return name

    def sweep(self, now: dt.datetime) -> int:
        """Delete the results of every campaign past its retention whose Campaign is gone; the number
        of objects deleted. A store error stops this sweep (the next one retries)."""
        index = self._index("")
        if index is None:
            return 0
        root = index.retention_prefix()
        groups: dict[tuple[str, str], list[str]] = {}
        # Bounded by the finished campaigns with a retention, one record per finish.
        for name in index.names(root):
            found = group_of(name, root)
            if found is not None:
                groups.setdefault(found, []).append(name)
        deleted = 0
        for (namespace, campaign), names in sorted(groups.items()):
            try:
                deleted += self._sweep_marked(index, namespace, campaign, names, now)
            except StoreUnavailable as error:
                log.warning("retention sweep stopped at %s/%s: %s", namespace, campaign, error)
                break
            except NotLeading as stopped:
                log.warning("retention sweep stopped at %s/%s: %s", namespace, campaign, stopped)
                break
        return deleted

    def _sweep_marked(
        self, index: S3Store, namespace: str, campaign: str, names: list[str], now: dt.datetime
    ) -> int:
        self._leading()
        with self._lock:
            self._sweeping.add((namespace, campaign))
        try:
            return self._sweep_one(index, namespace, campaign, names, now)
        finally:
            with self._lock:
                self._sweeping.discard((namespace, campaign))

    def _sweep_one(
        self, index: S3Store, namespace: str, campaign: str, names: list[str], now: dt.datetime
    ) -> int:
        records = [r for r in (index.get_record(n) for n in names) if r is not None]
        if not expired(records, now):
            return 0
        try:
            # After the mark (`_sweep_marked`): a Campaign created from here on waits for the sweep.
            self.kube.get(CAMPAIGNS, namespace, campaign)
            return 0  # a Campaign of this name references these results: nothing goes
        except NotFound:
            pass
        deleted = 0
        stores: list[S3Store] = []
        for record in records:
            store = self.store_for(namespace, ResultStoreStatus.model_validate(record["location"]))
            if store is None:
                continue
            stores.append(store)
            keys = set(record.get("keys") or [])
            uid = str(record.get("uid") or "")
            keys |= {
                str(line["idempotencyKey"])
                for line in store.read_ledger(campaign, uid)
                if "idempotencyKey" in line
            }
            for key in sorted(keys):
                self._leading()
                deleted += store.delete_key(key)
            self._leading()
            deleted += store.delete_prefix(store.ledger_prefix(campaign, uid))
        for store in {s.describe(): s for s in stores}.values():
            self._leading()
            deleted += store.delete_prefix(store.input_prefix(campaign))
        for name in names:
            self._leading()
            index.delete_prefix(name)
        log.info(
            "results of campaign %s/%s are past their retention and no Campaign of that name exists: "
            "deleted %d object(s)",
            namespace,
            campaign,
            deleted,
        )
        return deleted
