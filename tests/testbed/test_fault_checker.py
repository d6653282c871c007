"""The fault checker (testbed/faults/checker.py) on synthetic audit logs: a clean run passes, and the
same run with one planted violation of each invariant reports exactly that violation.

The run is written as the API server's audit log would record it (one JSON entry per write, with
the stored object), so parsing (testbed/faults/history.py) is tested along with the checks.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from testbed.cluster.lifecycle import HISTORY_NAMESPACES, HISTORY_RESOURCES, audit_policy
from testbed.faults import checker
from testbed.faults.checker import Identities, Violation
from testbed.faults.history import History, parse_lines

from shardops.api.common import JSON

NS = "ns"
CAMPAIGN = "camp"
CAMPAIGN_UID = "campaign-uid"
LEASE_SECONDS = 10
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
IDENTITIES = Identities(frozenset({"shardops-operator"}), frozenset({"shardops-worker"}))
FINGERPRINT = "sha256:" + "ab" * 32


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Writer:
    def __init__(self, username: str, agent: str) -> None:
        self.username, self.agent = username, agent


OPERATOR = Writer(f"system:serviceaccount:{NS}:shardops-operator", "shardops-operator/0.1 (operator-0)")
# The standby replica, in the scenarios where it takes over.
OPERATOR_B = Writer(f"system:serviceaccount:{NS}:shardops-operator", "shardops-operator/0.1 (operator-1)")
ADMIN = Writer("shardops-admin", "kubectl/v1.31.0")
GC = Writer("system:serviceaccount:kube-system:generic-garbage-collector", "kube-controller-manager/v1.31.0")


def worker(identity: str) -> Writer:
    return Writer(f"system:serviceaccount:{NS}:shardops-worker", f"shardops-worker/0.1 ({identity})")


A, B, C = worker("worker-a"), worker("worker-b"), worker("worker-c")


class Recording:
    """An audit log in the making: every write gets the next resourceVersion, as etcd would."""

    def __init__(self) -> None:
        self.entries: list[JSON] = []
        self.version = 100
        self.shards: dict[str, JSON] = {}
        self.leases: dict[str, JSON] = {}
        self.uids = 0

    def _uid(self, kind: str) -> str:
        self.uids += 1
        return f"{kind}-uid-{self.uids}"

    def _stored(self, obj: JSON) -> JSON:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    def _entry(
        self,
        writer: Writer,
        verb: str,
        resource: str,
        name: str,
        seconds: float,
        code: int = 200,
        response: JSON | None = None,
        request: JSON | None = None,
    ) -> JSON:
        plural, _, subresource = resource.partition("/")
        ref: JSON = {
            "resource": plural,
            "namespace": NS,
            "name": name,
            "apiGroup": "coordination.k8s.io" if plural == "leases" else "shardops.dev",
        }
        if subresource:
            ref["subresource"] = subresource
        entry: JSON = {
            "auditID": f"audit-{len(self.entries)}",
            "stage": "ResponseComplete",
            "verb": verb,
            "user": {"username": writer.username},
            "userAgent": writer.agent,
            "objectRef": ref,
            "responseStatus": {"code": code},
            "requestObject": request or {},
            "requestReceivedTimestamp": stamp(seconds),
            "stageTimestamp": stamp(seconds),
        }
        if response is not None:
            entry["responseObject"] = response
        self.entries.append(entry)
        return entry

    # --- campaigns ---

    def campaign_status(
        self, seconds: float, done: tuple[tuple[int, int], ...] = (), max_attempts: int = 3, **status: Any
    ) -> None:
        obj = {
            "metadata": {"name": CAMPAIGN, "namespace": NS, "uid": CAMPAIGN_UID},
            "spec": {"maxAttempts": max_attempts, "leaseSeconds": LEASE_SECONDS, "maxConcurrency": 2},
            "status": {"folded": {"doneRanges": [{"start": s, "end": e} for s, e in done]}, **status},
        }
        self._entry(OPERATOR, "patch", "campaigns/status", CAMPAIGN, seconds, response=self._stored(obj))

    # --- shards ---

    def create_shard(
        self, name: str, index: int, seconds: float, writer: Writer | None = None, planned: str | None = None
    ) -> None:
        self.shards[name] = {
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": self._uid("shard"),
                "ownerReferences": [{"kind": "Campaign", "name": CAMPAIGN, "uid": CAMPAIGN_UID}],
            },
            "spec": {"campaign": CAMPAIGN, "index": index, "class": "work", "idempotencyKey": f"k{index}"},
        }
        if planned is not None:
            self.shards[name]["metadata"]["annotations"] = {"shardops.dev/planned-from": planned}
        stored = self._stored(self.shards[name])
        self._entry(writer or OPERATOR, "create", "shards", name, seconds, response=stored)

    def status(
        self, name: str, writer: Writer, seconds: float, reason: str | None = None, **fields: Any
    ) -> None:
        """A status write: `fields` set (None removes), `reason` appends a history entry."""
        shard = self.shards[name]
        status = shard.setdefault("status", {})
        before_owner = status.get("owner")
        for field, value in fields.items():
            if value is None:
                status.pop(field, None)
            else:
                status[field] = value
        if reason is not None:
            entry = {
                "phase": status["phase"],
                "at": stamp(seconds),
                "reason": reason,
                "attempt": status.get("attempt", 1),
                "owner": status.get("owner") if status["phase"] == "Running" else before_owner,
            }
            error = status.get("lastError")
            if error and reason in ("LeaseExpired", "Revoked", "Blocked", "AttemptFailed", "Failed"):
                entry["errorClass"] = error["class"]
            status.setdefault("history", []).append(entry)
        self._entry(writer, "patch", "shards/status", name, seconds, response=self._stored(shard))

    def materialize(self, name: str, index: int, seconds: float, planned: str | None = None) -> None:
        self.create_shard(name, index, seconds, planned=planned)
        self.status(name, OPERATOR, seconds + 0.05, "Materialized", phase="Pending", attempt=1)

    def claim(self, name: str, writer: Writer, seconds: float, attempt: int, token: int) -> None:
        self.status(
            name,
            writer,
            seconds,
            "Claimed",
            phase="Running",
            attempt=attempt,
            owner=identity(writer),
            fencingToken=token,
            leaseUntil=stamp(seconds + LEASE_SECONDS),
        )

    def done(self, name: str, writer: Writer, seconds: float, **overrides: Any) -> None:
        # The claim goes with the Done write (owner, token and leaseUntil cleared), as the worker writes it.
        fields: JSON = {
            "owner": None,
            "fencingToken": None,
            "leaseUntil": None,
            "phase": "Done",
            "result": {"ref": f"r-{name}", "fingerprint": FINGERPRINT, "bytes": 10},
        }
        fields.update(overrides)
        self.status(name, writer, seconds, "Completed", **fields)

    def delete_shard(self, name: str, writer: Writer, seconds: float) -> None:
        shard = self.shards.pop(name)
        self._entry(writer, "delete", "shards", name, seconds, response=self._stored(shard))

    # --- leases ---

    def lease(self, name: str, writer: Writer, seconds: float, verb: str = "patch", **spec: Any) -> None:
        """A Lease write that succeeded: create when absent; `spec` fields set (None clears)."""
        if name not in self.leases:
            verb = "create"
            self.leases[name] = {
                "metadata": {"name": name, "namespace": NS, "uid": self._uid("lease")},
                "spec": {"leaseDurationSeconds": LEASE_SECONDS, "leaseTransitions": 0},
            }
        lease = self.leases[name]
        for field, value in spec.items():
            if value is None:
                lease["spec"].pop(field, None)
            else:
                lease["spec"][field] = value
        self._entry(writer, verb, "leases", name, seconds, response=self._stored(lease))

    def acquire(self, name: str, writer: Writer, seconds: float, token: int) -> None:
        self.lease(
            name,
            writer,
            seconds,
            verb="update",
            holderIdentity=identity(writer),
            leaseTransitions=token,
            acquireTime=stamp(seconds),
            renewTime=stamp(seconds),
        )

    def renew(self, name: str, writer: Writer, seconds: float) -> None:
        self.lease(name, writer, seconds, renewTime=stamp(seconds))

    def clear(self, name: str, writer: Writer, seconds: float) -> None:
        self.lease(name, writer, seconds, holderIdentity=None, renewTime=None, acquireTime=None)

    def delete_lease(self, name: str, seconds: float) -> None:
        lease = self.leases.pop(name)
        status = {
            "kind": "Status",
            "status": "Success",
            "details": {"name": name, "uid": lease["metadata"]["uid"]},
        }
        self._entry(GC, "delete", "leases", name, seconds, response=status)

    def refused(
        self, writer: Writer, verb: str, resource: str, name: str, seconds: float, code: int = 409
    ) -> None:
        status = {"kind": "Status", "status": "Failure", "reason": "Conflict", "code": code}
        self._entry(writer, verb, resource, name, seconds, code=code, response=status)

    def history(self) -> History:
        return parse_lines(json.dumps(entry) for entry in self.entries)


def identity(writer: Writer) -> str:
    return writer.agent.rsplit("(", 1)[1].rstrip(")")


def lost_worker(holder: str) -> JSON:
    return {"class": "unknown", "message": f"worker lost: lease of {holder} expired", "at": stamp(0)}


def run(plant: str | None = None) -> Recording:
    """A campaign of three one-item shards, lease 10 s, maxAttempts 3:

    * s0: worker A claims and completes it; folded.
    * s1: A claims it and freezes after its renewal at 4.2 s; B takes the Lease over at 15 s (after
      14.2), reclaims (LeaseExpired, attempt 2), claims and completes; A's late renewal is refused.
      Folded.
    * s2: C claims it and makes no progress: the operator revokes it by its stall policy (the Lease
      cleared while live, the shard's history says Revoked), B claims attempt 2 and completes it.
      Not folded yet: it stays Done.
    * the operator's leader Lease: created, renewed, released by its holder at the end.

    `plant` changes one step so that one invariant is violated (see PLANTED)."""
    r = Recording()
    r.lease("shardops-operator", OPERATOR, 0, holderIdentity="operator-0", renewTime=stamp(0),
            acquireTime=stamp(0), leaseDurationSeconds=15)  # fmt: skip
    r.campaign_status(0.5, max_attempts=3)
    for index in range(3):
        # Cut in one batch from a snapshot of nothing pending or running: 1..3 <= 5 * max(0, 1).
        position = 6 if (plant == "over-backlog" and index == 1) else index + 1
        planned = f"pending=0,running=0,position={position}"
        r.materialize(f"s{index}", index, 1 + index * 0.2, planned=planned)
    for renewal in (5, 12, 19, 26):  # the operator leads throughout (leaseDurationSeconds 15)
        r.renew("shardops-operator", OPERATOR, renewal)

    # s0: claimed by A, done.
    r.acquire("s0", A, 2, token=1)
    r.claim("s0", A, 2.1, attempt=1, token=1)
    r.renew("s0", A, 4)
    r.status("s0", A, 4.1, progress={"done": 0, "total": 1})
    if plant == "no-fingerprint":
        r.done("s0", A, 5, result={"ref": "r-s0", "bytes": 10})
    else:
        r.done("s0", A, 5)

    # s1: A claims and freezes; B takes over after the lease ran out.
    r.acquire("s1", A, 2.2, token=1)
    r.claim("s1", A, 2.3, attempt=1, token=1)
    r.renew("s1", A, 4.2)
    r.status("s1", A, 4.3, progress={"done": 0, "total": 1})
    if plant == "early-reclaim":
        # The operator judges A a zombie at 6 s, while A's claim lasts until 14.2 s.
        r.status("s1", OPERATOR, 6, "LeaseExpired", phase="Pending", attempt=2, owner=None,
                 fencingToken=None, leaseUntil=None, lastError=lost_worker("worker-a"))  # fmt: skip
    r.acquire("s1", B, 15, token=2)
    if plant != "early-reclaim":
        r.status("s1", B, 15.1, "LeaseExpired", phase="Pending", attempt=2, owner=None,
                 fencingToken=None, leaseUntil=None, lastError=lost_worker("worker-a"))  # fmt: skip
    r.claim("s1", B, 15.2, attempt=2, token=1 if plant == "stale-token" else 2)
    r.refused(A, "patch", "leases", "s1", 16)
    if plant == "renewal-by-another":
        r.renew("s1", A, 16.5)
    r.renew("s1", B, 17)
    done_overrides: JSON = {
        "cost": 1.5,
        **{
            "decreasing-attempt": {"attempt": 1},
            "over-max-attempts": {"attempt": 4},
        }.get(plant or "", {}),
    }
    r.done("s1", A if plant == "done-by-another" else B, 18, **done_overrides)
    if plant == "live-claim-cleared":
        # The operator clears B's claim (live until 27 s) and its shard write loses.
        r.clear("s1", OPERATOR, 18.5)
        r.refused(OPERATOR, "patch", "shards/status", "s1", 18.6)
    if plant == "live-claim-taken":
        r.acquire("s1", C, 18.5, token=3)
    if plant == "token-decrease":
        r.lease("s1", B, 18.5, renewTime=stamp(18.5), leaseTransitions=1)

    # s2: C claims and stalls; the operator revokes it by its stall policy; B completes it.
    r.acquire("s2", C, 3, token=1)
    r.claim("s2", C, 3.1, attempt=1, token=1)
    r.renew("s2", C, 5)
    r.clear("s2", OPERATOR, 9)
    stalled = {"class": "timeout", "message": "no progress: heartbeating but no progress for 6s"}
    r.status("s2", OPERATOR, 9.1, "Revoked", phase="Pending", attempt=2, owner=None, fencingToken=None,
             leaseUntil=None, lastError=stalled)  # fmt: skip
    r.acquire("s2", B, 19, token=2)
    r.claim("s2", B, 19.1, attempt=2, token=2)
    r.done("s2", B, 20)
    if plant == "foreign-writer":
        r.status("s2", ADMIN, 20.5, phase="Done")

    # Folding s0 and s1: status first, delete last (their Leases go with them).
    r.campaign_status(21, done=((0, 2),))
    if plant == "delete-unfolded":
        r.delete_shard("s2", OPERATOR, 21.5)
    r.delete_shard("s0", OPERATOR, 22)
    r.delete_shard("s1", OPERATOR, 22.1)
    r.delete_lease("s0", 23)
    r.delete_lease("s1", 23.1)
    # Finished: every shard Done, what they spent (s1's 1.5) summed.
    spent = 4.0 if plant == "spend-mismatch" else 1.5
    r.campaign_status(23.5, done=((0, 2),), phase="Succeeded", counts={"done": 3}, spent=spent)
    if plant == "second-done":
        # s0 made again after it was folded, and run again.
        r.materialize("s0", 0, 24)
        r.acquire("s0", A, 25, token=1)
        r.claim("s0", A, 25.1, attempt=1, token=1)
        r.done("s0", A, 26)
        r.delete_shard("s0", OPERATOR, 27)
    if plant == "lost-shard":
        r.materialize("s3", 3, 24)
    if plant == "without-body":
        r.renew("shardops-operator", OPERATOR, 28)
        del r.entries[-1]["responseObject"]
    r.clear("shardops-operator", OPERATOR, 30)
    if plant == "write-after-leading":
        # A replica that stopped leading (it released the leader Lease) still writes.
        r.campaign_status(31, done=((0, 2),))
    if plant in ("stale-recreation", "stale-recreation-claimed"):
        # operator-1 leads; operator-0 had the create of s0 (folded at 21) in flight, and it lands.
        r.lease("shardops-operator", OPERATOR_B, 30.5, holderIdentity="operator-1", renewTime=stamp(30.5),
                acquireTime=stamp(30.5), leaseTransitions=2)  # fmt: skip
        r.create_shard("s0", 0, 31)
        if plant == "stale-recreation-claimed":
            r.acquire("s0", A, 31.2, token=1)
            r.claim("s0", A, 31.3, attempt=1, token=1)
        r.delete_shard("s0", OPERATOR_B, 32)
    return r


# plant -> (invariant, object) it must be reported as, and nothing else.
PLANTED = {
    "second-done": ("one-done", "shard ns/s0"),
    "live-claim-cleared": ("no-live-claim-taken", "lease ns/s1"),
    "live-claim-taken": ("one-holder-at-a-time", "lease ns/s1"),
    "renewal-by-another": ("one-holder-at-a-time", "lease ns/s1"),
    "lost-shard": ("no-shard-lost", "shard ns/s3"),
    "delete-unfolded": ("no-shard-lost", "shard ns/s2"),
    "decreasing-attempt": ("attempts-monotonic", "shard ns/s1"),
    "over-max-attempts": ("attempts-bounded", "shard ns/s1"),
    "stale-token": ("fencing", "shard ns/s1"),
    "done-by-another": ("fencing", "shard ns/s1"),
    "early-reclaim": ("attempt-charged-rightly", "shard ns/s1"),
    "no-fingerprint": ("done-has-result", "shard ns/s0"),
    "foreign-writer": ("shardops-writers", "shard ns/s2"),
    "token-decrease": ("lease-transitions-monotonic", "lease ns/s1"),
    "without-body": ("complete-record", "leases ns/shardops-operator"),
    "write-after-leading": ("operator-writes-while-leading", "campaigns/status ns/camp"),
    "over-backlog": ("backlog-bound", "shard ns/s1"),
    "spend-mismatch": ("counts-and-spend-match", "campaign ns/camp"),
}


def test_a_clean_run_passes_and_the_tally_says_what_was_checked() -> None:
    history = run().history()
    tally: Counter[str] = Counter()
    assert checker.check(history, IDENTITIES, tally) == []
    assert set(history.shards) == {(NS, "s0"), (NS, "s1"), (NS, "s2")}
    assert len(history.failed_writes) == 1
    assert tally["lease takeovers"] == 1  # A -> B on s1 (s2 was free when B took it)
    assert tally["stall revokes"] == 1
    assert tally["lease clears"] == 2  # the stall revoke and the leader's own release
    assert tally["Done writes"] == 3
    assert tally["lost-holder charges"] == 1
    assert tally["folded shards"] == 2
    assert tally["shard lives"] == 3
    assert tally["cuts audited"] == 3 and tally["most Pending + Running"] == 3
    assert tally["finished campaigns checked"] == 1


@pytest.mark.parametrize("plant", sorted(PLANTED))
def test_a_planted_violation_is_reported_exactly(plant: str) -> None:
    violations = checker.check(run(plant).history(), IDENTITIES)
    invariant, obj = PLANTED[plant]
    assert [(v.invariant, v.object) for v in violations] == [(invariant, obj)], "\n".join(
        map(str, violations)
    )


def test_every_invariant_has_a_planted_violation() -> None:
    names = {f.__name__.replace("_", "-") for f in checker.INVARIANTS}
    assert names == {invariant for invariant, _ in PLANTED.values()}


def test_a_violation_says_what_where_and_when() -> None:
    (violation,) = checker.check(run("live-claim-cleared").history(), IDENTITIES)
    assert isinstance(violation, Violation)
    # Who cleared whose claim, at which versions, and how early.
    assert "cleared the live claim of worker-b (token 2" in violation.detail
    assert "by operator-0" in violation.detail and "8.500s before it ran out" in violation.detail
    early = checker.check(run("early-reclaim").history(), IDENTITIES)[0]
    assert "LeaseExpired" in early.detail and "8.200s before it ran out" in early.detail


def test_a_stall_revoke_whose_shard_write_failed_is_a_live_claim_taken() -> None:
    """The defect of issue 13: the Lease cleared, the shard write that should record it refused."""
    r = run()
    (revoked,) = [
        e
        for e in r.entries
        if e["objectRef"]["name"] == "s2"
        and e["objectRef"].get("subresource") == "status"
        and e["responseObject"]["status"]["history"][-1]["reason"] == "Revoked"
    ]
    revoked["responseStatus"]["code"] = 409
    violations = checker.check(r.history(), IDENTITIES)
    assert ("no-live-claim-taken", "lease ns/s2") in [(v.invariant, v.object) for v in violations]


@pytest.mark.parametrize("taken_at", [10.0, 15.1])
def test_a_claim_is_live_for_a_lease_duration_after_the_server_stored_its_renewal_whatever_the_holders_clock(
    taken_at: float,
) -> None:
    """A's clock runs 30 s behind: every renewTime it writes is long past by the server's clock. Its
    claim still lasts until 10 s after the server stored its last renewal (5 s): a takeover at 10 s
    takes a live claim, one at 15.1 s does not."""
    r = Recording()
    r.lease("s0", A, 0, holderIdentity="worker-a", leaseTransitions=1, renewTime=stamp(-30))
    r.lease("s0", A, 5, renewTime=stamp(-25))
    r.acquire("s0", B, taken_at, token=2)
    found = [
        (v.invariant, v.object)
        for v in checker.check(r.history(), IDENTITIES)
        if v.invariant == "one-holder-at-a-time"
    ]
    assert found == ([("one-holder-at-a-time", "lease ns/s0")] if taken_at < 15 else [])


def test_a_late_create_of_a_folded_shard_that_nobody_worked_on_and_the_leader_removed_is_harmless() -> None:
    tally: Counter[str] = Counter()
    assert checker.check(run("stale-recreation").history(), IDENTITIES, tally) == []
    assert tally["late harmless operator creates"] == 1
    assert tally["stale re-creations removed"] == 1


def test_a_late_create_of_a_folded_shard_that_a_worker_claimed_is_a_violation() -> None:
    found = {
        (v.invariant, v.object) for v in checker.check(run("stale-recreation-claimed").history(), IDENTITIES)
    }
    assert ("operator-writes-while-leading", "shards ns/s0") in found
    assert ("no-shard-lost", "shard ns/s0") in found


@pytest.mark.parametrize("token_of_result", [1, 2])
def test_a_zombie_completed_with_its_lost_claims_own_result_is_fenced_rightly(token_of_result: int) -> None:
    """A's claim (token 1) stored its result, then ran out (the API was away); B took the expired
    Lease over (token 2) and completed the shard with A's object: fine. With an object of another
    token, the Done would not be the result of the claim the shard recorded: a fencing violation."""
    r = Recording()
    r.campaign_status(0.5, max_attempts=3)
    r.materialize("s0", 0, 1, planned="pending=0,running=0,position=1")
    r.acquire("s0", A, 2, token=1)
    r.claim("s0", A, 2.1, attempt=1, token=1)
    r.acquire("s0", B, 15, token=2)
    ref = f"attempts/k0/t{token_of_result}.json"
    r.done("s0", B, 15.2, result={"ref": ref, "fingerprint": FINGERPRINT, "bytes": 10})
    tally: Counter[str] = Counter()
    found = [(v.invariant, v.object) for v in checker.check(r.history(), IDENTITIES, tally)]
    if token_of_result == 1:
        assert found == [] and tally["zombies completed from their stored result"] == 1
    else:
        assert found == [("fencing", "shard ns/s0")]


def test_history_keeps_versions_in_server_order_and_ignores_reads_and_other_resources() -> None:
    r = run()
    shuffled = list(reversed(r.entries))
    shuffled.append({**r.entries[0], "verb": "get"})
    shuffled.append({**r.entries[0], "objectRef": {"resource": "configmaps", "namespace": NS, "name": "x"}})
    history = parse_lines(json.dumps(e) for e in shuffled)
    versions = [v.resource_version for v in history.shards[(NS, "s1")]]
    assert versions == sorted(versions)
    assert history.counts() == r.history().counts()
    phases = [v.phase for v in history.shards[(NS, "s1")]]
    assert phases[:2] == [None, "Pending"] and phases[-2] == "Done" and history.shards[(NS, "s1")][-1].deleted


def test_the_history_audit_policy_is_opt_in() -> None:
    plain, recording = audit_policy(), audit_policy(record_history=True)
    assert all(rule["level"] != "RequestResponse" for rule in plain["rules"])
    first = recording["rules"][0]
    assert first["level"] == "RequestResponse" and first["resources"] == HISTORY_RESOURCES
    assert first["namespaces"] == list(HISTORY_NAMESPACES), "bodies only for the history-checked tests"
    assert recording["rules"][1:] == plain["rules"]


def test_the_command_checks_a_recorded_log_and_skips_a_line_still_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.log"
    clean, planted = run(), run("lost-shard")
    log.write_text("".join(compact(e) + "\n" for e in clean.entries) + '{"stage":"Respo')
    assert checker.main([str(log), "--namespace", NS]) == 0
    assert "0 violation(s)" in capsys.readouterr().out
    log.write_text("".join(compact(e) + "\n" for e in planted.entries))
    assert checker.main([str(log), "--namespace", NS]) == 1
    assert "no-shard-lost: shard ns/s3: ends Pending" in capsys.readouterr().out
    # Nothing recorded there: not a pass.
    assert checker.main([str(log), "--namespace", "elsewhere"]) == 2


def compact(entry: JSON) -> str:
    """As the API server writes an audit entry: JSON without spaces."""
    return json.dumps(entry, separators=(",", ":"))


def _done_answered_504(r: Recording, name: str, based_on_the_last_version: bool) -> None:
    """The Done write of `name` as the audit log records it when its worker was killed right after
    sending it: answered 504 (the request's context ended with its client), no stored object."""
    writes = [
        e
        for e in r.entries
        if e["objectRef"]["name"] == name and e["objectRef"].get("subresource") == "status"
    ]
    done, before = writes[-1], writes[-2]
    assert done["responseObject"]["status"]["phase"] == "Done"
    rv = before["responseObject"]["metadata"]["resourceVersion"]
    done["requestObject"] = {
        "metadata": {"resourceVersion": rv if based_on_the_last_version else str(int(rv) - 1)},
        # A merge patch, as the worker sends it: the claim's fields cleared with nulls.
        "status": {
            **done["responseObject"]["status"],
            "owner": None,
            "fencingToken": None,
            "leaseUntil": None,
        },
    }
    done["responseStatus"] = {"code": 504, "reason": "Timeout"}
    done["responseObject"] = {"kind": "Status", "status": "Failure", "reason": "Timeout", "code": 504}


def test_a_done_write_answered_504_after_its_client_went_away_is_taken_as_applied() -> None:
    """The API server runs a write to its end when its client goes away mid-request, and answers 504
    to nobody: the audit log holds no stored object, yet the shard went Done (and was folded). Found
    by the killed-workers scenario."""
    r = run()
    _done_answered_504(r, "s0", based_on_the_last_version=True)
    history = r.history()
    tally: Counter[str] = Counter()
    assert checker.check(history, IDENTITIES, tally) == []
    (applied,) = history.applied_unanswered
    assert applied.name == "s0" and "applied after its client went away" in applied.describe()
    assert tally["Done writes"] == 3 and tally["folded shards"] == 2
    done = [v for v in history.shards[(NS, "s0")] if not v.deleted][-1]
    assert done.phase == "Done" and done.owner is None and done.result is not None


def test_a_504_write_made_at_an_older_version_is_not_taken_as_applied() -> None:
    r = run()
    _done_answered_504(r, "s0", based_on_the_last_version=False)
    history = r.history()
    assert history.applied_unanswered == []
    found = {(v.invariant, v.object) for v in checker.check(history, IDENTITIES)}
    assert ("no-shard-lost", "shard ns/s0") in found
