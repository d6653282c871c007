"""`shardops llm`: templates, the HTTP error mapping, pacing, cost, and whole runs against the loopback
test upstream (testbed/upstream.py, real HTTP; no cluster)."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from testbed.upstream import (
    ANSWER_SCHEMA_FORMAT,
    Behaviour,
    LlmServer,
    batch_line,
    chat_body,
    llm_server,
    prompt_tokens,
)

from shardops.api import rules
from shardops.api.campaign import Campaign, CampaignStatus, SourceShare
from shardops.api.enums import ErrorClass
from shardops.api.item_errors import item_error_of
from shardops.api.llm import (
    CONFIG_ENV,
    COOLDOWN_FILE_SHARE_KEY,
    LlmSpec,
    ModelPrice,
    SecretKeyRef,
    TokenPrice,
)
from shardops.api.money import money_text
from shardops.api.shard import Shard
from shardops.k8s import leases
from shardops.k8s.api import SHARDS
from shardops.k8s.shards import TransitionRequest, planned_status
from shardops.llm import main as llm_main
from shardops.llm.pacing import Pacer, Share, part_of_remaining, share_in, state_path
from shardops.llm.render import RenderError, RequestTemplate
from shardops.llm.upstream import classify_status, parse_duration, provider_error, rate_limit_wait
from shardops.logic.backoff import retry_not_before
from shardops.logic.failures import EXIT_TEMPFAIL, MAX_RETRY_AFTER_SECONDS, classify_failure
from shardops.logic.transitions import Action
from shardops.scheduler.builders import worker_job_body
from shardops.store.configmap import read_ref
from shardops.worker.runtime import Worker
from shardops.worker.settings import WorkerSettings
from tests import workerkit
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, add_campaign, campaign_body

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SECRET = {"name": "provider-key", "key": "token"}


def llm_block(base_url: str = "http://127.0.0.1:9/v1", **extra: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "baseUrl": base_url,
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Q: {{ item.q }}"},
        ],
    }
    block.update(extra)
    return block


def campaign(llm: dict[str, Any], **spec: Any) -> Campaign:
    body = {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": "llm", "namespace": "ns"},
        "spec": {
            "items": [{"q": "x"}],
            "worker": {"image": "shardops:dev", "command": ["shardops", "llm"], "llm": llm},
            **spec,
        },
    }
    return Campaign.parse(body)


# --- the API block --------------------------------------------------------------------------------


def test_prices_must_cover_every_model_the_worker_calls() -> None:
    prices = [{"model": "other", "inputPerMillion": 1, "outputPerMillion": 2}]
    with pytest.raises(ValidationError) as caught:
        LlmSpec.model_validate(llm_block(prices=prices))
    assert rules.LLM_PRICES_COVER_MODELS.message in str(caught.value)
    assert "no price: test-model" in str(caught.value)
    # No table at all is fine: cost is then counted in tokens.
    assert LlmSpec.model_validate(llm_block()).prices == []


def test_llm_sources_must_be_declared_sources() -> None:
    with pytest.raises(ValidationError) as caught:
        campaign(llm_block(sources=[{"name": "elsewhere", "model": "m2"}]))
    assert rules.LLM_ENDPOINTS_DECLARED.message in str(caught.value)


def test_source_price_wins_over_the_model_price_and_cached_tokens_are_cheaper() -> None:
    spec = LlmSpec.model_validate(
        llm_block(
            prices=[
                {"model": "test-model", "inputPerMillion": 2, "outputPerMillion": 8},
                {
                    "model": "test-model",
                    "source": "b",
                    "inputPerMillion": 1,
                    "cachedInputPerMillion": 0.5,
                    "outputPerMillion": 4,
                },
            ]
        )
    )
    general, own = spec.price("a", "test-model"), spec.price("b", "test-model")
    assert general is not None and own is not None
    assert general.cost(1000, 400, 100) == Decimal("0.0028")  # (1000 * 2 + 100 * 8) / 1e6, exactly
    assert own.cost(1000, 400, 100) == Decimal("0.0012")  # (600 * 1 + 400 * 0.5 + 100 * 4) / 1e6


def test_identity_changes_with_the_requests_not_with_prices_or_keys() -> None:
    base = campaign(llm_block()).spec.worker
    priced = campaign(
        llm_block(
            prices=[{"model": "test-model", "inputPerMillion": 1, "outputPerMillion": 1}],
            apiKeySecret=SECRET,
            timeoutSeconds=5,
        )
    ).spec.worker
    other_prompt = campaign(
        llm_block(messages=[{"role": "user", "content": "Other: {{ item.q }}"}])
    ).spec.worker
    assert base.identity() == priced.identity()
    assert base.identity() != other_prompt.identity()
    assert base.identity()["command"][:2] == ["shardops", "llm"]
    # The default format is not in it, as before there was one: upgrading reuses every stored result.
    assert "format" not in base.identity()["llm"]
    batch = LlmSpec.model_validate({"baseUrl": "http://x/v1", "model": "m", "format": "openai-batch"})
    assert batch.identity()["format"] == "openai-batch"


def test_the_command_gets_the_block_rate_limits_and_max_concurrency() -> None:
    c = campaign(
        llm_block(),
        sources=[{"name": "a", "rateLimit": {"requestsPerMinute": 120}}],
        defaultSource="a",
        maxConcurrency=4,
    )
    settings = json.loads(c.spec.command_settings(c.spec.worker)[CONFIG_ENV])
    assert settings["maxConcurrency"] == 4
    assert settings["rateLimits"] == {"a": {"requestsPerMinute": 120.0}}
    assert settings["llm"]["model"] == "test-model"
    plain = c.spec.worker.model_copy(update={"llm": None})
    assert c.spec.command_settings(plain) == {}


def test_the_worker_pod_reads_api_keys_from_the_secrets_not_the_spec() -> None:
    c = campaign(
        llm_block(apiKeySecret=SECRET, sources=[{"name": "b", "apiKeySecret": {"name": "other"}}]),
        sources=[{"name": "a"}, {"name": "b"}],
    )
    env = worker_job_body(c, c.spec.worker)["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "SHARDOPS_LLM_API_KEY": {"name": "provider-key", "key": "token", "optional": True},
        "SHARDOPS_LLM_API_KEY_b": {"name": "other", "key": "api-key", "optional": True},
    }


# --- templates ------------------------------------------------------------------------------------


def test_a_missing_field_is_an_error_naming_it() -> None:
    template = RequestTemplate(LlmSpec.model_validate(llm_block()), "test-model")
    body = template.render({"q": "why?"}, 0, "k")
    assert body["messages"][1] == {"role": "user", "content": "Q: why?"}
    with pytest.raises(RenderError) as caught:
        template.render({"question": "why?"}, 0, "k")
    assert "'q'" in str(caught.value) and "messages[1].content" in str(caught.value)
    assert "the item has: question" in str(caught.value)


@pytest.mark.parametrize(
    "content",
    [
        "{{ item.__class__.__mro__ }}",
        "{{ ''.__class__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_templates_cannot_reach_python_internals(content: str) -> None:
    spec = LlmSpec.model_validate(llm_block(messages=[{"role": "user", "content": content}]))
    with pytest.raises(RenderError):
        RequestTemplate(spec, "m").render({"q": 1}, 0, "k")


def test_request_fields_and_json_passthrough() -> None:
    spec = LlmSpec.model_validate(
        llm_block(
            messages=[{"role": "user", "content": "{{ item | tojson }}"}],
            temperature=0.2,
            maxTokens=50,
            responseFormat={"type": "json_object"},
            extraBody={"seed": 7, "model": "ignored"},
        )
    )
    body = RequestTemplate(spec, "test-model").render({"text": "<b>&"}, 3, "k")
    assert body["messages"][0]["content"] == '{"text": "<b>&"}'  # not HTML-escaped
    assert (body["model"], body["temperature"], body["max_tokens"], body["seed"]) == (
        "test-model",
        0.2,
        50,
        7,
    )
    assert body["response_format"] == {"type": "json_object"}


# --- HTTP answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2", 2.0), ("0.5", 0.5), ("20ms", 0.02), ("6m0s", 360.0), ("1h2m3.5s", 3723.5), ("soon", None)],
)
def test_durations_of_rate_limit_headers(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_the_longest_wait_a_429_names_wins() -> None:
    assert rate_limit_wait({"Retry-After": "2"}, NOW) == 2.0
    assert rate_limit_wait({"retry-after-ms": "1500"}, NOW) == 1.5
    http_date = "Thu, 01 Jan 2026 00:00:30 GMT"
    assert rate_limit_wait({"Retry-After": http_date}, NOW) == 30.0
    used_up = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
    assert rate_limit_wait({**used_up, "Retry-After": "1"}, NOW) == 360.0
    # A budget with requests left is not what the 429 is about.
    assert (
        rate_limit_wait({"x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "9s"}, NOW)
        is None
    )
    assert rate_limit_wait({}, NOW) is None


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (429, "rate_limit_exceeded", ErrorClass.RATE_LIMITED),
        (429, "insufficient_quota", ErrorClass.UNAUTHORIZED),
        (408, None, ErrorClass.TIMEOUT),
        (504, None, ErrorClass.TIMEOUT),
        (500, None, ErrorClass.UNAVAILABLE),
        (503, None, ErrorClass.UNAVAILABLE),
        (401, None, ErrorClass.UNAUTHORIZED),
        (403, None, ErrorClass.UNAUTHORIZED),
        (404, None, ErrorClass.NOT_FOUND),
        (400, "model_not_found", ErrorClass.NOT_FOUND),
        (400, "context_length_exceeded", ErrorClass.INVALID_INPUT),
        (422, None, ErrorClass.INVALID_INPUT),
    ],
)
def test_status_codes_map_to_retry_classes(status: int, code: str | None, expected: ErrorClass) -> None:
    assert classify_status(status, code) is expected


def test_provider_messages_are_read_from_the_usual_shapes() -> None:
    assert provider_error(b'{"error": {"message": "bad", "code": "x"}}') == ("bad", "x")
    assert provider_error(b'{"detail": "vllm says no"}') == ("vllm says no", None)
    assert provider_error(b"<html>gateway</html>") == ("<html>gateway</html>", None)


# --- the protocol: retryAfterSeconds becomes notBefore --------------------------------------------


def test_the_error_file_carries_a_retry_after_for_retryable_classes_only() -> None:
    limited = classify_failure(75, {"class": "rate-limited", "retryAfterSeconds": 2}, "a")
    assert limited is not None and limited.retry_after_seconds == 2.0
    capped = classify_failure(75, {"class": "rate-limited", "retryAfterSeconds": 10**9}, "a")
    assert capped is not None and capped.retry_after_seconds == MAX_RETRY_AFTER_SECONDS
    final = classify_failure(1, {"class": "invalid-input", "retryAfterSeconds": 2}, "a")
    assert final is not None and final.retry_after_seconds is None
    for junk in ("2", -1, float("nan"), True):
        odd = classify_failure(75, {"class": "rate-limited", "retryAfterSeconds": junk}, "a")
        assert odd is not None and odd.retry_after_seconds is None


def test_not_before_is_never_sooner_than_the_retry_after() -> None:
    for rand in (0.0, 0.5, 0.999):
        at = retry_not_before(NOW, 1, 0.1, 1.0, rand, retry_after=2.0)
        assert dt.timedelta(seconds=2.0) <= at - NOW <= dt.timedelta(seconds=2.4)
    # The backoff still wins when it is the longer wait.
    assert retry_not_before(NOW, 1, 10, 10, 0.0, retry_after=1.0) - NOW == dt.timedelta(seconds=5)


# --- pacing ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_worker_keeps_to_its_share_of_the_limit(tmp_path: Path) -> None:
    share = Share.of(requests_per_minute=120, tokens_per_minute=None, workers=6)
    assert share.seconds_per_request == 3.0
    clock = FakeClock()
    pacer = Pacer(share, tmp_path / "pace.json", clock=clock, sleep=clock.sleep)
    starts = []
    for _ in range(5):
        started = pacer.wait()
        starts.append(started)
        pacer.spent(started, tokens=10)
    assert [b - a for a, b in itertools.pairwise(starts)] == [3.0] * 4
    # The next process of the same worker (the next shard) continues the spacing.
    again = Pacer(share, tmp_path / "pace.json", clock=clock, sleep=clock.sleep)
    assert again.wait() == starts[-1] + 3.0


def test_tokens_per_minute_space_requests_by_their_size() -> None:
    clock = FakeClock()
    pacer = Pacer(Share.of(None, 6000, workers=2), None, clock=clock, sleep=clock.sleep)
    started = pacer.wait()
    # 100 tokens of a 3000-per-minute share, paid from it less the largest request (100): 60/29 s.
    pacer.spent(started, tokens=100)
    assert pacer.wait() == pytest.approx(started + 100 * 60 / 2900)


def test_requests_of_one_size_stay_within_the_tokens_share_in_every_60_s_window() -> None:
    """Tokens are charged after the answer, so a spacing of exactly the share would let each 60 s
    window hold the share plus one more request; paying from the share less the largest request,
    every window holds at most the share (8 minutes of 93-token requests on 1,666 a minute)."""
    clock = FakeClock()
    pacer = Pacer(Share.of(None, 10_000, workers=6), None, clock=clock, sleep=clock.sleep)
    starts = []
    while clock.now < 100 + 8 * 60:
        started = pacer.wait()
        starts.append(started)
        pacer.spent(started, tokens=93)
    most = max(sum(1 for t in starts if begin <= t < begin + 60) for begin in starts)
    assert most * 93 <= 10_000 / 6
    assert (most + 1) * 93 > 10_000 / 6, "and not much below it"


def test_prompt_and_completion_tokens_per_minute_space_requests_by_the_tighter_of_them() -> None:
    clock = FakeClock()
    share = Share.of(None, None, 2, input_tokens_per_minute=12000, output_tokens_per_minute=3000)
    pacer = Pacer(share, None, clock=clock, sleep=clock.sleep)
    started = pacer.wait()
    # Each paid from its share less the largest request of its kind: 200 prompt tokens of 6000 a
    # minute, 200 x 60 / 5800 s; 100 completion tokens of 1500, 100 x 60 / 1400 s (the longer).
    pacer.spent(started, tokens=300, prompt_tokens=200, completion_tokens=100)
    assert pacer.wait() == pytest.approx(started + 100 * 60 / 1400)
    started = pacer.wait()
    pacer.spent(started, tokens=610, prompt_tokens=600, completion_tokens=10)
    assert pacer.wait() == pytest.approx(started + 600 * 60 / 5400)


def test_provider_headers_tighten_the_pace() -> None:
    clock = FakeClock()
    pacer = Pacer(Share(), None, clock=clock, sleep=clock.sleep)
    pacer.tighten(remaining=10, reset_seconds=5, workers=2)  # 5 each over 5 s: one a second
    assert pacer.wait() == 101.0
    pacer.tighten(remaining=0, reset_seconds=30, workers=2)
    assert pacer.wait() == 131.0


def test_a_retry_after_holds_every_slot_of_the_pod_each_keeping_its_own_spacing(tmp_path: Path) -> None:
    """Slots of one pod (spec.worker.slots) share the pace file: a Retry-After one is told holds the
    other too, even one already asleep for its own spacing; plain spacing stays each slot's own."""
    clock = FakeClock()
    share = Share.of(requests_per_minute=60, tokens_per_minute=None, workers=1)  # 1 s apart
    told, other = (Pacer(share, tmp_path / "pace.json", clock=clock, sleep=clock.sleep) for _ in range(2))
    told.spent(told.wait(), 0)
    assert other.wait() == 100.0  # the first slot's spacing is not the second's
    other.spent(100.0, 0)
    told.hold_pod_until(130.0)  # a 429 with Retry-After 30 s
    assert other.wait() == 130.0 and told.wait() == 130.0

    def told_while_asleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now < 150.0:
            told.hold_pod_until(150.0)  # another 429 arrives while `other` sleeps for its spacing

    other.spent(130.0, 0)
    asleep = Pacer(share, tmp_path / "pace.json", clock=clock, sleep=told_while_asleep)
    asleep.next_at = other.next_at
    assert asleep.wait() == 150.0


