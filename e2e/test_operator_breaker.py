"""Per-source circuit breakers: rate-limited sources stop being called; shards go to the fallback or
wait out the cooldown, then one probe decides."""

from __future__ import annotations

import datetime as dt

import pytest
from testbed.bed import Bed
from testbed.kits.scheduler import Seen

from shardops.k8s.api import EVENTS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

COOLDOWN = 15
THRESHOLD = 3


def _versions(events: list[Seen], source: str) -> list[tuple[dt.datetime, str, dt.datetime | None]]:
    """(arrival, state, openedAt) of `source`'s breaker in every campaign version the watch delivered."""
    found = []
    for seen in events:
        for breaker in (seen.obj.get("status") or {}).get("breakers") or []:
            if breaker["source"] == source:
                opened = Bed.parse_time(breaker["openedAt"]) if breaker.get("openedAt") else None
                found.append((seen.wall, breaker["state"], opened))
    return found


def _first_open(versions: list[tuple[dt.datetime, str, dt.datetime | None]]) -> dt.datetime | None:
    return next((arrival for arrival, state, _ in versions if state == "Open"), None)


def _claims(shards: list[dict]) -> list[tuple[dt.datetime, str, str | None]]:
    found = []
    for shard in shards:
        for entry in Bed.history(shard):
            if entry["reason"] == "Claimed":
                found.append((Bed.parse_time(entry["at"]), shard["spec"].get("source"), entry.get("source")))
    return sorted(found, key=lambda claim: claim[0])


def test_rate_limited_sources_open_their_breakers_fallback_and_cooldown(bed: Bed) -> None:
    kube = bed.kube
    items = [{"q": f"a{i}", "source": "A"} for i in range(6)]
    # Source C is one shard that answers 429 on its first THRESHOLD attempts: its breaker opens, and
    # after the cooldown the single probe (attempt THRESHOLD+1) succeeds and closes it again. One
    # shard, because a success resets the streak: with several C shards failing once each, a retry's
    # success can land between two first attempts and the breaker never opens (timing, not a bug).
    faulty = list(range(1, THRESHOLD + 1))
    items += [{"q": "c0", "source": "C", "fault": "rate-limited", "faultAttempts": faulty}]
    body = bed.campaign_body(
        "routed",
        items,
        shardSize=1,
        maxConcurrency=3,
        maxAttempts=8,
        backoff={"baseSeconds": 1, "capSeconds": 2},
        sources=[
            {"name": "A", "fallback": "B", "breakerThreshold": THRESHOLD, "cooldownSeconds": COOLDOWN},
            {"name": "B", "breakerThreshold": THRESHOLD, "cooldownSeconds": COOLDOWN},
            {"name": "C", "breakerThreshold": THRESHOLD, "cooldownSeconds": COOLDOWN},
        ],
        worker_env={"SHARDOPS_AGENT_RATE_LIMITED_SOURCES": "A", "SHARDOPS_AGENT_LATENCY": 0.3},
    )
    with (
        bed.operator(),
        bed.recording("campaigns") as recorded,
    ):
        bed.create_campaign(body)
        final = bed.wait_phase("routed", {"Succeeded", "Completed"}, timeout=180)
        recorded["campaigns"].check()
        events = recorded["campaigns"].events
        a_versions, c_versions = _versions(events, "A"), _versions(events, "C")
        a_open, c_open = _first_open(a_versions), _first_open(c_versions)

    shards = bed.shards()
    claims = _claims(shards)
    assert final["status"]["phase"] == "Succeeded", final["status"]
    assert a_open is not None and c_open is not None, [
        b for s in events for b in s.obj.get("status", {}).get("breakers", [])
    ]
    breakers = {b["source"]: b for b in final["status"]["breakers"]}

    # A: opened after THRESHOLD consecutive 429s; its shards then went to fallback B and finished there.
    a_failures = [
        e for s in shards for e in bed.history(s) if e["reason"] == "AttemptFailed" and e.get("source") == "A"
    ]
    assert len(a_failures) >= THRESHOLD
    late_a = [c for c in claims if c[2] == "A" and c[0] > a_open + bed.STALE_READ_GRACE]
    assert late_a == [], late_a
    a_shards = [s for s in shards if s["spec"].get("source") == "A"]
    assert all(s["status"]["phase"] == "Done" and s["status"]["source"] == "B" for s in a_shards)
    # A never answered again, so its breaker never closed (HalfOpen once its cooldown ran out).
    assert breakers["A"]["state"] in ("Open", "HalfOpen") and breakers["A"]["openedAt"]

    # C: no fallback, so its shard waited: the first C claim after the breaker opened (as published)
    # comes no earlier than the newest openedAt published before it plus the cooldown; that probe
    # succeeded and closed the breaker.
    c_claims = [c for c in claims if c[1] == "C"]
    after = [c for c in c_claims if c[0] > c_open + bed.STALE_READ_GRACE]
    assert after, c_claims
    probe = after[0][0]
    opened_at = max(
        o for arrival, state, o in c_versions if state == "Open" and o is not None and arrival <= probe
    )
    assert probe >= opened_at + dt.timedelta(seconds=COOLDOWN) - dt.timedelta(milliseconds=500), (
        probe,
        opened_at,
    )
    assert breakers["C"]["state"] == "Closed", breakers["C"]
    assert all(s["status"]["phase"] == "Done" for s in shards if s["spec"].get("source") == "C")

    opened = [
        e["note"]
        for e in kube.list(EVENTS, bed.namespace)
        if e["reason"] == "BreakerOpened" and e["regarding"]["name"] == "routed"
    ]
    assert any("source A" in note and "fallback B" in note for note in opened), opened
    assert any("source C" in note for note in opened), opened
    opens = {"A": a_open, "C": c_open}
    grace_claims = [
        c for c in claims if c[2] in opens and opens[c[2]] < c[0] <= opens[c[2]] + bed.STALE_READ_GRACE
    ]
    print(
        f"\nbreaker A open (published) at {a_open:%H:%M:%S.%f}, {len(a_failures)} rate-limited failures "
        f"on A, A shards finished on B: {len(a_shards)}; breaker C opened at {opened_at:%H:%M:%S.%f}, "
        f"probe claimed {(probe - opened_at).total_seconds():.1f}s later (cooldown {COOLDOWN}s); claims on "
        f"an open source inside the {bed.STALE_READ_GRACE.total_seconds():.0f}s stale-read grace: "
        f"{len(grace_claims)}"
    )
