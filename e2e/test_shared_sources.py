"""A shared Source end to end: three campaigns of `shardops llm` on one Source of 120 requests a minute,
started 20 s apart, one suspended midway, against the loopback test upstream. What is asserted comes
from the upstream's request log (which pod, hence which campaign, sent each request, and when)."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
from testbed.bed import Bed
from testbed.harness import wait_for
from testbed.upstream import Behaviour, llm_server

from e2e.test_llm_worker import API_KEY, SECRET, SOURCE, llm_campaign, most_in_a_window, pod_of, secret
from shardops.api.common import JSON
from shardops.k8s.api import JOBS, SOURCES, Kube

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

RPM = 120
WORKERS = 4
WEIGHTS = {"shared-a": 1, "shared-b": 1, "shared-c": 2}
START_GAP = 20.0
# leaseSeconds 30: a heartbeat every 10 s, so a lowered share is in force within 15 s (settle time).
LEASE_SECONDS = 30
# When all three hold their full shares (the last start, a settle time and a tick or two) and how
# long they are measured; then shared-b is suspended and the others run on.
ALL_RUN_FROM = 2 * START_GAP + 30.0
MEASURE = float(os.environ.get("SHARDOPS_E2E_SHARED_MEASURE_SECONDS", "60"))
# How long the two left are measured once they hold shared-b's share too.
AFTER_GIVEN = 30.0
# More items than any campaign can send in the run: none finishes, all stay active.
ITEMS = 400


def source(name: str) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Source",
        "metadata": {"name": name},
        "spec": {
            "baseUrl": "http://unused/v1",
            "model": "test-model",
            "rateLimit": {"requestsPerMinute": RPM},
        },
    }


def redistributed(kube: Kube, namespace: str) -> dict[str, float] | None:
    """The Source's shares by campaign once shared-b's is 0 and the others hold it (40 and 80)."""
    status = kube.get(SOURCES, namespace, "team-llm").get("status") or {}
    shares = {
        s["campaign"].split("/", 1)[1]: s.get("requestsPerMinute") or 0.0 for s in status.get("shares", [])
    }
    wanted = {"shared-a": RPM / 3, "shared-c": 2 * RPM / 3}
    if shares.get("shared-b", 0.0) == 0 and all(
        abs(shares.get(n, 0.0) - v) < 1e-6 for n, v in wanted.items()
    ):
        return shares
    return None


def campaign_of(pod: str) -> str:
    return next(name for name in WEIGHTS if pod.startswith(f"{name}-worker-"))


@pytest.mark.long
def test_three_campaigns_share_one_sources_limit(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        body = source("team-llm")
        body["spec"]["baseUrl"] = server.base_url
        body["spec"]["apiKeySecret"] = {"name": SECRET}
        kube.request("POST", f"/apis/shardops.dev/v1alpha1/namespaces/{bed.namespace}/sources", body=body)
        started = time.monotonic()
        for number, (name, weight) in enumerate(WEIGHTS.items()):
            if number:
                time.sleep(max(0.0, started + number * START_GAP - time.monotonic()))
            bed.create_campaign(
                llm_campaign(
                    name,
                    [{"q": f"{name} {n}"} for n in range(ITEMS)],
                    server.base_url,
                    shardSize=4,
                    maxConcurrency=WORKERS,
                    leaseSeconds=LEASE_SECONDS,
                    sources=[{"name": SOURCE, "sourceRef": {"name": "team-llm"}, "weight": weight}],
                )
            )
        time.sleep(max(0.0, started + ALL_RUN_FROM + MEASURE - time.monotonic()))
        stopped = time.monotonic()
        bed.patch_spec("shared-b", {"suspend": True})
        # Once its running shards end, shared-b is idle: its share is lowered to 0 at once, and the
        # others get it a settle time later.
        shares = wait_for(
            "shared-b's share to go to shared-a and shared-c",
            lambda: redistributed(kube, bed.namespace),
            timeout=150,
            interval=1,
        )
        given_at = time.monotonic()
        time.sleep(AFTER_GIVEN)
        log = server.requests()
        for name in WEIGHTS:
            bed.patch_spec(name, {"suspend": True})

    times = [e.monotonic for e in log]
    peak = most_in_a_window(times, 60.0)
    throttled = sum(1 for e in log if e.status == 429)
    window = [e for e in log if started + ALL_RUN_FROM <= e.monotonic < started + ALL_RUN_FROM + MEASURE]
    by_campaign = Counter(campaign_of(pod_of(e)) for e in window)
    total = sum(by_campaign.values())
    after = Counter(campaign_of(pod_of(e)) for e in log if e.monotonic >= given_at)
    print(
        f"\nSource {RPM}/min, 3 campaigns x {WORKERS} workers, weights {WEIGHTS}: {len(log)} requests over "
        f"{max(times) - min(times):.0f} s; most in any 60 s window {peak} (limit + 10 % = {RPM * 1.1:.0f}); "
        f"429s {throttled}; while all ran ({MEASURE:.0f} s): {dict(by_campaign)}; "
        f"shared-b suspended, its share given away {given_at - stopped:.0f} s later ({shares}); "
        f"in the {AFTER_GIVEN:.0f} s after: {dict(after)}"
    )
    assert peak <= RPM * 1.1, peak
    assert throttled == 0
    weight_total = sum(WEIGHTS.values())
    for name, weight in WEIGHTS.items():
        expected = weight / weight_total
        assert abs(by_campaign[name] / total - expected) <= 0.1 * expected + 0.02, (name, by_campaign)
    assert after["shared-b"] == 0, "a suspended campaign sends nothing once its share is given away"
    assert after["shared-c"] > after["shared-a"] > 0


def source_unresolved(bed: Bed, name: str) -> JSON | None:
    conditions = (bed.get_campaign(name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "SourceUnresolved"), None)


def test_a_campaign_naming_a_missing_source_says_so_until_it_exists(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        bed.create_campaign(
            llm_campaign(
                "unresolved",
                [{"q": f"q {n}"} for n in range(2)],
                server.base_url,
                sources=[{"name": SOURCE, "sourceRef": {"name": "later"}}],
            )
        )
        missing = wait_for(
            "SourceUnresolved to be True",
            lambda: (c := source_unresolved(bed, "unresolved")) and c["status"] == "True" and c,
            timeout=60,
            interval=1,
        )
        assert missing["reason"] == "SourceNotFound"
        assert missing["message"].startswith(
            f"spec.sources[0].sourceRef: no Source later in namespace {bed.namespace}"
        )
        [event] = bed.wait_campaign_events("unresolved", "SourceNotFound", 1)
        assert "spec.sources[0].sourceRef" in event["note"]
        assert kube.list(JOBS, bed.namespace) == [], "no worker before the Source exists"
        body = source("later")
        body["spec"]["baseUrl"] = server.base_url
        body["spec"]["apiKeySecret"] = {"name": SECRET}
        kube.request("POST", f"/apis/shardops.dev/v1alpha1/namespaces/{bed.namespace}/sources", body=body)
        resolved = wait_for(
            "SourceUnresolved to clear",
            lambda: (c := source_unresolved(bed, "unresolved")) and c["status"] == "False" and c,
            timeout=60,
            interval=1,
        )
        assert resolved["reason"] == "SourcesResolved"
        bed.patch_spec("unresolved", {"suspend": True})
