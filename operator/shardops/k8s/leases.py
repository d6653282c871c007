"""Claims on shards as coordination.k8s.io Leases, with `leaseTransitions` as the fencing token.

A shard's Lease is created on its first claim and never deleted while the shard lives (the Shard
owns it, so the garbage collector removes it with the shard). Releasing clears the holder instead
of deleting: that keeps `leaseTransitions` growing for the shard's whole life, so a token handed out
once is never handed out again and a stale holder can always be told apart (a fencing token:
docs/architecture.md, "Fencing").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from shardops.api.common import JSON
from shardops.k8s.ambiguous import write_recognised
from shardops.k8s.api import LEASES, AlreadyExists, Conflict, KubeClient, NotFound
from shardops.logic.leases import Renewals, is_expired
from shardops.logic.timefmt import micro_time as format_micro_time
from shardops.logic.timefmt import parse_rfc3339


class LeaseLost(Exception):
    """The Lease is no longer ours: someone took it over after it expired, or it was released."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    holder: str
    fencing_token: int
    resource_version: str
    duration_seconds: int
    renewed_at: dt.datetime

    @property
    def until(self) -> dt.datetime:
        return self.renewed_at + dt.timedelta(seconds=self.duration_seconds)


def parse_time(value: str | None) -> dt.datetime | None:
    return parse_rfc3339(value) if value else None


def lease_expires_at(lease: JSON) -> dt.datetime | None:
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if not spec.get("holderIdentity") or renewed is None:
        return None
    return renewed + dt.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))