def test_pace_files_are_per_pod_campaign_and_source() -> None:
    assert state_path("p1", "c", "a") != state_path("p2", "c", "a") != state_path("p1", "c", "b")


# --- whole runs against the loopback upstream -----------------------------------------------------


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with llm_server(Behaviour(api_key="right", slow_seconds=2.0)) as running:
        yield running


def run_items(
    tmp_path: Path, items: list[dict[str, Any]], llm: dict[str, Any], key: str | None = "right", **env: str
) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    lines = [{"key": f"k{i}", "index": i, "item": item} for i, item in enumerate(items)]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    settings = {"llm": llm, "maxConcurrency": 1, "rateLimits": {}}
    environment = {
        CONFIG_ENV: json.dumps(settings),
        "SHARDOPS_ITEMS_FILE": str(tmp_path / "items.jsonl"),
        "SHARDOPS_RESULTS_FILE": str(tmp_path / "results.jsonl"),
        "SHARDOPS_ERROR_FILE": str(tmp_path / "error.json"),
        "SHARDOPS_SOURCE": "a",
        "POD_NAME": f"unit-{tmp_path.name}",
        **({"SHARDOPS_LLM_API_KEY": key} if key else {}),
        **env,
    }
    code = llm_main.run(environment)
    results_file = tmp_path / "results.jsonl"
    results = [json.loads(x) for x in results_file.read_text().splitlines()] if results_file.exists() else []
    error_file = tmp_path / "error.json"
    return code, results, json.loads(error_file.read_text()) if error_file.exists() else None


