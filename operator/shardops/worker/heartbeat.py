"""Heartbeats and every other write a claim holder makes, fenced (docs/architecture.md, "Fencing").

A holder writes only after proving, at that moment, that the claim is still its own:

* the Lease is renewed with its last resourceVersion as precondition (`leases.renew`); a 409 from
  anyone else's write, or a different holder or token on re-read, is `Fenced`;
* the shard status is patched with the shard's last resourceVersion as precondition; on a 409 the
  shard is re-read and the write is retried only if it still names us as owner with our fencing
  token, else `Fenced`.

`Fenced` means: stop the command at once and write nothing more — the new holder's writes win.
A heartbeat carries attempt and progress (a heartbeat without progress counts as none) plus cost,
tokens (when the command reports any), lastHeartbeat and leaseUntil; logs never travel on it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from decimal import Decimal
from enum import StrEnum

from shardops.api.common import JSON, TokenCounts
from shardops.api.enums import ShardPhase
from shardops.api.money import money_text
from shardops.api.shard import Progress, Shard
from shardops.k8s import leases
from shardops.k8s.api import SHARDS, Conflict, KubeClient, NotFound

log = logging.getLogger(__name__)

# Our own writes can race only with the operator's bookkeeping on a Running shard; a few rounds
# separate that from a takeover, which shows on the first re-read.
_WRITE_ROUNDS = 3


class FenceReason(StrEnum):
    """What showed that the claim is not ours any more (a label of shardops_worker_fenced_total)."""

    # The API server refused the Lease renewal: another holder, or a newer fencing token.
    LEASE = "lease"
    # The shard status names another owner or token (or kept changing under our writes).
    SHARD = "shard"
    # The shard was deleted (its campaign went, or someone deleted it).
    DELETED = "deleted"
    # The lease ran out while the API server could not be reached: we stop before anyone refuses us.
    EXPIRED = "expired"


class Fenced(Exception):
    """The claim is not ours any more: someone took the shard over. Write nothing."""

    def __init__(self, message: str, reason: FenceReason) -> None:
        super().__init__(message)
        self.reason = reason


def still_ours(shard: Shard, holder: str, token: int) -> bool:
    status = shard.current_status
    return status.phase is ShardPhase.RUNNING and status.owner == holder and status.fencing_token == token


def renew(kube: KubeClient, claim: leases.Claim, now: dt.datetime) -> leases.Claim:
    """The renewed claim, or Fenced when the Lease is no longer ours."""
    try:
        return leases.renew(kube, claim, now)
    except leases.LeaseLost as lost:
        raise Fenced(str(lost), FenceReason.LEASE) from lost


def write_as_holder(
    kube: KubeClient, shard: Shard, holder: str, token: int, write: Callable[[Shard], Shard]
) -> Shard:
    """Run `write(shard)` (a write with the shard's resourceVersion as precondition) as the holder.

    A 409 means someone wrote the shard since we last did: re-read, and retry only while the shard
    still names us as owner with our token.
    """
    current = shard
    for _ in range(_WRITE_ROUNDS):
        try:
            return write(current)
        except Conflict:
            try:
                current = Shard.parse(kube.get(SHARDS, shard.namespace, shard.name))
            except NotFound as gone:
                raise Fenced(f"shard {shard.name} was deleted", FenceReason.DELETED) from gone
            if not still_ours(current, holder, token):
                status = current.current_status
                raise Fenced(
                    f"shard {shard.name} is now {status.phase} owned by {status.owner!r} "
                    f"(token {status.fencing_token}), not by us (token {token})",
                    FenceReason.SHARD,
                ) from None
        except NotFound as gone:
            raise Fenced(f"shard {shard.name} was deleted", FenceReason.DELETED) from gone
    raise Fenced(f"shard {shard.name} kept changing under us", FenceReason.SHARD)


def heartbeat_patch(
    attempt: int,
    progress: Progress,
    cost: Decimal,
    now: dt.datetime,
    lease_until: dt.datetime,
    tokens: TokenCounts | None = None,
) -> JSON:
    status: JSON = {
        "attempt": attempt,
        "progress": progress.to_dict(),
        "cost": money_text(cost),
        "lastHeartbeat": _time(now),
        "leaseUntil": _time(lease_until),
    }
    if tokens is not None:
        status["tokens"] = tokens.to_dict()
    return {"status": status}


def _time(moment: dt.datetime) -> str:
    # The CRD types these as date-time; seconds are what kubectl shows, micro precision is what
    # the Lease has. Keep the sub-second part so leaseUntil in the status equals the Lease's.
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def patch_heartbeat(kube: KubeClient, shard: Shard, patch: JSON) -> Shard:
    """One status patch at the shard's resourceVersion."""
    return Shard.parse(
        kube.patch(
            SHARDS,
            shard.namespace,
            shard.name,
            patch,
            resource_version=shard.metadata.resource_version,
            subresource="status",
        )
    )
