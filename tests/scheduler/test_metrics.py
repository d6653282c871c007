"""The operator's metrics: a deleted campaign leaves no series behind (gauges and counters alike), and
states are labels, not numbers to decode."""

from __future__ import annotations

import re

from shardops.api.common import TokenCounts
from shardops.api.enums import BreakerState, ShardPhase
from shardops.scheduler.metrics import Metrics


def _campaigns_in(metrics: Metrics) -> set[str]:
    return {
        sample.labels["campaign"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if "campaign" in sample.labels
    }


def _record_everything(metrics: Metrics, campaign: str) -> None:
    metrics.set_phases(campaign, {ShardPhase.DONE: 3})
    metrics.oldest_pending.labels(campaign=campaign).set(1.5)
    metrics.budget_ratio.labels(campaign=campaign).set(0.5)
    metrics.set_breaker(campaign, "A", BreakerState.OPEN)
    metrics.set_tokens(campaign, TokenCounts(input=5, output=2))
    for counter in (metrics.claims, metrics.lease_expirations, metrics.stalls, metrics.blocked):
        counter.labels(campaign=campaign).inc()
    metrics.retries.labels(campaign=campaign, error_class="timeout").inc()
    metrics.failed.labels(campaign=campaign, error_class="bad-output").inc()
    metrics.dispatch.labels(campaign=campaign, reason="None").inc()


def test_a_deleted_campaign_leaves_no_series_counters_included() -> None:
    metrics = Metrics()
    _record_everything(metrics, "ns/gone")
    _record_everything(metrics, "ns/kept")
    assert _campaigns_in(metrics) == {"ns/gone", "ns/kept"}
    metrics.forget_campaign("ns/gone")
    assert _campaigns_in(metrics) == {"ns/kept"}
    for family in metrics.registry.collect():
        assert all(sample.labels.get("campaign") != "ns/gone" for sample in family.samples), family.name
    # The kept campaign's counters are untouched, and a campaign recreated under the name starts over.
    assert metrics.registry.get_sample_value("shardops_claims_total", {"campaign": "ns/kept"}) == 1
    metrics.set_tokens("ns/gone", TokenCounts(input=1))
    assert (
        metrics.registry.get_sample_value("shardops_tokens_total", {"campaign": "ns/gone", "kind": "input"})
        == 1
    )


def test_the_breaker_state_is_a_label() -> None:
    metrics = Metrics()
    metrics.set_breaker("ns/c", "A", BreakerState.HALF_OPEN)
    metrics.set_breaker("ns/c", "A", BreakerState.CLOSED)

    def value(state: str) -> float | None:
        labels = {"campaign": "ns/c", "source": "A", "state": state}
        return metrics.registry.get_sample_value("shardops_breaker_state", labels)

    assert (value("Closed"), value("HalfOpen"), value("Open")) == (1, 0, 0)


def test_names_end_in_units_and_carry_no_numbers() -> None:
    """Prometheus naming: counters end in _total, times in _seconds; no digits in a name."""
    for family in Metrics().registry.collect():
        assert not re.search(r"\d", family.name), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if "duration" in family.name or "age" in family.name or "pending" in family.name:
            assert family.name.endswith("_seconds"), family.name