def test_each_item_gets_content_usage_and_its_cost(server: LlmServer, tmp_path: Path) -> None:
    price = {"model": "test-model", "inputPerMillion": 3, "cachedInputPerMillion": 1, "outputPerMillion": 15}
    server.behaviour.cached_tokens = 2
    block = llm_block(server.base_url, apiKeySecret=SECRET, prices=[price])
    code, results, error = run_items(tmp_path, [{"q": "one two"}, {"q": "three"}], block)
    assert (code, error) == (0, None)
    assert [r["key"] for r in results] == ["k0", "k1"]
    first = results[0]["result"]
    assert first["content"] == "answer: owt eno :Q" and first["finishReason"] == "stop"
    usage = first["usage"]
    assert usage["prompt_tokens"] == prompt_tokens(
        [{"content": "Answer briefly."}, {"content": "Q: one two"}]
    )
    expected = ModelPrice.model_validate(price).cost(usage["prompt_tokens"], 2, usage["completion_tokens"])
    assert results[0]["cost"] == money_text(expected)  # a decimal string: read exactly
    assert results[0]["tokens"] == {
        "input": usage["prompt_tokens"],
        "cachedInput": 2,
        "output": usage["completion_tokens"],
    }
    assert [r.status for r in server.requests()] == [200, 200]


