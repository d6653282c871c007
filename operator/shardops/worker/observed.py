"""What a worker observes before it claims (`Observed`): its Campaign and the campaign's unfinished
Shards.

Two ways to observe them (an `Observer`), one answer:

* `read_observed` (`ReadObserver`) — a GET of the Campaign and a list of the unfinished shards: two
  requests, whose cost to the API server is the window's (the list), made on every observation. Used
  where a fresh answer matters: to confirm a reason to exit, and where no watch is to be had.
* `WatchedObserver` — the same two sets kept current by two watches (`Watches`, `k8s.informer`): an
  observation costs the API server nothing and the worker only the parse of what changed since its
  last one; a worker waiting for work wakes when a shard appears, changes phase or leaves the window,
  instead of polling.

Both are bounded by the window: one Campaign (selected by name) and its Shards that are not Done.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, SHARDS, KubeClient, NotFound
from shardops.k8s.informer import Changes, Informer
from shardops.k8s.shards import list_unfinished, watched_query
from shardops.logic.timefmt import parse_rfc3339
from shardops.state import ledger, shardview

log = logging.getLogger(__name__)

# How long the first observation waits for the watches' first lists before it reads directly instead.
SYNC_SECONDS = 10.0


class Wake(StrEnum):
    """Why a wait for work ended."""

    STOP = "stop"
    CHANGE = "change"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Observed:
    """What a worker observed: the Campaign and its unfinished Shards."""

    campaign: Campaign
    # The campaign's Shards that are not Done, parsed lean (`Shard.parse_items_counted`).
    unfinished: list[Shard]
    # Read just now from the API server (True), or from the watched copy (which may lag by an event).
    fresh: bool


def own(observed: Observed) -> Observed:
    """`observed` with only the shards the Campaign controls (a deleted incarnation's are not its)
    and has not folded. Only the unfinished shards: what an observation costs is bounded by the
    window, not the campaign.

    A shard whose index the campaign has folded is never worked on: it can only be a stale
    re-creation — a create an operator replica had in flight when it lost leadership, landing
    after the new leader folded and deleted that shard — which the leader deletes as a leftover
    (docs/architecture.md, "Leader election")."""
    campaign = observed.campaign
    mine = shardview.of_campaign(observed.unfinished, campaign)
    return Observed(campaign, ledger.unfolded(mine, campaign.current_status.folded), observed.fresh)


class Observer(Protocol):
    """How a worker observes its campaign (`ReadObserver`, `WatchedObserver`), and waits for work."""

    def observe(self) -> Observed:
        """The campaign and its unfinished shards; NotFound when the campaign does not exist."""
        ...

    def wait(self, seconds: float, stop: threading.Event) -> Wake:
        """Wait up to `seconds` for something that may make a shard claimable, or for `stop`."""
        ...

    def pending(self, now: dt.datetime) -> dict[str, str] | None:
        """The Pending shards whose notBefore has passed, by name: their resourceVersions, read from
        what the observer already holds (no request, no parse); None when that is not known without
        observing. A hint, not a decision: the planner decides on what is observed."""
        ...

    def close(self) -> None: ...


def read_observed(kube: KubeClient, namespace: str, campaign: str) -> Observed:
    """Two requests: the Campaign, then its unfinished shards. Read in this order, the shards are at
    least as new as the Campaign status (a fold records shards there before it deletes them)."""
    # Items counted, not parsed: shards carry their own (an observation's cost stays the window's).
    body = kube.get(CAMPAIGNS, namespace, campaign)
    unfinished = list_unfinished(kube, namespace, campaign)
    return Observed(Campaign.parse_items_counted(body), unfinished, fresh=True)


@dataclass
class ReadObserver:
    """Every observation reads (`read_observed`); waiting is sleeping."""

    kube: KubeClient
    namespace: str
    campaign: str

    def observe(self) -> Observed:
        return read_observed(self.kube, self.namespace, self.campaign)

    def wait(self, seconds: float, stop: threading.Event) -> Wake:
        return Wake.STOP if stop.wait(max(seconds, 0.0)) else Wake.TIMEOUT

    def pending(self, now: dt.datetime) -> dict[str, str] | None:
        return None

    def close(self) -> None:
        return None


def _phase(body: JSON | None) -> object:
    return ((body or {}).get("status") or {}).get("phase")


def pending_now(body: JSON, now: dt.datetime) -> bool:
    """A raw Shard is Pending and its retry backoff (notBefore), if any, has passed."""
    status = body.get("status") or {}
    if status.get("phase") != ShardPhase.PENDING:
        return False
    not_before = status.get("notBefore")
    return not not_before or parse_rfc3339(str(not_before)) <= now


def shard_change_matters(old: JSON | None, new: JSON | None) -> bool:
    """The change may let a waiting worker claim: a shard became Pending (cut, retried, reclaimed,
    resumed), or a Running shard stopped running (a slot of maxConcurrency came free). A claim by
    someone else, a shard cut as Queued, a heartbeat: nothing new to claim, nobody is woken (the
    copy follows them all the same)."""
    before, after = _phase(old), _phase(new)
    became_pending = after == ShardPhase.PENDING and before != ShardPhase.PENDING
    stopped_running = before == ShardPhase.RUNNING and after != ShardPhase.RUNNING
    return became_pending or stopped_running


# Campaign status figures the operator rewrites as work goes on and that never make a shard
# claimable (spend only grows: it can only close the budget gate).
_RUNNING_FIGURES = frozenset(
    {
        "counts",
        "spent",
        "tokens",
        "budgetRatio",
        "oldestPendingSeconds",
        "folded",
        "historyFolded",
        "historyFoldedUntil",
    }
)


def campaign_change_matters(old: JSON | None, new: JSON | None) -> bool:
    """The Campaign appeared, went, was edited (its generation), is being deleted, or its status
    changed other than in the running figures (breakers, cooldowns, phase, conditions...)."""
    if old is None or new is None:
        return True
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    for field in ("generation", "deletionTimestamp", "uid"):
        if old_meta.get(field) != new_meta.get(field):
            return True

    def gating(body: JSON) -> JSON:
        return {k: v for k, v in (body.get("status") or {}).items() if k not in _RUNNING_FIGURES}

    return gating(old) != gating(new)


class Watches:
    """The two watches of a campaign — the Campaign (by name) and its unfinished Shards that have a
    status (`watched_query`: a shard just created, not yet Pending, is left out until it is) — and
    the parses of what they hold, shared by the slots of a worker process (`WatchedObserver`, one per
    slot): one stream of changes decoded once, each object version parsed once, whatever the number
    of slots. Parses are kept per object version, so an observation parses only what changed since the last
    one. Parsed objects are shared and never changed by their readers."""

    def __init__(self, kube: KubeClient, namespace: str, campaign: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.campaign_name = campaign
        self.changes = Changes()
        self.campaign = Informer(
            kube,
            CAMPAIGNS,
            namespace,
            {"fieldSelector": f"metadata.name={campaign}"},
            self.changes,
            matters=campaign_change_matters,
            name=f"watch-campaign-{campaign}",
        )
        self.shards = Informer(
            kube,
            SHARDS,
            namespace,
            watched_query(campaign),
            self.changes,
            matters=shard_change_matters,
            name=f"watch-shards-{campaign}",
        )
        # Guards the parses, which the slots' threads read and fill.
        self._lock = threading.Lock()
        self._parsed_campaign: tuple[str, Campaign] | None = None
        self._parsed_shards: dict[str, tuple[str, Shard]] = {}
        self._waited_for_sync = False
        self.campaign.start()
        self.shards.start()

    @property
    def synced(self) -> bool:
        return self.campaign.synced and self.shards.synced

    def wait_synced_once(self) -> None:
        """The first observation of any slot waits (at most SYNC_SECONDS) for the watches' first lists."""
        with self._lock:
            if self._waited_for_sync:
                return
            self._waited_for_sync = True
        if not (self.campaign.wait_synced(SYNC_SECONDS) and self.shards.wait_synced(SYNC_SECONDS)):
            log.warning(
                "the watches of %s did not list in %.0f s (%s); reading on each observation meanwhile",
                self.campaign_name,
                SYNC_SECONDS,
                self.campaign.problem or self.shards.problem or "no answer yet",
            )

    def parsed(self) -> tuple[Campaign, list[Shard]]:
        """The watched Campaign and unfinished Shards, parsed; NotFound without the Campaign."""
        # Two watches, each current to within an event but not with each other: a decision that
        # depends on both agreeing (that the campaign is finished) is confirmed by `read_observed`.
        found = self.campaign.objects()
        if not found:
            where = f"{self.namespace}/{self.campaign_name}"
            raise NotFound(404, "NotFound", f"campaign {where} not in the watch")
        bodies = self.shards.objects()
        with self._lock:
            campaign = self._campaign(found[0])
            unfinished = [self._shard(body) for body in bodies]
            if len(self._parsed_shards) > len(bodies):
                present = {shard.name for shard in unfinished}
                self._parsed_shards = {k: v for k, v in self._parsed_shards.items() if k in present}
        return campaign, unfinished

    @staticmethod
    def version(body: JSON) -> str:
        return str(body["metadata"].get("resourceVersion") or "")

    def _campaign(self, body: JSON) -> Campaign:
        version = self.version(body)
        if self._parsed_campaign is None or self._parsed_campaign[0] != version:
            self._parsed_campaign = (version, Campaign.parse_items_counted(body))
        return self._parsed_campaign[1]

    def _shard(self, body: JSON) -> Shard:
        name, version = body["metadata"]["name"], self.version(body)
        known = self._parsed_shards.get(name)
        if known is None or known[0] != version:
            known = (version, Shard.parse_items_counted(body))
            self._parsed_shards[name] = known
        return known[1]

    def close(self) -> None:
        self.campaign.stop()
        self.shards.stop()


class WatchedObserver:
    """Observer from a campaign's watches (`Watches`): its own, or a worker process's shared by its
    slots, each slot with a view of its own (what it has observed and waited for).

    Until the watches have listed once (or when they cannot: no watch permission), observations read."""

    def __init__(
        self, kube: KubeClient, namespace: str, campaign: str, watches: Watches | None = None
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.campaign_name = campaign
        # Stopped at close() only when made here; shared watches go with their process.
        self._owns_watches = watches is None
        self.watches = watches if watches is not None else Watches(kube, namespace, campaign)
        # The change count when the last observation began: a wait after it ends at any change
        # since, also one that came between the observation and the wait.
        self._observed_at = self.changes.count

    @property
    def changes(self) -> Changes:
        return self.watches.changes

    @property
    def campaign(self) -> Informer:
        return self.watches.campaign

    @property
    def shards(self) -> Informer:
        return self.watches.shards

    def observe(self) -> Observed:
        self.watches.wait_synced_once()
        self._observed_at = self.changes.count
        if not self.watches.synced:
            return read_observed(self.kube, self.namespace, self.campaign_name)
        campaign, unfinished = self.watches.parsed()
        return Observed(campaign, unfinished, fresh=False)

    def wait(self, seconds: float, stop: threading.Event) -> Wake:
        """Until a change that matters since the last observation began (or the last wait it ended),
        `seconds`, or `stop`; checked in short slices so a stop (SIGTERM) is seen at once."""
        seen = self._observed_at
        remaining = max(seconds, 0.0)
        while remaining > 0 and not stop.is_set():
            slice_ = min(remaining, 0.2)
            now = self.changes.wait(seen, slice_)
            if now != seen:
                # The next wait waits for a change after this one: a waiter that weighed this one
                # without observing (`Worker.wait_for_work`) is not woken by it again.
                self._observed_at = now
                return Wake.CHANGE
            remaining -= slice_
        return Wake.STOP if stop.is_set() else Wake.TIMEOUT

    def pending(self, now: dt.datetime) -> dict[str, str] | None:
        if not self.shards.synced:
            return None
        # Bounded by the window: the watch holds the campaign's unfinished shards only.
        return {
            body["metadata"]["name"]: Watches.version(body)
            for body in self.shards.objects()
            if pending_now(body, now)
        }

    def close(self) -> None:
        if self._owns_watches:
            self.watches.close()
