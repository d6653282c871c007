"""A run's history, from the API server's audit log: every version of every Shard, Lease and Campaign
status the server stored, in the order it stored them, and the writes it refused.

The local control plane records these writes with their bodies when started with `record_history`
(testbed/cluster/lifecycle.py, `audit_policy`): the stored object a successful write answered is the
version; a refused write (409 Conflict, 404, 422, ...) stays an attempt, with its request. Who wrote
comes with each: the user (service account), the user agent (a shardops worker's and operator's
name their holder identity) and the server's own time (stageTimestamp).

Pure: lines or parsed entries in, a History out; no cluster, no file.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from shardops.api.campaign import CampaignSpec
from shardops.api.names import API_GROUP, CAMPAIGN_PLURAL, SHARD_PLURAL
from shardops.logic.timefmt import parse_rfc3339

JSON = dict[str, Any]

LEASE_GROUP = "coordination.k8s.io"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
SHARD_RESOURCES = frozenset({SHARD_PLURAL, f"{SHARD_PLURAL}/status"})
CAMPAIGN_STATUS = f"{CAMPAIGN_PLURAL}/status"
# shardops' own clients name their holder identity in their user agent (worker/main.py,
# scheduler/main.py): "shardops-worker/<version> (<identity>)".
_AGENT = re.compile(r"^(shardops-worker|shardops-operator)/\S+ \((?P<identity>[^)]+)\)")
# A campaign whose recorded status writes name no maxAttempts has the API's default.
DEFAULT_MAX_ATTEMPTS: int = CampaignSpec.model_fields["max_attempts"].default

ObjectKey = tuple[str, str]  # namespace, name


def key_text(key: ObjectKey) -> str:
    return f"{key[0]}/{key[1]}"


@dataclass(frozen=True)
class Write:
    """One write request as the audit log recorded it at ResponseComplete."""

    audit_id: str
    verb: str
    # "shards", "shards/status", "leases", "campaigns/status", "campaigns"
    resource: str
    namespace: str
    name: str
    username: str
    user_agent: str
    received: dt.datetime
    # When the server answered: its own clock, the one every time rule of the checker is judged on.
    stage: dt.datetime
    code: int
    request: JSON | None
    response: JSON | None
    # Answered 504 because its client went away, yet applied: the stored object is inferred
    # (`_applied_after_their_client_left`).
    applied_unanswered: bool = False

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    @property
    def agent_identity(self) -> str | None:
        """The holder identity a shardops client named in its user agent, or None."""
        match = _AGENT.match(self.user_agent)
        return match.group("identity") if match else None

    @property
    def account(self) -> tuple[str, str] | None:
        """(namespace, name) of the service account that wrote, or None for another kind of user."""
        parts = self.username.split(":")
        if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
            return parts[2], parts[3]
        return None

    def describe(self) -> str:
        who = self.agent_identity or self.username
        applied = " (applied after its client went away)" if self.applied_unanswered else ""
        return f"{self.verb} {self.resource} {self.code}{applied} by {who} at {self.stage.isoformat()}"


def _version_of(obj: JSON | None) -> int | None:
    text = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return int(text) if text and str(text).isdigit() else None


@dataclass(frozen=True)
class Version:
    """One stored version of an object: the write that made it and the object it answered."""

    write: Write
    obj: JSON
    # A delete: `obj` is the object as it was deleted (or the server's Status for a Lease).
    deleted: bool = False

    @property
    def resource_version(self) -> int | None:
        return _version_of(self.obj)

    @property
    def uid(self) -> str:
        metadata = self.obj.get("metadata") or {}
        details = self.obj.get("details") or {}
        return str(metadata.get("uid") or details.get("uid") or "")

    @property
    def metadata(self) -> JSON:
        return dict(self.obj.get("metadata") or {})

    def controller_uid(self, kind: str) -> str | None:
        """The uid of the controlling owner of `kind` (a Shard's Campaign, a Lease's Shard)."""
        for ref in self.metadata.get("ownerReferences") or []:
            if ref.get("kind") == kind:
                return str(ref.get("uid") or "") or None
        return None

    def where(self) -> str:
        return f"rv {self.resource_version} ({self.write.describe()})"


@dataclass(frozen=True)
class ShardVersion(Version):
    @property
    def spec(self) -> JSON:
        return dict(self.obj.get("spec") or {})

    @property
    def status(self) -> JSON:
        return dict(self.obj.get("status") or {})

    @property
    def campaign(self) -> str | None:
        return self.spec.get("campaign")

    @property
    def campaign_uid(self) -> str | None:
        return self.controller_uid("Campaign")

    @property
    def index(self) -> int | None:
        index = self.spec.get("index")
        return int(index) if index is not None else None

    @property
    def is_work(self) -> bool:
        return (self.spec.get("class") or "work") == "work"

    @property
    def phase(self) -> str | None:
        return self.status.get("phase")

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def owner(self) -> str | None:
        return self.status.get("owner")

    @property
    def fencing_token(self) -> int | None:
        token = self.status.get("fencingToken")
        return int(token) if token is not None else None

    @property
    def result(self) -> JSON | None:
        return self.status.get("result")

    @property
    def last_entry(self) -> JSON | None:
        entries = self.status.get("history") or []
        return dict(entries[-1]) if entries else None


@dataclass(frozen=True)
class LeaseVersion(Version):
    @property
    def spec(self) -> JSON:
        return dict(self.obj.get("spec") or {})

    @property
    def holder(self) -> str | None:
        return None if self.deleted else (self.spec.get("holderIdentity") or None)

    @property
    def transitions(self) -> int:
        return int(self.spec.get("leaseTransitions") or 0)

    @property
    def renew_time(self) -> dt.datetime | None:
        text = self.spec.get("renewTime") or self.spec.get("acquireTime")
        return parse_rfc3339(text) if text else None

    @property
    def acquire_time(self) -> dt.datetime | None:
        text = self.spec.get("acquireTime")
        return parse_rfc3339(text) if text else None

    @property
    def duration(self) -> dt.timedelta:
        return dt.timedelta(seconds=int(self.spec.get("leaseDurationSeconds") or 0))


@dataclass(frozen=True)
class CampaignVersion(Version):
    @property
    def max_attempts(self) -> int:
        value = (self.obj.get("spec") or {}).get("maxAttempts")
        return int(value) if value is not None else DEFAULT_MAX_ATTEMPTS

    @property
    def done_ranges(self) -> list[tuple[int, int]]:
        folded = (self.obj.get("status") or {}).get("folded") or {}
        return [(int(r["start"]), int(r["end"])) for r in folded.get("doneRanges") or []]

    def folded(self, index: int) -> bool:
        return any(start <= index < end for start, end in self.done_ranges)


V = TypeVar("V", bound=Version)


def _order(version: Version) -> tuple[int, int, dt.datetime]:
    """Server order: by resourceVersion (etcd's revision, one counter for every resource); a delete
    answered with a Status (no version) goes after everything of its object."""
    rv = version.resource_version
    return (0, rv, version.write.stage) if rv is not None else (1, 0, version.write.stage)


@dataclass
class History:
    shards: dict[ObjectKey, list[ShardVersion]] = field(default_factory=dict)
    leases: dict[ObjectKey, list[LeaseVersion]] = field(default_factory=dict)
    campaigns: dict[ObjectKey, list[CampaignVersion]] = field(default_factory=dict)
    # Writes the server refused (409 Conflict, 404, 422, ...), in the order it answered them.
    failed_writes: list[Write] = field(default_factory=list)
    # Campaigns deleted (from the Metadata-level record of `campaigns`): their Shards go with them.
    campaign_deletes: dict[ObjectKey, Write] = field(default_factory=dict)
    # Successful writes recorded without the stored object: a recording made without
    # `record_history`, or a policy that misses a resource. The checker refuses such a history.
    without_body: list[Write] = field(default_factory=list)
    # Writes answered 504 after their client went away and taken as applied (their versions are in
    # `shards`): `_applied_after_their_client_left`.
    applied_unanswered: list[Write] = field(default_factory=list)

    def lease_in_force(self, key: ObjectKey, before: int) -> LeaseVersion | None:
        """The Lease `key` as stored just before resourceVersion `before` (None: none yet, or deleted)."""
        found = None
        for version in self.leases.get(key, []):
            rv = version.resource_version
            if rv is None or rv >= before:
                break
            found = version
        return None if found is None or found.deleted else found

    def campaign_in_force(
        self, key: ObjectKey, uid: str | None, before: int | None
    ) -> CampaignVersion | None:
        """The campaign status stored last before `before` (any, when None), of the incarnation `uid`;
        the first one recorded when none came before."""
        versions = [v for v in self.campaigns.get(key, []) if uid is None or v.uid == uid]
        earlier = [v for v in versions if before is None or (v.resource_version or 0) < before]
        if earlier:
            return earlier[-1]
        return versions[0] if versions else None

    def counts(self) -> dict[str, int]:
        """How much there is: what a check covered."""
        return {
            "shards": len(self.shards),
            "shard versions": sum(len(v) for v in self.shards.values()),
            "leases": len(self.leases),
            "lease versions": sum(len(v) for v in self.leases.values()),
            "campaign status versions": sum(len(v) for v in self.campaigns.values()),
            "failed writes": len(self.failed_writes),
            "writes applied after their client went away": len(self.applied_unanswered),
        }


def _parse_time(text: str | None) -> dt.datetime:
    if not text:
        raise ValueError("audit entry without a timestamp")
    return parse_rfc3339(text)


def write_of(entry: Mapping[str, Any]) -> Write | None:
    """The write an audit entry records, or None for anything else (reads, other stages, other
    resources)."""
    if entry.get("stage") != "ResponseComplete" or entry.get("verb") not in WRITE_VERBS:
        return None
    ref = entry.get("objectRef") or {}
    group = ref.get("apiGroup") or ""
    resource = str(ref.get("resource") or "")
    if ref.get("subresource"):
        resource += f"/{ref['subresource']}"
    ours = (group == API_GROUP and (resource in SHARD_RESOURCES or resource.startswith(CAMPAIGN_PLURAL))) or (
        group == LEASE_GROUP and resource == "leases"
    )
    if not ours:
        return None
    response = entry.get("responseObject")
    name = ref.get("name") or ((response or {}).get("metadata") or {}).get("name") or ""
    user = entry.get("user") or {}
    return Write(
        audit_id=str(entry.get("auditID") or ""),
        verb=str(entry["verb"]),
        resource=resource,
        namespace=str(ref.get("namespace") or ""),
        name=str(name),
        username=str(user.get("username") or ""),
        user_agent=str(entry.get("userAgent") or ""),
        received=_parse_time(entry.get("requestReceivedTimestamp") or entry.get("stageTimestamp")),
        stage=_parse_time(entry.get("stageTimestamp")),
        code=int((entry.get("responseStatus") or {}).get("code") or 0),
        request=entry.get("requestObject"),
        response=response,
    )


def _stored_objects(write: Write) -> Iterator[JSON]:
    """The objects a successful write stored: one, or each item of a deletecollection's list."""
    response = write.response or {}
    if write.verb == "deletecollection":
        yield from response.get("items") or []
    else:
        yield response


def from_entries(entries: Iterable[Mapping[str, Any]]) -> History:
    """The History of parsed audit entries (any order, any namespaces)."""
    shards: dict[ObjectKey, list[ShardVersion]] = defaultdict(list)
    leases: dict[ObjectKey, list[LeaseVersion]] = defaultdict(list)
    campaigns: dict[ObjectKey, list[CampaignVersion]] = defaultdict(list)
    history = History()
    for entry in entries:
        write = write_of(entry)
        if write is None:
            continue
        if not write.succeeded:
            history.failed_writes.append(write)
            continue
        if write.resource == CAMPAIGN_PLURAL:
            # Recorded at level Metadata: only its deletion matters here.
            if write.verb == "delete":
                history.campaign_deletes[(write.namespace, write.name)] = write
            continue
        if write.response is None:
            history.without_body.append(write)
            continue
        deleted = write.verb in ("delete", "deletecollection")
        for obj in _stored_objects(write):
            name = str((obj.get("metadata") or {}).get("name") or write.name)
            key = (write.namespace, name)
            if write.resource in SHARD_RESOURCES:
                shards[key].append(ShardVersion(write, obj, deleted))
            elif write.resource == "leases":
                leases[key].append(LeaseVersion(write, obj, deleted))
            elif write.resource == CAMPAIGN_STATUS:
                campaigns[key].append(CampaignVersion(write, obj, deleted))
    history.shards = _in_server_order(shards)
    history.leases = _in_server_order(leases)
    history.campaigns = _in_server_order(campaigns)
    history.failed_writes.sort(key=lambda w: w.stage)
    _applied_after_their_client_left(history)
    return history


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces.
    A new object: neither argument is changed or shared with it. (The unit tests' fake API server
    applies merge patches with it too.)"""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _applied_after_their_client_left(history: History) -> None:
    """Shard status patches the server answered 504 and applied all the same: the version each made.

    The API server runs a write to its end even when its client goes away mid-request (a worker
    SIGKILLed right after sending its Done write): the request's context ends, the server answers
    504 Timeout to nobody — which is what the audit log records, with no stored object — and the
    write lands a moment later. Such a patch is taken as applied when nothing recorded says it was
    not: it was made at the resourceVersion of the shard's last stored version, and no later version
    of the shard was stored (only, perhaps, its deletion). Its version is that one with the patch
    merged in, at the newest resourceVersion the server had stored by the time it answered."""
    answered_by = [
        (v.write.stage, v.resource_version)
        for versions in (*history.shards.values(), *history.leases.values(), *history.campaigns.values())
        for v in versions
        if v.resource_version is not None
    ]
    for write in list(history.failed_writes):
        patch = write.request or {}
        if (write.code, write.verb, write.resource) != (504, "patch", f"{SHARD_PLURAL}/status"):
            continue
        versions = history.shards.get((write.namespace, write.name), [])
        stored = [v for v in versions if not v.deleted]
        if not stored or any(v.write.stage > write.stage for v in stored):
            continue
        last = stored[-1]
        based_on = str((patch.get("metadata") or {}).get("resourceVersion") or "")
        if based_on != str(last.resource_version):
            continue
        newest = max((rv for stage, rv in answered_by if stage <= write.stage), default=0)
        rv = max(newest, last.resource_version or 0)
        obj = merge_patch(last.obj, {key: value for key, value in patch.items() if key != "metadata"})
        obj["metadata"] = {**last.metadata, "resourceVersion": str(rv)}
        applied = replace(write, applied_unanswered=True, response=obj)
        versions.insert(versions.index(last) + 1, ShardVersion(applied, obj))
        history.failed_writes.remove(write)
        history.applied_unanswered.append(applied)


def _in_server_order(groups: Mapping[ObjectKey, list[V]]) -> dict[ObjectKey, list[V]]:
    return {key: sorted(versions, key=_order) for key, versions in sorted(groups.items())}


def parse_lines(lines: Iterable[str]) -> History:
    """The History of audit-log lines (JSON, one entry a line); blank lines are skipped."""
    return from_entries(json.loads(line) for line in lines if line.strip())