def test_without_a_price_table_cost_is_tokens(server: LlmServer, tmp_path: Path) -> None:
    _, results, _ = run_items(tmp_path, [{"q": "x"}], llm_block(server.base_url))
    assert results[0]["cost"] == str(results[0]["result"]["usage"]["total_tokens"])


def test_a_429_keeps_earlier_results_and_asks_for_its_retry_after(server: LlmServer, tmp_path: Path) -> None:
    server.behaviour.retry_after = "3"
    code, results, error = run_items(
        tmp_path, [{"q": "fine"}, {"q": "FAULT:429"}, {"q": "never"}], llm_block(server.base_url)
    )
    assert code == EXIT_TEMPFAIL
    assert [r["key"] for r in results] == ["k0"]
    assert error is not None
    assert (error["class"], error["source"], error["retryAfterSeconds"]) == ("rate-limited", "a", 3.0)
    assert error["message"].startswith("item 1: 429")
    assert len(server.requests()) == 2  # the third item was not tried


@pytest.mark.parametrize(
    ("fault", "code", "phrase"),
    [
        ("400", "invalid_value", "Invalid value for 'temperature': too hot"),
        ("context", "context_length_exceeded", "maximum context length is 8 tokens"),
    ],
)
def test_an_item_the_upstream_refuses_is_that_items_error_and_the_rest_go_on(
    server: LlmServer, tmp_path: Path, fault: str, code: str, phrase: str
) -> None:
    code_, results, error = run_items(
        tmp_path, [{"q": "fine"}, {"q": f"FAULT:{fault}"}, {"q": "after"}], llm_block(server.base_url)
    )
    assert (code_, error) == (0, None)
    assert [r["key"] for r in results] == ["k0", "k1", "k2"]
    refused = results[1]
    assert "result" not in refused and refused["error"]["class"] == "invalid-input"
    assert refused["error"]["code"] == code
    assert refused["error"]["message"].startswith("item 1: 400") and phrase in refused["error"]["message"]
    assert results[2]["result"]["content"] == "answer: retfa :Q"


