"""A shared Source end to end: three campaigns of `shardops llm` on one Source of 120 requests a minute,
started 20 s apart, one suspended midway, against the loopback test upstream. What is asserted comes
from the upstream's request log (which pod, hence which campaign, sent each request, and when)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.harness import wait_for
from testbed.upstream import Behaviour, LoggedRequest, llm_server

from e2e.test_llm_worker import API_KEY, SECRET, SOURCE, llm_campaign, most_in_a_window, pod_of, secret
from shardops.api.common import JSON
from shardops.k8s import events
from shardops.k8s.api import JOBS, SOURCES, ApiError, Kube

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


def source(name: str, base_url: str = "http://unused/v1", **spec: Any) -> JSON:
    """A Source body of the test model, keyed by the test Secret; `spec` adds to or overrides it."""
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Source",
        "metadata": {"name": name},
        "spec": {
            "baseUrl": base_url,
            "model": "test-model",
            "apiKeySecret": {"name": SECRET},
            "rateLimit": {"requestsPerMinute": RPM},
            **spec,
        },
    }


def create_source(kube: Kube, namespace: str, body: JSON) -> None:
    kube.request("POST", f"/apis/shardops.dev/v1alpha1/namespaces/{namespace}/sources", body=body)


def redistributed(kube: Kube, namespace: str) -> dict[str, float] | None:
    """The Source's shares by campaign once shared-b's is 0 and the others hold it (40 and 80)."""
    shares = shares_of(kube, namespace, "team-llm")
    wanted = {"shared-a": RPM / 3, "shared-c": 2 * RPM / 3}
    if shares.get("shared-b", 0.0) == 0 and all(
        abs(shares.get(n, 0.0) - v) < 1e-6 for n, v in wanted.items()
    ):
        return shares
    return None


def shares_of(kube: Kube, namespace: str, name: str) -> dict[str, float]:
    """The Source's requests/minute shares by campaign name, as its status lists them."""
    status = kube.get(SOURCES, namespace, name).get("status") or {}
    return {
        s["campaign"].split("/", 1)[1]: s.get("requestsPerMinute") or 0.0 for s in status.get("shares", [])
    }


def holding(kube: Kube, namespace: str, name: str, wanted: dict[str, float]) -> dict[str, float] | None:
    """The Source's shares once they are `wanted` (and no other campaign holds any)."""
    shares = {n: v for n, v in shares_of(kube, namespace, name).items() if v}
    if shares.keys() == wanted.keys() and all(abs(shares[n] - v) < 1e-6 for n, v in wanted.items()):
        return shares
    return None


def campaign_of(pod: str) -> str:
    """The campaign whose worker the pod is (its name is `<campaign>-worker-...`)."""
    campaign, _, _ = pod.partition("-worker-")
    return campaign


def sharing_campaign(name: str, base_url: str, on: str, weight: int, workers: int, words: str = "") -> JSON:
    """A campaign of more items than it can send in the run, on Source `on` with `weight`; each
    question is its name, its number and `words`."""
    return llm_campaign(
        name,
        [{"q": f"{name} {n} {words}".rstrip()} for n in range(ITEMS)],
        base_url,
        shardSize=4,
        maxConcurrency=workers,
        leaseSeconds=LEASE_SECONDS,
        sources=[{"name": SOURCE, "sourceRef": {"name": on}, "weight": weight}],
    )


def start_apart(bed: Bed, campaigns: list[JSON]) -> float:
    """Creates the campaigns START_GAP apart; returns when the first was created (monotonic)."""
    started = time.monotonic()
    for number, body in enumerate(campaigns):
        time.sleep(max(0.0, started + number * START_GAP - time.monotonic()))
        bed.create_campaign(body)
    return started


