"""Source and ClusterSource: what they accept, whom a ClusterSource serves, and a campaign's sourceRef."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from shardops.api import rules
from shardops.api.enums import SourceKind
from shardops.api.llm import ModelPrice, TokenPrice
from shardops.api.names import API_GROUP_VERSION
from shardops.api.shared_sources import ClusterSharedSource, SharedSource
from shardops.api.sources import Source

SPEC = {"baseUrl": "http://upstream:8000/v1", "model": "m"}


def cluster_source(**spec: Any) -> ClusterSharedSource:
    return ClusterSharedSource.parse(
        {
            "apiVersion": API_GROUP_VERSION,
            "kind": "ClusterSource",
            "metadata": {"name": "s"},
            "spec": {**SPEC, **spec},
        }
    )


def test_a_cluster_source_serves_only_the_namespaces_it_lists() -> None:
    assert not cluster_source().spec.serves("team-a"), "nobody until listed"
    listed = cluster_source(namespaces=["team-a"]).spec
    assert listed.serves("team-a")
    assert not listed.serves("team-b")
    assert cluster_source(namespaces=["*"]).spec.serves("team-b")


def test_a_source_has_the_breaker_defaults_of_a_campaigns_own_source() -> None:
    source = SharedSource.parse({"apiVersion": API_GROUP_VERSION, "kind": "Source", "spec": SPEC})
    own = Source(name="x")
    assert (source.spec.breaker_threshold, source.spec.cooldown_seconds) == (
        own.breaker_threshold,
        own.cooldown_seconds,
    )


def test_a_sources_price_is_exact_and_priced_like_a_campaigns() -> None:
    source = SharedSource.parse(
        {
            "apiVersion": API_GROUP_VERSION,
            "kind": "Source",
            "spec": {**SPEC, "price": {"inputPerMillion": "0.1", "outputPerMillion": 0.3}},
        }
    )
    assert isinstance(source.spec.price, TokenPrice)
    model_price = ModelPrice(model="m", input_per_million=Decimal("0.1"), output_per_million=Decimal("0.3"))
    assert source.spec.price.cost(10, 0, 10) == model_price.cost(10, 0, 10) == Decimal("0.000004")


def test_source_ref_defaults_to_a_namespaced_source_and_weight_to_one() -> None:
    source = Source.model_validate({"name": "openai", "sourceRef": {"name": "team-openai"}})
    assert source.source_ref is not None
    assert source.source_ref.kind is SourceKind.SOURCE
    assert source.weight == 1


def test_source_ref_and_an_own_rate_limit_are_refused_together() -> None:
    with pytest.raises(ValidationError, match=re.escape(rules.SOURCE_REF_OWNS_LIMITS.message)):
        Source.model_validate(
            {"name": "openai", "sourceRef": {"name": "team-openai"}, "rateLimit": {"requestsPerMinute": 5}}
        )