@pytest.mark.parametrize(
    ("fault", "error_class", "phrase"),
    [
        ("500", "unavailable", "500"),
        ("timeout", "timeout", "within timeoutSeconds 0.5"),
        ("malformed", "unavailable", "malformed response, not a chat completion"),
    ],
)
def test_failures_carry_their_class_and_the_providers_message(
    server: LlmServer, tmp_path: Path, fault: str, error_class: str, phrase: str
) -> None:
    code, _, error = run_items(
        tmp_path, [{"q": f"FAULT:{fault}"}], llm_block(server.base_url, timeoutSeconds=0.5)
    )
    assert error is not None and error["class"] == error_class, error
    assert phrase in error["message"]
    assert code == (EXIT_TEMPFAIL if ErrorClass(error_class).retryable else llm_main.EXIT_FAILED)


def test_a_refused_key_names_the_secret(server: LlmServer, tmp_path: Path) -> None:
    _, _, error = run_items(
        tmp_path, [{"q": "x"}], llm_block(server.base_url, apiKeySecret=SECRET), key="wrong"
    )
    assert error is not None and error["class"] == "unauthorized"
    assert "Secret provider-key key token" in error["message"]
    _, _, missing = run_items(
        tmp_path, [{"q": "x"}], llm_block(server.base_url, apiKeySecret=SECRET), key=None
    )
    assert missing is not None and missing["class"] == "unauthorized"
    assert "Secret provider-key key token is missing or empty" in missing["message"]


def test_an_unknown_model_is_not_found(server: LlmServer, tmp_path: Path) -> None:
    _, _, error = run_items(tmp_path, [{"q": "x"}], llm_block(server.base_url, model="gpt-nope"))
    assert error is not None and error["class"] == "not-found" and "gpt-nope" in error["message"]


def test_a_template_field_the_item_lacks_is_its_error_and_costs_no_call(
    server: LlmServer, tmp_path: Path
) -> None:
    code, results, error = run_items(tmp_path, [{"question": "x"}], llm_block(server.base_url))
    assert (code, error) == (0, None)
    assert results[0]["error"]["class"] == "invalid-input"
    assert "item 0" in results[0]["error"]["message"] and "'q'" in results[0]["error"]["message"]
    assert server.requests() == []


def test_json_schema_mode_returns_parsed_json(server: LlmServer, tmp_path: Path) -> None:
    code, results, _ = run_items(
        tmp_path, [{"q": "a b"}], llm_block(server.base_url, responseFormat=ANSWER_SCHEMA_FORMAT)
    )
    assert code == 0
    assert results[0]["result"]["json"] == {"answer": "answer: b a :Q", "words": 3}


@pytest.mark.parametrize(
    ("fault", "phrase"),
    [
        ("schema", "does not match responseFormat's JSON schema at $: 'answer' is a required property"),
        ("notjson", "content is not JSON"),
    ],
)
def test_a_response_that_fails_the_schema_is_a_clear_item_error(
    server: LlmServer, tmp_path: Path, fault: str, phrase: str
) -> None:
    code, results, error = run_items(
        tmp_path,
        [{"q": "fine"}, {"q": f"FAULT:{fault}"}],
        llm_block(server.base_url, responseFormat=ANSWER_SCHEMA_FORMAT),
    )
    assert (code, error) == (0, None)
    assert [r["key"] for r in results] == ["k0", "k1"]
    assert results[1]["error"]["class"] == "bad-output"
    assert results[1]["error"]["message"].startswith("item 1: ") and phrase in results[1]["error"]["message"]
    # The answer off the schema was paid for: its tokens are the item's cost all the same.
    charged = server.requests()[1]
    assert results[1]["cost"] == str(charged.prompt_tokens + charged.completion_tokens)
    assert results[1]["tokens"]["output"] == charged.completion_tokens


def test_without_its_settings_the_command_says_how_it_is_run(tmp_path: Path) -> None:
    code = llm_main.run({"SHARDOPS_ERROR_FILE": str(tmp_path / "e.json")})
    assert code == llm_main.EXIT_FAILED
    assert "runs under shardops worker" in json.loads((tmp_path / "e.json").read_text())["message"]


# --- under the worker runtime (in-memory API server) ------------------------------------------------


LLM_COMMAND = [sys.executable, "-c", "import sys; from shardops.main import main; sys.exit(main(['llm']))"]


