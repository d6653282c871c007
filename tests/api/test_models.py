"""The API models: samples and examples parse, defaults match the documented ones, invalid input fails with
the message the e2e suite also expects from the API server."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from shardops.api import (
    HISTORY_LIMIT,
    Budget,
    Campaign,
    CampaignSpec,
    CampaignStatus,
    Condition,
    HistoryEntry,
    ItemsFrom,
    Shard,
    ShardClass,
    ShardError,
    ShardPhase,
    ShardSpec,
    ShardStatus,
    StallPolicy,
    rules,
)
from shardops.api.common import ResourceModel
from shardops.api.enums import Workload
from shardops.api.names import API_GROUP_VERSION
from shardops.api.shared_sources import ClusterSharedSource, SharedSource
from shardops.api.worker import IO_BOUND_DEFAULT_SLOTS, MAX_WORKER_SLOTS

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Refused by the API server (tests/data/invalid) or, where its schema cannot say it, by the model.
INVALID = sorted(
    [
        *(ROOT / "tests" / "data" / "invalid").glob("*.yaml"),
        *(ROOT / "tests" / "data" / "invalid-by-operator").glob("*.yaml"),
    ]
)
MODELS: dict[str, type[ResourceModel]] = {
    "Campaign": Campaign,
    "Shard": Shard,
    "Source": SharedSource,
    "ClusterSource": ClusterSharedSource,
}

WORKER = {"image": "shardops:dev", "command": ["agent"]}


def shardops_documents(paths: list[Path]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in paths:
        for number, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc and doc.get("kind") in MODELS:
                yield f"{path.name}#{number}", doc


def parse(doc: Mapping[str, Any]) -> ResourceModel:
    return MODELS[doc["kind"]].parse(doc)


def expectations(path: Path) -> list[str]:
    return [
        line.removeprefix("# expect:").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]


def spec(**fields: Any) -> CampaignSpec:
    return CampaignSpec.model_validate({"items": [{"n": 1}], "worker": WORKER, **fields})


VALID = list(shardops_documents(SAMPLES + EXAMPLES))


def test_there_is_something_to_test() -> None:
    kinds = {doc["kind"] for _, doc in VALID}
    assert kinds == set(MODELS)
    assert len(EXAMPLES) >= 5
    assert len(INVALID) >= 5


@pytest.mark.parametrize(("where", "doc"), VALID, ids=[where for where, _ in VALID])
def test_samples_and_examples_parse(where: str, doc: dict[str, Any]) -> None:
    parse(doc)


@pytest.mark.parametrize(("where", "doc"), VALID, ids=[where for where, _ in VALID])
def test_to_dict_round_trips(where: str, doc: dict[str, Any]) -> None:
    model = parse(doc)
    again = parse(model.to_dict())
    assert again == model
    assert again.to_dict() == model.to_dict()


def test_to_dict_is_what_the_api_server_stores() -> None:
    campaign = Campaign.parse(
        {
            "apiVersion": API_GROUP_VERSION,
            "kind": "Campaign",
            "metadata": {"name": "c"},
            "spec": spec().to_dict(),
        }
    )
    body = campaign.to_dict()
    assert body["spec"]["maxConcurrency"] == 6  # camelCase keys
    assert "heartbeatSeconds" not in body["spec"]  # unset optional fields are absent, not null
    assert "status" not in body
    assert "max_concurrency" not in str(body)


@pytest.mark.parametrize("path", INVALID, ids=[p.name for p in INVALID])
def test_invalid_samples_are_rejected_with_their_expected_message(path: Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} needs a '# expect: <substring>' line"
    doc = yaml.safe_load(path.read_text())
    with pytest.raises(ValidationError) as caught:
        parse(doc)
    for substring in expected:
        assert substring in str(caught.value), f"{path.name}: {substring!r} not in:\n{caught.value}"


def test_defaults_follow_the_design_table() -> None:
    s = spec()
    assert s.shard_size == 10
    assert s.max_concurrency == 6
    assert s.backlog_ratio == 5
    assert s.lease_seconds == 120
    assert s.heartbeat_seconds is None
    assert s.effective_heartbeat_seconds == 40
    assert s.max_attempts == 3
    assert (s.backoff.base_seconds, s.backoff.cap_seconds) == (2, 120)
    assert (s.stall.policy, s.stall.heartbeats) == (StallPolicy.REPORT, 2)
    assert s.budget is None
    assert s.sources is None and s.source_names == []
    assert s.default_source is None
    assert s.suspend is False
    assert s.priority == 0
    assert s.retry.generation == 0
    assert s.idle_seconds == 30
    assert s.finalize is None
    assert Budget(limit=1).warn_ratio == 0.8
    source = spec(sources=[{"name": "a"}]).source("a")
    assert source is not None
    assert (source.breaker_threshold, source.cooldown_seconds, source.fallback) == (3, 300, None)


def test_effective_heartbeat_prefers_the_explicit_value() -> None:
    assert spec(heartbeatSeconds=10).effective_heartbeat_seconds == 10
    assert spec(leaseSeconds=30).effective_heartbeat_seconds == 10


def test_heartbeat_must_stay_under_half_the_lease() -> None:
    spec(leaseSeconds=61, heartbeatSeconds=30)
    with pytest.raises(ValidationError, match=re.escape("less than half of spec.leaseSeconds")):
        spec(leaseSeconds=60, heartbeatSeconds=30)


def test_every_violated_rule_is_reported_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        CampaignSpec.model_validate(
            {
                "worker": WORKER,
                "leaseSeconds": 20,
                "heartbeatSeconds": 10,
                "sources": [{"name": "a", "fallback": "b"}, {"name": "a"}],
                "defaultSource": "c",
            }
        )
    text = str(caught.value)
    for rule in (
        rules.ITEMS_XOR_ITEMS_FROM,
        rules.HEARTBEAT_UNDER_HALF_LEASE,
        rules.SOURCE_NAMES_UNIQUE,
        rules.FALLBACK_DECLARED,
        rules.DEFAULT_SOURCE_DECLARED,
    ):
        assert rule.message in text
    assert "a -> b" in text  # the offending pair, not only the rule


def test_fields_accept_python_names_and_yaml_names() -> None:
    by_alias = CampaignSpec.model_validate({"items": [{}], "worker": WORKER, "maxConcurrency": 2})
    by_name = CampaignSpec.model_validate({"items": [{}], "worker": WORKER, "max_concurrency": 2})
    assert by_alias == by_name
    error = ShardError.model_validate({"class": "timeout", "message": "slow"})
    assert error.error_class.retryable
    assert error.to_dict()["class"] == "timeout"


def test_unknown_fields_fail_in_specs_and_are_ignored_in_statuses() -> None:
    with pytest.raises(ValidationError, match="maxConcurency"):
        spec(maxConcurency=3)
    status = ShardStatus.model_validate({"phase": "Running", "fieldFromANewerOperator": 1})
    assert status.phase is ShardPhase.RUNNING


def test_an_empty_status_parses() -> None:
    campaign = CampaignStatus.model_validate({})
    assert campaign.counts.total == 0
    assert campaign.phase is None
    assert campaign.progress_text == "0/0"
    shard = ShardStatus.model_validate({})
    assert (shard.phase, shard.attempt, shard.history, shard.progress_text) == (None, 0, [], None)


def test_progress_text_feeds_the_printer_columns() -> None:
    status = CampaignStatus.model_validate({"counts": {"done": 3, "total": 4}, "shardsTotal": 8})
    assert status.progress_text == "3/8"
    assert status.to_dict()["progressText"] == "3/8"
    shard = ShardStatus.model_validate({"progress": {"done": 1, "total": 5}})
    assert shard.to_dict()["progressText"] == "1/5"


def test_kopf_style_mapping_bodies_parse() -> None:
    class View(Mapping[str, Any]):
        """Stands in for kopf.Body: a read-only Mapping, not a dict."""

        def __init__(self, data: dict[str, Any]) -> None:
            self._data = data

        def __getitem__(self, key: str) -> Any:
            value = self._data[key]
            return View(value) if isinstance(value, dict) else value

        def __iter__(self) -> Iterator[str]:
            return iter(self._data)

        def __len__(self) -> int:
            return len(self._data)

    body = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Shard",
        "metadata": {"name": "c-00000", "namespace": "ns", "generation": 3, "managedFields": []},
        "spec": {"campaign": "c", "index": 0, "itemRange": {"start": 0, "end": 10}, "idempotencyKey": "k"},
    }
    shard = Shard.parse(View(body))
    assert (shard.name, shard.namespace, shard.generation) == ("c-00000", "ns", 3)
    assert shard.lease_name == "c-00000"
    assert shard.campaign_name == "c"
    assert shard.spec.item_count == 10
    assert shard.phase is None
    assert shard.to_dict()["metadata"]["managedFields"] == []  # metadata we do not model survives


def test_resource_kind_and_version_are_checked() -> None:
    body = {"apiVersion": "shardops.dev/v2", "kind": "Campaign", "spec": spec().to_dict()}
    with pytest.raises(ValidationError, match=re.escape("apiVersion must be shardops.dev/v1alpha1")):
        Campaign.parse(body)
    with pytest.raises(ValidationError, match="kind must be Campaign"):
        Campaign.parse({**body, "apiVersion": API_GROUP_VERSION, "kind": "Shard"})


def test_quantities_accept_integers_and_reject_nonsense() -> None:
    worker = {**WORKER, "resources": {"requests": {"cpu": 1, "memory": "256Mi"}, "limits": {"cpu": "500m"}}}
    parsed = spec(worker=worker).worker.resources
    assert parsed.requests == {"cpu": "1", "memory": "256Mi"}
    for bad in ("lots", True, 0.5):
        with pytest.raises(ValidationError):
            spec(worker={**WORKER, "resources": {"limits": {"cpu": bad}}})


def test_worker_helpers() -> None:
    worker = spec(
        worker={**WORKER, "args": ["-v"], "env": [{"name": "A", "value": "1"}, {"name": "A"}]}
    ).worker
    assert worker.full_command() == ["agent", "-v"]
    assert worker.env_dict() == {"A": ""}


def test_worker_env_holds_literal_values_only() -> None:
    """The idempotency key takes env as written: a value read from a Secret or ConfigMap at run
    time (valueFrom) would change results unseen, and is refused."""
    from_secret = {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    with pytest.raises(ValidationError, match="valueFrom"):
        spec(worker={**WORKER, "env": [from_secret]})


def test_results_version_is_optional_text_never_empty() -> None:
    assert spec().worker.results_version is None
    assert spec(worker={**WORKER, "resultsVersion": "rerun 2"}).worker.results_version == "rerun 2"
    with pytest.raises(ValidationError, match="resultsVersion"):
        spec(worker={**WORKER, "resultsVersion": ""})


def test_persistent_is_spec_worker_s_alone_and_unset_by_default() -> None:
    """Unset by default (no CRD default written into every Campaign, which workers of earlier
    releases could not read); the finalize step runs once, so it has no such field."""
    assert spec().worker.persistent is None
    assert spec(worker={**WORKER, "persistent": True}).worker.persistent is True
    assert "persistent" not in spec().to_dict()["worker"]
    with pytest.raises(ValidationError, match=r"finalize\.persistent"):
        spec(finalize={**WORKER, "persistent": True})


def test_slots_are_spec_worker_s_alone_unset_by_default_and_bounded() -> None:
    """Unset by default, as persistent is; one slot per pod then. The finalize step runs once."""
    assert spec().worker.slots is None and spec().worker.slots_per_pod() == 1
    assert "slots" not in spec().to_dict()["worker"]
    assert spec(worker={**WORKER, "slots": 8}).worker.slots_per_pod() == 8
    assert spec(worker={**WORKER, "slots": MAX_WORKER_SLOTS}).worker.slots == MAX_WORKER_SLOTS
    for wrong in (0, -1, MAX_WORKER_SLOTS + 1):
        with pytest.raises(ValidationError, match=r"worker\.slots"):
            spec(worker={**WORKER, "slots": wrong})
    with pytest.raises(ValidationError, match=r"finalize\.slots"):
        spec(finalize={**WORKER, "slots": 2})


def test_the_built_in_llm_worker_defaults_to_slots_and_a_persistent_process() -> None:
    """Unset, what the work is decides: the built-in LLM worker's shards wait on HTTP (8 slots a pod,
    unless resources were sized, which the docs size per command) and its command speaks the
    persistent protocol; any other command keeps one slot and a process per shard. Set, the field wins."""
    llm = {"baseUrl": "http://llm/v1", "model": "m", "messages": [{"role": "user", "content": "{{ item }}"}]}
    built_in = {**WORKER, "command": ["shardops", "llm"], "llm": llm}
    worker = spec(worker=built_in).worker
    assert (worker.slots_per_pod(), worker.runs_persistent()) == (IO_BOUND_DEFAULT_SLOTS, True)
    assert "slots" not in spec(worker=built_in).to_dict()["worker"]  # a default, not written
    sized = spec(worker={**built_in, "resources": {"limits": {"memory": "256Mi"}}}).worker
    assert sized.slots_per_pod() == 1 and sized.runs_persistent()
    chosen = spec(worker={**built_in, "slots": 2, "persistent": False}).worker
    assert (chosen.slots_per_pod(), chosen.runs_persistent()) == (2, False)
    wrapped = spec(worker={**built_in, "args": ["--verbose"]}).worker  # not the built-in command as is
    assert not wrapped.runs_persistent()
    own = spec().worker
    assert (own.slots_per_pod(), own.runs_persistent()) == (1, False)
    assert own.work_kind() is Workload.CPU_BOUND and worker.work_kind() is Workload.IO_BOUND


def test_a_declared_workload_decides_the_default_slots() -> None:
    """workload: IOBound gives any command the I/O-bound slots (resources unset); CPUBound keeps an
    LLM worker at one slot a pod; slots set win over both. Finalize has no such field."""
    waits = spec(worker={**WORKER, "workload": "IOBound"}).worker
    assert waits.slots_per_pod() == IO_BOUND_DEFAULT_SLOTS and not waits.runs_persistent()
    assert spec(worker={**WORKER, "workload": "IOBound", "slots": 3}).worker.slots_per_pod() == 3
    assert spec(worker={**WORKER, "workload": "CPUBound"}).worker.slots_per_pod() == 1
    assert "workload" not in spec().to_dict()["worker"]
    with pytest.raises(ValidationError, match=r"worker\.workload"):
        spec(worker={**WORKER, "workload": "Quick"})
    with pytest.raises(ValidationError, match=r"finalize\.workload"):
        spec(finalize={**WORKER, "workload": "IOBound"})


def test_expected_shards_and_inline_counts() -> None:
    s = spec(items=[{"n": n} for n in range(25)])
    assert s.inline_items_total == 25
    assert s.expected_shards(25) == 3
    assert spec(items=None, itemsFrom={"configMapName": "in", "key": "x.jsonl"}).inline_items_total is None


def test_parse_items_counted_keeps_everything_but_the_items() -> None:
    body = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {"name": "c", "uid": "u"},
        "spec": {"items": [{"n": n} for n in range(25)], "shardSize": 10, "worker": WORKER},
        "status": {"phase": "Running", "itemsTotal": 25},
    }
    full, lean = Campaign.parse(body), Campaign.parse_items_counted(body)
    assert lean.spec.items == [] and lean.spec.items_left_out and not full.spec.items_left_out
    assert lean.spec.inline_items_total == full.spec.inline_items_total == 25
    assert lean.spec.model_dump(exclude={"items"}) == full.spec.model_dump(exclude={"items"})
    assert lean.status == full.status and lean.metadata == full.metadata
    assert len(body["spec"]["items"]) == 25, "the body it was handed is left as it was"
    from_file = {**body, "spec": {"itemsFrom": {"configMapName": "in", "key": "x.jsonl"}, "worker": WORKER}}
    assert Campaign.parse_items_counted(from_file) == Campaign.parse(from_file)
    with pytest.raises(ValidationError, match="maxConcurrency"):
        Campaign.parse_items_counted({**body, "spec": {**body["spec"], "maxConcurrency": 0}})


def test_shard_parse_items_counted_plans_without_the_items_and_with_items_gives_them_back() -> None:
    items = [{"n": n} for n in range(25)]
    body = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Shard",
        "metadata": {"name": "c-00000", "uid": "u", "resourceVersion": "7"},
        "spec": {"campaign": "c", "index": 0, "idempotencyKey": "sha256:k", "items": items},
        "status": {"phase": "Pending", "attempt": 2},
    }
    full, lean = Shard.parse(body), Shard.parse_items_counted(body)
    assert lean.spec.items == [] and lean.spec.items_left_out and not full.spec.items_left_out
    assert lean.spec.item_count == full.spec.item_count == 25
    assert lean.spec.model_dump(exclude={"items"}) == full.spec.model_dump(exclude={"items"})
    assert lean.status == full.status and lean.metadata == full.metadata
    claimed = lean.with_items()
    assert claimed == full and claimed.spec.items == items and not claimed.spec.items_left_out
    assert full.with_items() is full
    assert len(body["spec"]["items"]) == 25, "the body it was handed is left as it was"
    by_range = {**body, "spec": {**body["spec"], "itemRange": {"start": 0, "end": 5}}}
    del by_range["spec"]["items"]
    assert Shard.parse_items_counted(by_range) == Shard.parse(by_range)


def test_items_are_json_objects() -> None:
    with pytest.raises(ValidationError, match=re.escape("spec.items.0")):
        Campaign.parse(
            {"apiVersion": API_GROUP_VERSION, "kind": "Campaign", "spec": {"items": ["a"], "worker": WORKER}}
        )


def test_items_from_parses_jsonl_and_names_the_bad_line() -> None:
    source = ItemsFrom(config_map_name="input", key="items.jsonl")
    assert source.parse_items('{"a": 1}\n\n  \n{"b": [2]}\n') == [{"a": 1}, {"b": [2]}]
    with pytest.raises(ValueError, match=re.escape("ConfigMap input key items.jsonl line 2: not valid JSON")):
        source.parse_items('{"a": 1}\n{oops\n')
    with pytest.raises(ValueError, match="line 1: an item must be a JSON object, got str"):
        source.parse_items('"just a string"\n')


def test_shard_spec_rules() -> None:
    finalize = ShardSpec.model_validate(
        {"campaign": "c", "index": 4, "shardClass": "finalize", "idempotencyKey": "k"}
    )
    assert finalize.is_finalize and finalize.item_count == 0
    work = ShardSpec.model_validate({"campaign": "c", "index": 0, "items": [{}, {}], "idempotencyKey": "k"})
    assert work.shard_class is ShardClass.WORK and work.item_count == 2
    with pytest.raises(ValidationError, match=r"a work shard needs spec.items or spec.itemRange"):
        ShardSpec.model_validate({"campaign": "c", "index": 0, "idempotencyKey": "k"})


def test_history_is_bounded_to_the_newest_entries() -> None:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    entries = [
        {"phase": "Pending", "at": (start + timedelta(seconds=n)).isoformat(), "reason": f"R{n}"}
        for n in range(HISTORY_LIMIT + 5)
    ]
    status = ShardStatus.model_validate({"history": entries})
    assert len(status.history) == HISTORY_LIMIT
    assert status.history[-1].reason == f"R{HISTORY_LIMIT + 4}"
    grown = status.with_history(HistoryEntry(phase=ShardPhase.DONE, at=start, reason="Completed"))
    assert len(grown.history) == HISTORY_LIMIT
    assert grown.history[-1].reason == "Completed"
    assert grown.history[0].reason == "R6"


def test_long_error_messages_are_cut_not_rejected() -> None:
    error = ShardError.model_validate({"class": "unknown", "message": "x" * 100_000})
    assert len(error.message) == 1024
    assert error.message.endswith("[truncated]")


def test_listed_shard_names_are_bounded() -> None:
    status = CampaignStatus.model_validate({"blockedShards": [f"s-{n}" for n in range(500)]})
    assert len(status.blocked_shards) == 50


def test_datetimes_must_carry_a_zone() -> None:
    with pytest.raises(ValidationError):
        ShardStatus.model_validate({"leaseUntil": "2025-01-01T00:00:00"})
    status = ShardStatus.model_validate({"leaseUntil": "2025-01-01T00:00:00Z"})
    assert status.to_dict()["leaseUntil"] == "2025-01-01T00:00:00Z"


def test_conditions_keep_their_transition_time_while_status_holds() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    t1 = t0 + timedelta(minutes=5)

    def ready(status: str, reason: str, at: datetime) -> Condition:
        return Condition.model_validate(
            {"type": "Ready", "status": status, "reason": reason, "message": "", "lastTransitionTime": at}
        )

    status = CampaignStatus().with_condition(ready("True", "Dispatching", t0))
    same = status.with_condition(ready("True", "AllRunning", t1))
    assert same.condition("Ready") == ready("True", "AllRunning", t0)
    flipped = same.with_condition(ready("False", "Suspended", t1))
    assert flipped.condition("Ready") == ready("False", "Suspended", t1)
    assert len(flipped.conditions) == 1
    assert flipped.condition("Stalled") is None


def test_condition_reason_follows_metav1() -> None:
    with pytest.raises(ValidationError):
        Condition.model_validate(
            {
                "type": "Ready",
                "status": "True",
                "reason": "not camel",
                "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        )


def test_retry_is_requested_by_bumping_the_generation() -> None:
    body: dict[str, Any] = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {"generation": 2},
        "spec": spec().to_dict(),
    }
    assert not Campaign.parse(body).retry_requested
    bumped = {**body, "spec": {**body["spec"], "retry": {"generation": 1}}}
    assert Campaign.parse(bumped).retry_requested
    done = {**bumped, "status": {"lastRetryGeneration": 1, "observedGeneration": 2}}
    campaign = Campaign.parse(done)
    assert not campaign.retry_requested
    assert campaign.spec_observed


def test_breaker_lookup() -> None:
    status = CampaignStatus.model_validate(
        {"breakers": [{"source": "a", "state": "Open", "consecutiveFailures": 3}]}
    )
    breaker = status.breaker("a")
    assert breaker is not None and breaker.state == "Open"
    assert status.breaker("b") is None