def is_free(lease: JSON, seen: Renewals) -> bool:
    """Nobody holds it, or this process has not seen its holder renew it for a full lease duration
    on its own clock (a zombie's claim). The holder's renewTime is compared only with what the same
    holder wrote before, never with this process's clock (`logic.leases`, "Whose clock")."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder:
        return True
    name = str((lease.get("metadata") or {}).get("name") or "")
    silent = seen.observe(name, holder, lease_expires_at(lease))
    return is_expired(silent, int(spec.get("leaseDurationSeconds") or 0))


def owned_by_an_earlier(lease: JSON, owner: JSON | None) -> bool:
    """Whether `lease` belongs to an earlier object of the name `owner` has: its owner references
    name none with `owner`'s uid. The Shard it was held for is gone (a Campaign deleted and applied
    again; a Done shard's Lease is left held, worker/holding.py), so its holder claims nothing that
    still exists: the Lease is free for the new Shard's claimer at once, not after the garbage
    collector or a lease duration. Taking it over moves the fencing token on, so that holder, were it
    still running, is fenced at its next write."""
    uid = (owner or {}).get("uid")
    references = (lease.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and bool(references) and all(ref.get("uid") != uid for ref in references)


def _lease_body(
    name: str, holder: str, duration: int, transitions: int, now: dt.datetime, owner: JSON | None
) -> JSON:
    metadata: JSON = {"name": name}
    if owner:
        metadata["ownerReferences"] = [owner]
    stamp = format_micro_time(now)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


def _claim_from(lease: JSON, namespace: str, now: dt.datetime) -> Claim:
    spec = lease["spec"]
    return Claim(
        namespace=namespace,
        name=lease["metadata"]["name"],
        holder=spec["holderIdentity"],
        fencing_token=int(spec.get("leaseTransitions") or 0),
        resource_version=lease["metadata"]["resourceVersion"],
        duration_seconds=int(spec["leaseDurationSeconds"]),
        renewed_at=now,
    )


def acquire(
    kube: KubeClient,
    namespace: str,
    name: str,
    holder: str,
    duration_seconds: int,
    now: dt.datetime,
    owner: JSON | None = None,
    *,
    seen: Renewals,
    may_exist: bool = True,
) -> Claim | None:
    """Take the Lease if it is free, or held for an earlier Shard of its name (`owned_by_an_earlier`,
    `owner` naming the shard claimed); None when someone else holds it or won the race.

    `seen`: this process's record of renewals (`is_free`); `now` only stamps the new claim.

    `may_exist=False`: the shard was never claimed, so its Lease most likely does not exist yet —
    create it without reading first (one request instead of two). When it exists after all, someone
    created it a moment ago (None, no read: a crowd of workers racing for a new shard costs one
    request each); a caller that keeps meeting it (a claimer that crashed between its Lease and its
    claim write) asks again with `may_exist=True`, which reads the Lease and judges it.

    A create or takeover whose answer was lost (applied, then answered with an error, or its retry
    refused by the write itself) is recognised on a re-read by holder and fencing token: the
    Lease is ours, and walking away from it would leave the shard unclaimable until it runs out."""

    def ours(transitions: int) -> Callable[[], JSON | None]:
        def reread() -> JSON | None:
            current = read(kube, namespace, name)
            mine = current is not None and holder_and_token(current) == (holder, transitions)
            return current if mine else None

        return reread

    def create() -> Claim | None:
        body = _lease_body(name, holder, duration_seconds, 1, now, owner)
        try:
            created = write_recognised(
                lambda: kube.create(LEASES, namespace, body), ours(1), f"create of lease {name}"
            )
        except AlreadyExists:
            return None
        return _claim_from(created, namespace, now)

    if not may_exist:
        return create()
    try:
        current = kube.get(LEASES, namespace, name)
    except NotFound:
        return create()
    if not is_free(current, seen) and not owned_by_an_earlier(current, owner):
        return None
    transitions = int((current.get("spec") or {}).get("leaseTransitions") or 0) + 1
    body = _lease_body(name, holder, duration_seconds, transitions, now, None)
    body["metadata"] = {**current["metadata"]}
    if owner:
        # A Campaign deleted and re-applied leaves a Lease owned by the old Shard until the garbage
        # collector gets to it (`owned_by_an_earlier`); the new holder re-points it, or the
        # collector deletes it under us.
        body["metadata"]["ownerReferences"] = [owner]
    try:
        updated = write_recognised(
            lambda: kube.replace(LEASES, namespace, name, body), ours(transitions), f"takeover of {name}"
        )
    except (Conflict, NotFound):
        return None  # changed, or deleted by the garbage collector: the next observation tries again
    return _claim_from(updated, namespace, now)


def renew(kube: KubeClient, claim: Claim, now: dt.datetime) -> Claim:
    """Extend our claim. Raises LeaseLost when it is not ours any more: the caller must stop at once.

    One PATCH with our last resourceVersion as precondition; only on a conflict do we re-read, to
    tell "someone else touched it" (lost) from "our own earlier write raced" (retry once).
    """
    resource_version = claim.resource_version
    for _ in range(2):
        try:
            updated = kube.patch(
                LEASES,
                claim.namespace,
                claim.name,
                {"spec": {"renewTime": format_micro_time(now)}},
                resource_version=resource_version,
            )
            return _claim_from(updated, claim.namespace, now)
        except NotFound as error:
            raise LeaseLost(f"lease {claim.name} is gone") from error
        except Conflict:
            current = _read_if_ours(kube, claim)
            resource_version = current["metadata"]["resourceVersion"]
    raise LeaseLost(f"lease {claim.name} keeps changing under us")


def release(kube: KubeClient, claim: Claim) -> bool:
    """Give the claim back (graceful shutdown, completion). False when it was no longer ours.

    A release whose answer was lost is recognised on a re-read: nobody holds the Lease and its
    fencing token is still ours, so nobody took it over in between."""

    def reread() -> bool | None:
        current = read(kube, claim.namespace, claim.name)
        released = current is not None and holder_and_token(current) == (None, claim.fencing_token)
        return True if released else None

    def write() -> bool:
        current = _read_if_ours(kube, claim)
        kube.patch(
            LEASES,
            claim.namespace,
            claim.name,
            {"spec": {"holderIdentity": None, "renewTime": None, "acquireTime": None}},
            resource_version=current["metadata"]["resourceVersion"],
        )
        return True

    try:
        return write_recognised(write, reread, f"release of lease {claim.name}")
    except (LeaseLost, Conflict, NotFound):
        return False


def _read_if_ours(kube: KubeClient, claim: Claim) -> JSON:
    try:
        current = kube.get(LEASES, claim.namespace, claim.name)
    except NotFound as error:
        raise LeaseLost(f"lease {claim.name} is gone") from error
    if not holds(current, claim):
        spec = current.get("spec") or {}
        raise LeaseLost(
            f"lease {claim.name} is held by {spec.get('holderIdentity')!r} "
            f"(token {spec.get('leaseTransitions')}), not by us (token {claim.fencing_token})"
        )
    return current


def holds(lease: JSON, claim: Claim) -> bool:
    return holder_and_token(lease) == (claim.holder, claim.fencing_token)


def holder_and_token(lease: JSON) -> tuple[str | None, int]:
    """Who holds the Lease (None: nobody) and its fencing token (leaseTransitions)."""
    spec = lease.get("spec") or {}
    return spec.get("holderIdentity") or None, int(spec.get("leaseTransitions") or 0)


def read(kube: KubeClient, namespace: str, name: str) -> JSON | None:
    """The Lease as stored, or None when it does not exist (the shard was never claimed)."""
    try:
        return kube.get(LEASES, namespace, name)
    except NotFound:
        return None


def revoke(kube: KubeClient, lease: JSON) -> bool:
    """Clear the holder of `lease` as it was read: the scheduler takes back an expired or stalled claim.

    The resourceVersion precondition makes this lose to a renewal that landed after the read (the
    holder was alive after all): False then, and the caller leaves the shard alone. The holder's
    next renewal conflicts, it re-reads, sees it is no longer the holder and stops (LeaseLost).
    """
    metadata = lease.get("metadata") or {}
    try:
        kube.patch(
            LEASES,
            str(metadata.get("namespace") or ""),
            str(metadata.get("name") or ""),
            {"spec": {"holderIdentity": None, "renewTime": None, "acquireTime": None}},
            resource_version=metadata.get("resourceVersion"),
        )
    except (Conflict, NotFound):
        return False
    return True