def test_under_the_runtime_a_429_sets_not_before_to_the_retry_after_and_results_are_stored(
    server: LlmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDOPS_LLM_API_KEY", "right")
    server.behaviour.retry_after = "30"
    price = {"model": "test-model", "inputPerMillion": 1, "outputPerMillion": 1}
    block = llm_block(server.base_url, apiKeySecret=SECRET, prices=[price])
    body = campaign_body(
        items=[{"q": "fine"}, {"q": "FAULT:429"}],
        worker={"image": "x", "command": LLM_COMMAND, "llm": block},
        shardSize=2,
    )
    kube = FakeKube()
    (shard,) = add_campaign(kube, body)
    worker = Worker(
        kube=kube,  # type: ignore[arg-type]
        settings=WorkerSettings(
            namespace=NAMESPACE,
            pod_name="w",
            tick_seconds=0.01,
            poll_seconds=0.01,
            idle_seconds=0,
            work_dir=tmp_path,
            max_shards=1,
        ),
        namespace=NAMESPACE,
        campaign_name="camp",
    )
    assert worker.run() == 0
    found = kube.obj(SHARDS, NAMESPACE, shard.name)
    assert found is not None
    status = Shard.parse(found).current_status
    assert status.phase == "Pending" and status.last_error is not None
    assert status.last_error.error_class == "rate-limited" and "item 1: 429" in status.last_error.message
    assert status.not_before is not None
    # The backoff alone (base 2 s) would be 1-2 s; the upstream asked for 30 (plus up to 20 % jitter).
    delay = (status.not_before - status.history[-1].at).total_seconds()
    assert 30.0 <= delay <= 36.0, delay
    # The item answered before the 429 is stored, with its cost in the shard's.
    assert status.progress is not None and status.progress.done == 1
    answered = next(e for e in server.requests() if e.status == 200)
    assert status.cost == Decimal(answered.prompt_tokens + answered.completion_tokens) / 1_000_000


# --- format openai-batch ----------------------------------------------------------------------------


def question_line(custom_id: str, question: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    return batch_line(custom_id, chat_body(question, max_tokens=5), url)


def batch_block(base_url: str) -> dict[str, Any]:
    return {"baseUrl": base_url, "model": "test-model", "format": "openai-batch"}


def test_the_format_decides_what_the_block_holds() -> None:
    with pytest.raises(ValidationError) as caught:
        LlmSpec.model_validate({**llm_block(), "format": "openai-batch"})
    assert rules.LLM_FORMAT_FIELDS.message in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        LlmSpec.model_validate({**llm_block(), "messages": []})
    assert rules.LLM_FORMAT_FIELDS.message in str(caught.value)
    assert LlmSpec.model_validate(batch_block("http://x/v1")).messages == []


def test_batch_lines_keep_the_upstreams_answer_verbatim_and_a_refused_one_is_its_error(
    server: LlmServer, tmp_path: Path
) -> None:
    from openai.types.chat import ChatCompletion

    lines = [question_line("a", "one"), question_line("b", "FAULT:context"), question_line("c", "two three")]
    code, results, error = run_items(tmp_path, lines, batch_block(server.base_url))
    assert (code, error) == (0, None)
    answered = [results[0]["result"], results[2]["result"]]
    assert [r["statusCode"] for r in answered] == [200, 200]
    completions = [ChatCompletion.model_validate(r["body"]) for r in answered]
    assert completions[1].choices[0].message.content == "answer: eerht owt"
    assert {r["requestId"] for r in answered} == {"req-1", "req-3"}
    # The body went as written, but for its model: the source's serves it.
    assert [r.model for r in server.requests()] == ["test-model"] * 3
    assert results[2]["tokens"]["input"] == completions[1].usage.prompt_tokens  # type: ignore[union-attr]
    refused = results[1]
    assert (
        refused["error"]["class"] == "invalid-input" and refused["error"]["code"] == "context_length_exceeded"
    )
    assert refused["result"]["statusCode"] == 400
    assert refused["result"]["body"]["error"]["code"] == "context_length_exceeded"


def test_a_line_that_is_not_a_batch_line_is_its_error_and_costs_no_call(
    server: LlmServer, tmp_path: Path
) -> None:
    code, results, _ = run_items(
        tmp_path, [question_line("a", "x", url="/v1/images")], batch_block(server.base_url)
    )
    assert code == 0
    assert "url must be one of /v1/chat/completions" in results[0]["error"]["message"]
    assert server.requests() == []


def test_a_batch_lines_url_picks_the_endpoint(server: LlmServer, tmp_path: Path) -> None:
    from openai.types import CreateEmbeddingResponse

    line = batch_line("e", {"model": "x", "input": "a b c"}, url="/v1/embeddings")
    code, results, _ = run_items(tmp_path, [line], batch_block(server.base_url))
    assert code == 0
    embedded = CreateEmbeddingResponse.model_validate(results[0]["result"]["body"])
    assert len(embedded.data[0].embedding) == 3 and embedded.model == "test-model"
    assert results[0]["tokens"] == {"input": 3, "cachedInput": 0, "output": 0}


def _a_shard_with_a_refused_line(
    server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeKube, Shard]:
    """One Pending shard of three OpenAI batch lines, the second one the upstream refuses (400)."""
    monkeypatch.setenv("SHARDOPS_LLM_API_KEY", "right")
    lines = [question_line("a", "one"), question_line("b", "FAULT:400"), question_line("c", "two")]
    block = {**batch_block(server.base_url), "apiKeySecret": SECRET}
    body = campaign_body(
        items=lines, worker={"image": "x", "command": LLM_COMMAND, "llm": block}, shardSize=3
    )
    kube = FakeKube()
    (shard,) = add_campaign(kube, body)
    return kube, shard


def test_under_the_runtime_a_shard_with_a_refused_line_is_done_with_it_counted_as_errored(
    server: LlmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube, shard = _a_shard_with_a_refused_line(server, monkeypatch)
    settings = WorkerSettings(
        namespace=NAMESPACE,
        pod_name="w",
        tick_seconds=0.01,
        poll_seconds=0.01,
        idle_seconds=0,
        work_dir=tmp_path,
        max_shards=1,
    )
    worker = Worker(kube=kube, settings=settings, namespace=NAMESPACE, campaign_name="camp")  # type: ignore[arg-type]
    assert worker.run() == 0
    found = kube.obj(SHARDS, NAMESPACE, shard.name)
    assert found is not None
    status = Shard.parse(found).current_status
    assert status.phase == "Done" and status.attempt == 1
    assert status.progress is not None and (status.progress.done, status.progress.errored) == (3, 1)
    assert status.last_error is not None and status.last_error.error_class == "invalid-input"
    assert status.last_error.message.startswith("1 of 3 item(s) failed on their own")
    assert "(item 1 of the shard): item 1: 400" in status.last_error.message
    assert status.failed_item_by_item() is None, "two of its items succeeded"
    assert len(server.requests()) == 3


# --- a shared Source's share ----------------------------------------------------------------------


def test_the_command_is_told_which_sources_pace_to_a_shared_sources_share() -> None:
    c = campaign(
        llm_block(),
        sources=[{"name": "a", "sourceRef": {"name": "team-openai"}}, {"name": "b"}],
        defaultSource="a",
    )
    settings = json.loads(c.spec.command_settings(c.spec.worker)[CONFIG_ENV])
    assert settings["sharedSources"] == ["a"]
    assert settings["rateLimits"] == {}


def test_share_in_reads_the_share_the_runtime_wrote(tmp_path: Path) -> None:
    path = tmp_path / "cooldown.json"
    assert share_in(path) is None, "no file yet"
    path.write_text(json.dumps({"until": 5.0}))
    assert share_in(path) is None, "a cooldown alone is no share"
    path.write_text(json.dumps({COOLDOWN_FILE_SHARE_KEY: {"requestsPerMinute": 30, "tokensPerMinute": None}}))
    assert share_in(path) == (30.0, None, None, None)
    path.write_text(
        json.dumps({COOLDOWN_FILE_SHARE_KEY: {"inputTokensPerMinute": 600, "outputTokensPerMinute": 300}})
    )
    assert share_in(path) == (None, None, 600.0, 300.0)
    path.write_text(json.dumps({COOLDOWN_FILE_SHARE_KEY: {"requestsPerMinute": "many"}}))
    assert share_in(path) is None


def test_a_shared_source_waits_for_a_share_then_keeps_to_it(tmp_path: Path) -> None:
    """No share (or 0) means no request; once the runtime writes one, requests are spaced by the
    campaign's share / maxConcurrency, and a lowered share is obeyed from the next request."""
    cooldown = tmp_path / "cooldown.json"

    def write_share(requests: float) -> None:
        cooldown.write_text(json.dumps({COOLDOWN_FILE_SHARE_KEY: {"requestsPerMinute": requests}}))

    write_share(0)
    clock = FakeClock()
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        clock.sleep(seconds)
        if len(waited) == 3:
            write_share(60)  # the operator's share reaches the file at a heartbeat

    settings = llm_main.Settings(LlmSpec.model_validate(llm_block()), 2, {}, frozenset({"a"}))
    env = {"SHARDOPS_COOLDOWN_FILE": str(cooldown), "POD_NAME": ""}
    call = llm_main.Call(settings, "a", env)
    call.pacer = Pacer(Share(), None, clock=clock, sleep=sleep)
    call._heed_share()
    assert waited == [llm_main.SHARE_POLL_SECONDS] * 3
    assert call.pacer.share.seconds_per_request == 2.0, "60 a minute for 2 workers: one each 2 s"
    write_share(20)
    call._heed_share()
    assert call.pacer.share.seconds_per_request == 6.0


def test_on_a_shared_source_each_campaign_takes_its_shares_part_of_the_providers_remaining(
    tmp_path: Path,
) -> None:
    """Every campaign on one key reads the same x-ratelimit-remaining from its own answers: with a
    share of 30 of the provider's 120 a minute, a campaign takes a quarter of what is left (20 of 80
    requests over the reset), so the campaigns together stay within it; alone on its key, all of it."""
    cooldown = tmp_path / "cooldown.json"
    cooldown.write_text(json.dumps({COOLDOWN_FILE_SHARE_KEY: {"requestsPerMinute": 30}}))
    settings = llm_main.Settings(LlmSpec.model_validate(llm_block()), 2, {}, frozenset({"a"}))
    headers = {
        "x-ratelimit-limit-requests": "120",
        "x-ratelimit-remaining-requests": "80",
        "x-ratelimit-reset-requests": "40s",
    }
    clock = FakeClock()
    call = llm_main.Call(settings, "a", {"SHARDOPS_COOLDOWN_FILE": str(cooldown), "POD_NAME": ""})
    call.pacer = Pacer(Share(), None, clock=clock, sleep=clock.sleep)
    call._heed_share()
    call.pacer.share = Share()  # only the provider's word paces here
    call._tighten(headers, tokens=10)
    # 20 requests for 2 workers over 40 s: one each 4 s.
    assert call.pacer.wait() == 104.0

    alone = llm_main.Call(settings, None, {"POD_NAME": ""})
    alone.pacer = Pacer(Share(), None, clock=clock, sleep=clock.sleep)
    alone._tighten(headers, tokens=10)
    start = clock.now
    assert alone.pacer.wait() == start + 1.0, "80 for 2 workers over 40 s: one each second"
    assert part_of_remaining(80, None, 120) == 80
    assert part_of_remaining(80, 300, 120) == 80, "never more than what is left"


def test_a_shared_sources_endpoint_key_and_price_reach_the_command_and_the_pod() -> None:
    c = campaign(
        llm_block(prices=[{"model": "test-model", "inputPerMillion": 1, "outputPerMillion": 2}]),
        sources=[{"name": "a", "sourceRef": {"name": "team-openai"}}],
        defaultSource="a",
    )
    c.status = CampaignStatus(
        source_shares=[
            SourceShare(
                source="a",
                requests_per_minute=60,
                base_url="http://provider/v1",
                model="provider-model",
                api_key_secret=SecretKeyRef(name="team-key"),
                price=TokenPrice(input_per_million=Decimal("0.5"), output_per_million=Decimal("1.5")),
            )
        ]
    )
    settings = llm_main.Settings.from_env(
        c.spec.command_settings(c.spec.worker, c.current_status.source_shares)
    )
    endpoint = settings.llm.endpoint("a")
    assert (endpoint.base_url, endpoint.model) == ("http://provider/v1", "provider-model")
    price = settings.llm.price("a", "provider-model")
    assert price is not None and price.input_per_million == Decimal("0.5")
    job = worker_job_body(c, c.spec.worker)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SHARDOPS_LLM_API_KEY_a"]["valueFrom"]["secretKeyRef"] == {
        "name": "team-key",
        "key": "api-key",
        "optional": True,
    }


def test_a_persistent_process_serves_shard_after_shard(server: LlmServer, tmp_path: Path) -> None:
    """spec.worker.persistent (on by default for this command): one process, a request line per
    shard with that shard's own files, an answer line each, 0 at the end of input."""
    base = {
        CONFIG_ENV: json.dumps({"llm": llm_block(server.base_url), "maxConcurrency": 1, "rateLimits": {}}),
        "SHARDOPS_LLM_API_KEY": "right",
        "POD_NAME": f"unit-{tmp_path.name}",
        "SHARDOPS_PERSISTENT": "1",
    }
    requests = []
    for shard, question in (("s1", "one"), ("s2", "two")):
        folder = tmp_path / shard
        folder.mkdir()
        (folder / "items.jsonl").write_text(
            json.dumps({"key": "k", "index": 0, "item": {"q": question}}) + "\n"
        )
        env = {
            f"SHARDOPS_{name}_FILE": str(folder / f"{name.lower()}.jsonl") for name in ("ITEMS", "RESULTS")
        }
        requests.append(
            json.dumps({"shard": shard, "env": {**env, "SHARDOPS_ERROR_FILE": str(folder / "e")}})
        )
    stdout = io.StringIO()
    code = llm_main.serve(base, io.StringIO("\n".join(requests) + "\n"), stdout, io.StringIO())
    assert code == 0
    assert [json.loads(line) for line in stdout.getvalue().splitlines()] == [
        {"shard": "s1", "exit": 0},
        {"shard": "s2", "exit": 0},
    ]
    for shard, question in (("s1", "one"), ("s2", "two")):
        (result,) = [json.loads(x) for x in (tmp_path / shard / "results.jsonl").read_text().splitlines()]
        assert result["result"]["content"] == f"answer: {question[::-1]} :Q"
    assert (
        llm_main.serve(base, io.StringIO("not json\n"), io.StringIO(), io.StringIO()) == llm_main.EXIT_FAILED
    )


def test_a_retry_of_the_errored_items_runs_just_them_and_keeps_the_others_results(
    server: LlmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubectl campaign retry --errored on a live Done shard: back to Pending with rerunErrored (what
    the operator writes), the upstream fixed: one request (the errored line's), and the shard's
    result holds all three items, none errored, its cost the first attempt's plus that one call."""
    kube, shard = _a_shard_with_a_refused_line(server, monkeypatch)

    def run_worker() -> Shard:
        assert workerkit.worker(kube, tmp_path, max_shards=1).run() == 0
        found = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert found is not None
        return Shard.parse(found)

    first = run_worker()
    assert first.current_status.errored_items == 1 and len(server.requests()) == 3
    request = TransitionRequest(
        Action.RETRY_ERRORED, "retry --errored", updates={"retry_generation": 1, "rerun_errored": True}
    )
    stored = kube.obj(SHARDS, NAMESPACE, shard.name)
    assert stored is not None
    stored["status"] = planned_status(first, request, dt.datetime.now(dt.UTC), None).to_dict()
    kube.put(SHARDS, NAMESPACE, stored)
    lease = leases.read(kube, NAMESPACE, first.lease_name)  # type: ignore[arg-type]
    assert lease is not None and leases.revoke(kube, lease), "the operator frees a Done shard's Lease"  # type: ignore[arg-type]
    server.behaviour.faults_fixed = True

    again = run_worker().current_status
    assert again.phase == "Done" and again.attempt == 1
    assert [r.content for r in server.requests()[3:]] == ["FAULT:400"], "only the errored line again"
    assert again.errored_items == 0 and again.last_error is None
    assert again.result is not None and again.result.ref != first.current_status.result.ref  # type: ignore[union-attr]
    document = json.loads(read_ref(kube, NAMESPACE, again.result.ref, first.spec.idempotency_key).text)  # type: ignore[arg-type]
    assert [row["key"] for row in document["items"]] == [row["key"] for row in _items_of(kube, first)]
    assert [item_error_of(row["result"]) for row in document["items"]] == [None, None, None]
    assert again.cost > first.current_status.cost, "the rerun's call is paid on top of the first attempt"


def _items_of(kube: FakeKube, shard: Shard) -> list[dict[str, Any]]:
    ref = shard.current_status.result.ref  # type: ignore[union-attr]
    return json.loads(read_ref(kube, NAMESPACE, ref, shard.spec.idempotency_key).text)["items"]  # type: ignore[arg-type,no-any-return]
