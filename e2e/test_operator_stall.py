"""Stalls (heartbeating but progress unchanged for more than 2 cycles = stuck -> record an
event, change strategy next round), with the operator running and the example agent hanging after
one item: its worker keeps renewing the Lease, its progress stays at 1.

* policy Report: the campaign's Stalled Event (one per campaign, counting the stuck attempts) and its
  Stalled condition within the stall window; the shard keeps running under the same owner and token
  (nothing is taken away);
* policy Revoke: the operator takes the Lease back (Revoked, counted in the campaign's Revoked Event;
  attempt+1), the hung worker is
  fenced (its command is killed, it writes nothing more), and attempt 2 completes the shard with the
  item the first attempt had stored.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from testbed.bed import Bed
from testbed.harness import Cluster
from testbed.kits.scheduler import Recorder

from shardops.k8s.api import LEASES, SHARDS, Kube, NotFound
from shardops.k8s.events import occurrences, series_name

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

HEARTBEAT = 1
STALL_BEATS = 2
WINDOW = HEARTBEAT * STALL_BEATS
# Detection is the window, plus one heartbeat (progress is reported at heartbeats), plus one
# operator tick (2 s) and API latency.
DETECT_BOUND = WINDOW + HEARTBEAT + 2 + 3
JSON = dict[str, Any]


def _stalling(name: str, policy: str, ledger: Path) -> JSON:
    return Bed.campaign_body(
        name,
        [{"n": i} for i in range(3)],
        shardSize=3,
        maxConcurrency=1,
        heartbeatSeconds=HEARTBEAT,
        stall={"policy": policy, "heartbeats": STALL_BEATS},
        worker_env={
            "SHARDOPS_AGENT_LATENCY": 0.2,
            # One item, then alive but silent; only on attempt 1, so a later attempt finishes.
            "SHARDOPS_AGENT_HANG_AFTER": 1,
            "SHARDOPS_AGENT_FAULT_ATTEMPTS": 1,
            "SHARDOPS_AGENT_LEDGER": ledger,
        },
    )


def _ledger(path: Path) -> list[JSON]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _stopped_at(path: Path, before: dt.datetime) -> dt.datetime | None:
    """When attempt 1 wrote its last result before `before` (the stall's detection): its progress
    stopped there. On a starved machine the command itself can pause past the stall window before
    its planned stop (a real stall, rightly reported) and write one more result after it."""
    done = [
        e
        for e in _ledger(path)
        if e["event"] == "done" and e["attempt"] == 1 and e["at"] <= before.timestamp()
    ]
    return dt.datetime.fromtimestamp(done[-1]["at"], dt.UTC) if done else None


def _shard(kube: Kube, namespace: str, name: str) -> JSON | None:
    try:
        return kube.get(SHARDS, namespace, name)
    except NotFound:
        return None


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _worker_pid(cluster: Cluster, namespace: str, campaign: str) -> tuple[str, int] | None:
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"shardops.dev/campaign={campaign}"
    )
    for pod in pods.items:
        for status in pod.status.container_statuses or []:
            if status.state and status.state.running and status.container_id:
                return pod.metadata.name, int(status.container_id.removeprefix("process://"))
    return None


def _versions(recorder: Recorder, name: str) -> list[JSON]:
    recorder.check()
    return [seen.obj for seen in recorder.events if seen.name == name and seen.type != "DELETED"]


def _last_reason(obj: JSON) -> str | None:
    entries = Bed.history(obj)
    return entries[-1]["reason"] if entries else None


def test_report_records_the_stall_and_leaves_the_shard_running(bed: Bed, tmp_path: Path) -> None:
    kube = bed.kube
    ledger = tmp_path / "ledger.jsonl"
    name, shard_name = "stall-report", "stall-report-00000"
    with (
        bed.operator(),
        bed.recording("shards") as recorded,
    ):
        bed.create_campaign(_stalling(name, "Report", ledger))
        (stalled,) = bed.wait_campaign_events(name, "Stalled", 1, timeout=120)
        detected = bed.parse_time(stalled["eventTime"])
        stopped = _stopped_at(ledger, before=detected)
        assert stopped is not None, _ledger(ledger)
        took = (detected - stopped).total_seconds()
        assert WINDOW <= took <= DETECT_BOUND, (took, stalled["note"])
        # The campaign's one Stalled Event, counting this attempt, its note naming the shard.
        assert stalled["metadata"]["name"] == series_name(name, "Stalled") and occurrences(stalled) == 1
        assert stalled["type"] == "Warning" and "stall policy Report" in stalled["note"]
        assert "no progress" in stalled["note"] and shard_name in stalled["note"], stalled["note"]

        def stalled_condition() -> JSON | None:
            found = bed.condition(bed.get_campaign(name), "Stalled")
            return found if found and found["status"] == "True" else None

        flagged = bed.wait_for("the campaign's Stalled condition", stalled_condition, timeout=30)
        assert shard_name in flagged["message"]

        # Let it heartbeat on for more than another stall window: Report takes nothing away.
        def beat_on() -> JSON | None:
            shard = _shard(kube, bed.namespace, shard_name) or {}
            beat = (shard.get("status") or {}).get("lastHeartbeat")
            later = beat and (bed.parse_time(beat) - detected).total_seconds() >= 2 * WINDOW + HEARTBEAT
            return shard if later else None

        running = bed.wait_for("heartbeats after the stall", beat_on, timeout=30)
        status = running["status"]
        lease = kube.get(LEASES, bed.namespace, shard_name)
        assert status["phase"] == "Running" and status["attempt"] == 1
        assert status["progress"]["done"] == 1
        assert lease["spec"]["holderIdentity"] == status["owner"]
        assert bed.reasons(running) == ["Materialized", "Claimed"]
        reported = bed.campaign_events(name, "Stalled")
        assert [occurrences(e) for e in reported] == [1], ("reported once per stall", reported)
        attempt_one = [v for v in _versions(recorded["shards"], shard_name) if _last_reason(v) == "Claimed"]
        owners = {(v["status"]["owner"], v["status"]["fencingToken"]) for v in attempt_one}
        assert owners == {(status["owner"], status["fencingToken"])}, owners
        heartbeats = len(attempt_one) - 1

        # End the hang the hard way: the worker dies, its lease runs out, attempt 2 has no hang.
        pod, pid = bed.wait_for("the worker process", lambda: _worker_pid(bed.cluster, bed.namespace, name))
        bed.kill_group(pid)
        final = bed.wait_phase(name, {"Succeeded", "Completed"}, timeout=120)

    shard = kube.get(SHARDS, bed.namespace, shard_name)
    assert final["status"]["phase"] == "Succeeded"
    assert bed.reasons(shard) == ["Materialized", "Claimed", "LeaseExpired", "Claimed", "Completed"]
    assert shard["status"]["attempt"] == 2
    cleared = bed.condition(final, "Stalled")
    assert cleared is not None and cleared["status"] == "False", cleared
    print(
        f"\nReport: progress stopped at 1/3; Stalled event {took:.1f}s later (window {WINDOW}s = "
        f"{STALL_BEATS} heartbeats of {HEARTBEAT}s); the shard stayed Running under {status['owner']} "
        f"(token {status['fencingToken']}) through {heartbeats} status write(s) of attempt 1; "
        f"worker {pod} killed to end the hang, attempt 2 finished the shard"
    )


def test_revoke_takes_the_lease_fences_the_hung_worker_and_attempt_two_finishes(
    bed: Bed, tmp_path: Path
) -> None:
    kube = bed.kube
    ledger = tmp_path / "ledger.jsonl"
    name, shard_name = "stall-revoke", "stall-revoke-00000"
    with (
        bed.operator(),
        bed.recording("shards") as recorded,
    ):
        bed.create_campaign(_stalling(name, "Revoke", ledger))
        final = bed.wait_phase(name, {"Succeeded", "Completed"}, timeout=120)
        versions = _versions(recorded["shards"], shard_name)

    shard = kube.get(SHARDS, bed.namespace, shard_name)
    entries = bed.history(shard)
    assert final["status"]["phase"] == "Succeeded"
    assert bed.reasons(shard) == ["Materialized", "Claimed", "Revoked", "Claimed", "Completed"], entries
    assert [e["attempt"] for e in entries if e["reason"] == "Claimed"] == [1, 2]
    assert shard["status"]["attempt"] == 2

    # Revoked for the stall, not for an expired lease: the worker was heartbeating right up to it.
    revoked = next(e for e in entries if e["reason"] == "Revoked")
    revoked_at = bed.parse_time(revoked["at"])
    # Counted in the campaign's one Revoked Event, which the history entry and lastError name; the
    # shard's lastError keeps why (the Event's note is written once, for a campaign's first).
    assert revoked["event"] == series_name(name, "Revoked") and revoked["errorClass"] == "timeout", revoked
    (event,) = bed.wait_campaign_events(name, "Revoked", 1)
    assert event["metadata"]["name"] == revoked["event"] and occurrences(event) == 1, event
    assert event["type"] == "Warning" and shard_name in event["note"], event["note"]
    error = shard["status"]["lastError"]
    assert error["event"] == revoked["event"] and error["class"] == "timeout", error
    assert error["message"].startswith("no progress"), error
    (stalled,) = bed.campaign_events(name, "Stalled")
    assert occurrences(stalled) == 1 and "no progress" in stalled["note"], stalled
    stopped = _stopped_at(ledger, before=revoked_at)
    assert stopped is not None
    took = (revoked_at - stopped).total_seconds()
    assert WINDOW <= took <= DETECT_BOUND, took
    before = [v for v in versions if _last_reason(v) == "Claimed" and v["status"]["attempt"] == 1]
    first = before[-1]["status"]
    last_beat = bed.parse_time(first["lastHeartbeat"])
    assert (revoked_at - last_beat).total_seconds() <= 2 * HEARTBEAT, (revoked_at, last_beat)
    assert (revoked_at - last_beat).total_seconds() < bed.LEASE_SECONDS

    # Fenced: after the revoke, nothing of attempt 1 is written. The next change of the shard's
    # status is attempt 2's claim, with a newer fencing token; no heartbeat, failure or release of
    # the old claim lands in between.
    at_revoke = next(i for i, v in enumerate(versions) if _last_reason(v) == "Revoked")
    after = [v for v in versions[at_revoke + 1 :] if v["status"] != versions[at_revoke]["status"]]
    assert after, "attempt 2 was recorded"
    assert _last_reason(after[0]) == "Claimed" and after[0]["status"]["attempt"] == 2
    assert all(v["status"]["attempt"] == 2 for v in after)
    tokens = [v["status"].get("fencingToken") for v in after if v["status"].get("fencingToken") is not None]
    assert tokens and min(tokens) > first["fencingToken"], (first["fencingToken"], tokens)

    # The hung command was killed, and attempt 1 computed nothing after its first item.
    lines = _ledger(ledger)
    hung = {e["pid"] for e in lines if e["attempt"] == 1}
    assert len(hung) == 1
    bed.wait_for("the hung command to be gone", lambda: not any(_alive(pid) for pid in hung), timeout=30)
    calls = Counter((e["index"], e["attempt"]) for e in lines if e["event"] == "done")
    assert calls == Counter({(0, 1): 1, (1, 2): 1, (2, 2): 1}), calls

    # One result: attempt 1's stored item plus attempt 2's two, under one key.
    committed = bed.committed_result(shard)
    assert shard["status"]["result"]["ref"] == committed.name
    result = json.loads(committed.text)
    assert [item["result"]["attempt"] for item in result["items"]] == [1, 2, 2]
    print(
        f"\nRevoke: progress stopped at 1/3; revoked {took:.1f}s later (window {WINDOW}s), "
        f"{(revoked_at - last_beat).total_seconds():.1f}s after the last heartbeat of attempt 1 "
        f"(lease {bed.LEASE_SECONDS}s never ran out); "
        f"fencing token {first['fencingToken']} -> {min(tokens)}; "
        f"hung command pid(s) {sorted(hung)} gone; item calls by (index, attempt): "
        f"{dict(sorted(calls.items()))}; result {committed.name}"
    )