@pytest.mark.long
def test_three_campaigns_share_one_sources_limit(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        create_source(kube, bed.namespace, source("team-llm", server.base_url))
        started = start_apart(
            bed,
            [sharing_campaign(n, server.base_url, "team-llm", w, WORKERS) for n, w in WEIGHTS.items()],
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


# --- 10,000 tokens a minute (and completion tokens apart) -------------------------------------------

TOKEN_WEIGHTS = {"tokens-a": 1, "tokens-b": 1, "tokens-c": 2}
# Two workers each: the Source admits a campaign while maxConcurrency x 1,000 tokens/minute fit
# (logic/shares.py), and fewer workers keep the overshoot bound small.
TOKEN_WORKERS = 2


@dataclass(frozen=True)
class TokenLimit:
    """A Source's token limit under test, the words of each question that make a request's size, and
    the tokens of a logged request it counts."""

    field: str
    per_minute: int
    filler_words: int

    def counted(self, entry: LoggedRequest) -> int:
        if self.field == "outputTokensPerMinute":
            return entry.completion_tokens
        return entry.prompt_tokens + entry.completion_tokens


TOKEN_LIMITS = [
    # A prompt of 3 + 5 (the system message) + 42 tokens and an answer of 43 (testbed/upstream.py
    # counts words): 93 tokens a request, about 110 requests a minute in all.
    TokenLimit("tokensPerMinute", 10_000, 40),
    # An answer of 83 tokens: about 72 requests a minute; 6 x 1,000 per worker fit the limit.
    TokenLimit("outputTokensPerMinute", 6_000, 80),
]


@pytest.mark.long
@pytest.mark.parametrize("limit", TOKEN_LIMITS, ids=[t.field for t in TOKEN_LIMITS])
def test_three_campaigns_share_one_sources_tokens_per_minute(bed: Bed, limit: TokenLimit) -> None:
    """A worker learns a request's tokens from its answer, so it charges them after the fact, paying
    from its share less the largest request it has seen (llm/pacing.py): in any 60 s window a worker's
    requests but its last fit that, and the last fits the headroom, so the Source's window holds at
    most its limit while shares change too (logic/shares.py)."""
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    filler = " ".join(["word"] * limit.filler_words)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        create_source(
            kube,
            bed.namespace,
            source("team-tokens", server.base_url, rateLimit={limit.field: limit.per_minute}),
        )
        started = start_apart(
            bed,
            [
                sharing_campaign(n, server.base_url, "team-tokens", w, TOKEN_WORKERS, filler)
                for n, w in TOKEN_WEIGHTS.items()
            ],
        )
        time.sleep(max(0.0, started + ALL_RUN_FROM + MEASURE - time.monotonic()))
        log = server.requests()
        for name in TOKEN_WEIGHTS:
            bed.patch_spec(name, {"suspend": True})

    answered = [e for e in log if e.status == 200]
    tokens = [limit.counted(e) for e in answered]
    peak = most_in_a_window([e.monotonic for e in answered], 60.0, tokens)
    window = [e for e in answered if started + ALL_RUN_FROM <= e.monotonic < started + ALL_RUN_FROM + MEASURE]
    by_campaign: Counter[str] = Counter()
    for e in window:
        by_campaign[campaign_of(pod_of(e))] += limit.counted(e)
    total = sum(by_campaign.values())
    times = [e.monotonic for e in log]
    print(
        f"\nSource {limit.field} {limit.per_minute}, 3 campaigns x {TOKEN_WORKERS} workers, weights "
        f"{TOKEN_WEIGHTS}: {len(log)} requests, {sum(tokens)} such tokens (the upstream's usage) over "
        f"{max(times) - min(times):.0f} s; most in any 60 s window {peak} (limit "
        f"{limit.per_minute}); 429s {len(log) - len(answered)}; "
        f"while all ran ({MEASURE:.0f} s): {dict(by_campaign)}"
    )
    assert peak <= limit.per_minute, peak
    assert len(answered) == len(log)
    weight_total = sum(TOKEN_WEIGHTS.values())
    for name, weight in TOKEN_WEIGHTS.items():
        expected = weight / weight_total
        assert abs(by_campaign[name] / total - expected) <= 0.1 * expected + 0.02, (name, by_campaign)


# --- the operator killed mid-run ---------------------------------------------------------------------

# How long the three are run once restart-c holds its share after the restart.
AFTER_RESTART = 60.0


@pytest.mark.long
def test_a_sources_limit_holds_while_the_operator_is_killed_and_a_campaign_starts_meanwhile(bed: Bed) -> None:
    """restart-a and restart-b share 120 requests/minute; the operator is SIGKILLed and restart-c
    (weight 2) is created while it is down. The restarted operator starts from the shares written
    in the statuses: it lowers a and b and raises c only once the lowering is in force at the
    workers (logic/shares.py), so no 60 s window around the restart passes the limit."""
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator() as operator:
        create_source(kube, bed.namespace, source("team-restart", server.base_url))

        def on_source(name: str, weight: int) -> JSON:
            return sharing_campaign(name, server.base_url, "team-restart", weight, WORKERS)

        start_apart(bed, [on_source("restart-a", 1), on_source("restart-b", 1)])
        halves = {"restart-a": RPM / 2, "restart-b": RPM / 2}
        wait_for(
            "restart-a and restart-b to hold half each",
            lambda: holding(kube, bed.namespace, "team-restart", halves),
            timeout=120,
            interval=1,
        )
        (pod, pid), *_ = operator.running_pids().items()
        killed = time.monotonic()
        bed.kill_group(pid)
        bed.create_campaign(on_source("restart-c", 2))
        wait_for("the operator container to restart", lambda: operator.restarts() >= 1, timeout=60)
        wanted = {"restart-a": RPM / 4, "restart-b": RPM / 4, "restart-c": RPM / 2}
        wait_for(
            "restart-c to hold its share after the restart",
            lambda: holding(kube, bed.namespace, "team-restart", wanted),
            timeout=150,
            interval=1,
        )
        given = time.monotonic()
        time.sleep(AFTER_RESTART)
        log = server.requests()
        for name in ("restart-a", "restart-b", "restart-c"):
            bed.patch_spec(name, {"suspend": True})

    times = [e.monotonic for e in log]
    peak = most_in_a_window(times, 60.0)
    around = most_in_a_window([t for t in times if killed - 60 <= t < given + 60], 60.0)
    throttled = sum(1 for e in log if e.status == 429)
    after = Counter(campaign_of(pod_of(e)) for e in log if e.monotonic >= given)
    print(
        f"\nSource {RPM}/min, operator {pod} SIGKILLed {killed - min(times):.0f} s into the run, restart-c "
        f"created while it was down and given its share {given - killed:.0f} s after the kill: "
        f"{len(log)} requests over {max(times) - min(times):.0f} s; most in any 60 s window {peak} "
        f"(from 60 s before the kill to 60 s after restart-c's share: {around}; limit + 10 % = "
        f"{RPM * 1.1:.0f}); 429s {throttled}; in the {AFTER_RESTART:.0f} s after: {dict(after)}"
    )
    assert peak <= RPM * 1.1, peak
    assert throttled == 0
    assert after["restart-c"] > max(after["restart-a"], after["restart-b"]) > 0, after


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
        create_source(kube, bed.namespace, source("later", server.base_url))
        resolved = wait_for(
            "SourceUnresolved to clear",
            lambda: (c := source_unresolved(bed, "unresolved")) and c["status"] == "False" and c,
            timeout=60,
            interval=1,
        )
        assert resolved["reason"] == "SourcesResolved"
        bed.patch_spec("unresolved", {"suspend": True})


# --- a Source that answers 429 to everything ---------------------------------------------------------

FLOODED_CAMPAIGNS = ("flooded-a", "flooded-b", "flooded-c")
COOLDOWN = 20
# How long the breaker is watched once every campaign holds it open: three cooldowns and a half, so
# at least two probes are due.
OBSERVE_OPEN = 3.5 * COOLDOWN
# The fallback is the campaign's own source, paced so that the campaigns stay busy for the run.
FALLBACK_RPM = 30


@dataclass
class BreakerWatch:
    """The Source's status.breaker every half second, on a thread, while the test runs."""

    kube: Kube
    namespace: str
    name: str
    seen: list[tuple[float, JSON]] = field(default_factory=list)

    @contextlib.contextmanager
    def running(self) -> Iterator[BreakerWatch]:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(stop,), name="breaker-watch", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            with contextlib.suppress(ApiError, OSError):
                status = self.kube.get(SOURCES, self.namespace, self.name).get("status") or {}
                self.seen.append((time.monotonic(), status.get("breaker") or {}))

    def states(self) -> list[str]:
        """The states seen, each run of the same one once (HalfOpen is Open whose cooldown passed)."""
        states = [b.get("state", "Closed") for _, b in self.seen]
        return [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]


def breaker_of(campaign: JSON, source: str) -> JSON:
    return next(
        (b for b in (campaign.get("status") or {}).get("breakers") or [] if b["source"] == source), {}
    )


@pytest.mark.long
def test_a_source_answering_429_opens_one_breaker_moves_all_to_fallbacks_and_is_probed_once_per_cooldown(
    bed: Bed,
) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    watch = BreakerWatch(kube, bed.namespace, "flooded")
    limited = Behaviour(api_key=API_KEY, rate_limited_share=1.0, retry_after="1")
    with (
        llm_server(limited) as flooded,
        llm_server(Behaviour(api_key=API_KEY)) as steady,
        bed.operator(),
        watch.running(),
    ):
        create_source(
            kube,
            bed.namespace,
            source("flooded", flooded.base_url, breakerThreshold=3, cooldownSeconds=COOLDOWN),
        )
        for name in FLOODED_CAMPAIGNS:
            bed.create_campaign(
                llm_campaign(
                    name,
                    [{"q": f"{name} {n}"} for n in range(ITEMS)],
                    steady.base_url,
                    shardSize=2,
                    maxConcurrency=2,
                    maxAttempts=20,
                    leaseSeconds=LEASE_SECONDS,
                    defaultSource="flooded",
                    sources=[
                        {"name": "flooded", "sourceRef": {"name": "flooded"}, "fallback": SOURCE},
                        {"name": SOURCE, "rateLimit": {"requestsPerMinute": FALLBACK_RPM}},
                    ],
                )
            )
        wait_for(
            "every campaign to hold the Source's open breaker",
            lambda: all(
                breaker_of(bed.get_campaign(n), "flooded").get("state") in ("Open", "HalfOpen")
                for n in FLOODED_CAMPAIGNS
            ),
            timeout=120,
            interval=0.5,
        )
        # Shards claimed on the Source before its breaker was held still send their request (a
        # worker pod starting on a busy machine takes seconds): probes are counted once none runs.
        wait_for(
            "no shard running on the Source claimed before its breaker opened",
            lambda: (
                not [
                    s
                    for s in bed.shards()
                    if bed.phase_of(s) == "Running" and (s.get("status") or {}).get("source") == "flooded"
                ]
            ),
            timeout=60,
            interval=0.5,
        )
        all_holding = time.monotonic()
        wait_for(
            "every campaign's items at the fallback",
            lambda: (
                set(FLOODED_CAMPAIGNS)
                <= {campaign_of(pod_of(e)) for e in steady.requests() if e.status == 200}
            ),
            timeout=60,
            interval=1,
        )
        time.sleep(max(0.0, all_holding + OBSERVE_OPEN - time.monotonic()))
        flooded_log, steady_log = flooded.requests(), steady.requests()
        opened_events = {n: bed.campaign_events(n, "BreakerOpened") for n in FLOODED_CAMPAIGNS}
        for name in FLOODED_CAMPAIGNS:
            bed.patch_spec(name, {"suspend": True})

    states = watch.states()
    openings = sum(
        1 for before, after in itertools.pairwise(states) if before == "Closed" and after != "Closed"
    )
    before_holding = [e for e in flooded_log if e.monotonic <= all_holding]
    probes = [e for e in flooded_log if e.monotonic > all_holding]
    gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(probes)]
    at_fallback = Counter(campaign_of(pod_of(e)) for e in steady_log if e.status == 200)
    print(
        f"\nSource answering 429 to all, breakerThreshold 3, cooldown {COOLDOWN} s, "
        f"{len(FLOODED_CAMPAIGNS)} campaigns x 2 workers: Source breaker states seen {states} "
        f"({openings} opening); {len(before_holding)} requests (all 429) before every campaign held it "
        "and none ran on it; "
        f"then in {OBSERVE_OPEN:.0f} s: {len(probes)} probe(s) from "
        f"{sorted({campaign_of(pod_of(e)) for e in probes})}, gaps {[round(g, 1) for g in gaps]} s; "
        f"answered by the fallbacks: {dict(at_fallback)}; BreakerOpened Events per campaign: "
        f"{ {n: sum(events.occurrences(e) for e in found) for n, found in opened_events.items()} }"
    )
    assert {e.status for e in flooded_log} == {429}
    assert openings == 1 and states[-1] != "Closed", states
    assert set(at_fallback) == set(FLOODED_CAMPAIGNS), at_fallback
    # One probe per cooldown across the cluster (each campaign probing would make three).
    assert 1 <= len(probes) <= OBSERVE_OPEN // COOLDOWN + 1, [
        round(e.monotonic - all_holding) for e in probes
    ]
    assert all(gap >= 0.9 * COOLDOWN for gap in gaps), gaps
