"""The built-in LLM worker end to end: campaigns of `shardops llm` under the operator (worker Jobs on
the process-kubelet, API keys from Secrets) against the OpenAI-compatible loopback test upstream
(testbed/upstream.py). What is asserted comes from the upstream's request log and the objects on the
API server, not from the worker's own account."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.harness import wait_for
from testbed.kits.worker import attempt_configmaps
from testbed.upstream import ANSWER_SCHEMA_FORMAT, Behaviour, LoggedRequest, batch_line, chat_body, llm_server

from e2e.test_cli_campaign import kc
from shardops.api.common import JSON
from shardops.api.llm import ModelPrice
from shardops.k8s.api import Kube
from shardops.logic.timefmt import parse_rfc3339

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

SOURCE = "test-llm"
SECRET = "llm-key"
API_KEY = "sk-test-e2e"
PRICE = {"model": "test-model", "inputPerMillion": 2.5, "cachedInputPerMillion": 1.25, "outputPerMillion": 10}
# Items of the Retry-After run; the issue's figure is 500 (SHARDOPS_E2E_LLM_ITEMS=500), the default
# keeps this file near a minute on a shared 2-core machine.
ITEMS = int(os.environ.get("SHARDOPS_E2E_LLM_ITEMS", "120"))
RETRY_AFTER = 2.0
# How long after a 429 was recorded a worker that listed the shards just before may still write its
# claim of a shard of the same source: a Lease create, a read and a status patch.
CLAIM_SLACK = 2.0
# A request of another slot of the pod, sent before the 429's slot wrote the pod's hold: the 429's
# way back, a file write, and the other request's way there, on a loaded 2-core machine.
IN_FLIGHT_SLACK = 0.5
USER_AGENT_POD = re.compile(r"\((?P<pod>[^)]+)\)$")


def secret(kube: Kube, namespace: str, name: str, value: str) -> None:
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {"api-key": base64.b64encode(value.encode()).decode()},
        },
    )


def llm_campaign(name: str, items: list[JSON], base_url: str, llm: JSON | None = None, **spec: Any) -> JSON:
    block: JSON = {
        "baseUrl": base_url,
        "apiKeySecret": {"name": SECRET},
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You answer in one line."},
            {"role": "user", "content": "{{ item.q }}"},
        ],
        "timeoutSeconds": 10,
        **(llm or {}),
    }
    worker = {
        "image": "shardops:e2e",
        "command": ["shardops", "llm"],
        "env": [{"name": "SHARDOPS_POLL_SECONDS", "value": "0.5"}],
        "llm": block,
    }
    defaults: JSON = {
        "shardSize": 1,
        "sources": [{"name": SOURCE, "breakerThreshold": 20}],
        "defaultSource": SOURCE,
        "backoff": {"baseSeconds": 0.5, "capSeconds": 1},
    }
    return Bed.campaign_body(name, items, worker=worker, **{**defaults, **spec})


def price_of(entry: LoggedRequest) -> Decimal:
    return ModelPrice.model_validate(PRICE).cost(
        entry.prompt_tokens, entry.cached_tokens, entry.completion_tokens
    )


def pod_of(entry: LoggedRequest) -> str:
    match = USER_AGENT_POD.search(entry.user_agent)
    assert match, entry.user_agent
    return match["pod"]


def last_error(shard: JSON) -> JSON:
    return (shard.get("status") or {}).get("lastError") or {}


def by_item(shards: list[JSON]) -> dict[str, JSON]:
    return {shard["spec"]["items"][0]["q"]: shard for shard in shards}


@pytest.mark.long
def test_429s_are_waited_out_all_done_and_spent_is_tokens_times_price(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    behaviour = Behaviour(
        api_key=API_KEY, rate_limited_share=0.1, retry_after=f"{RETRY_AFTER:g}", cached_tokens=2
    )
    items = [{"q": f"question {n}: what is {n} squared?"} for n in range(ITEMS)]
    with llm_server(behaviour) as server, bed.operator():
        body = llm_campaign(
            "retry-after",
            items,
            server.base_url,
            llm={"prices": [PRICE]},
            maxConcurrency=6,
            maxAttempts=8,
            budget={"limit": 1000},
        )
        bed.create_campaign(body)
        done = bed.wait_phase("retry-after", {"Succeeded", "Completed"}, timeout=600)
        log = server.requests()

    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["counts"]["done"] == ITEMS

    limited = [e for e in log if e.status == 429]
    answered = [e for e in log if e.status == 200]
    assert limited, "the upstream answered no 429: the test proves nothing"
    assert {e.status for e in log} == {200, 429}
    # Every item answered once, except where a 429 made the shard retry (then it is asked again).
    assert sorted({e.content for e in answered}) == sorted(i["q"] for i in items)

    # No request before the Retry-After elapsed: not for the item that got the 429 (its shard's
    # notBefore), and not from the pod that got it (its pace, kept across shards, and held for all
    # its slots: the LLM worker runs 8 a pod by default). Another slot's request already on its way
    # when the 429 came back (it had looked at the pod's hold before the 429's slot wrote it) reaches
    # the upstream within IN_FLIGHT_SLACK of the 429.
    early = []
    for rejected in limited:
        until = rejected.monotonic + RETRY_AFTER
        for later in log:
            if not rejected.monotonic < later.monotonic < until:
                continue
            in_flight = later.monotonic < rejected.monotonic + IN_FLIGHT_SLACK
            if later.content == rejected.content or (pod_of(later) == pod_of(rejected) and not in_flight):
                early.append((rejected, later))
    assert not early, f"{len(early)} request(s) inside a Retry-After, first: {early[0]}"

    # Source level: after a 429 the campaign's other workers leave the source alone too. A worker
    # learns of another's 429 when it lists the shards before its next claim (the failing shard's
    # lastError.retryAt); so a request of another pod inside a Retry-After can only come from a shard
    # whose claim began before the 429 was recorded. Its claim write then lands at most the list-to-
    # claim time (a Lease create, a read and a status patch) after the record: CLAIM_SLACK bounds it.
    shards = {s["spec"]["items"][0]["q"]: s for s in bed.shards()}
    assert len(shards) == ITEMS

    def entries(q: str, reason: str) -> list[float]:
        history = shards[q]["status"]["history"]
        return [parse_rfc3339(h["at"]).timestamp() for h in history if h["reason"] == reason]

    cross, lags = 0, []
    for rejected in limited:
        recorded = min(t for t in entries(rejected.content, "AttemptFailed") if t >= rejected.wall - 0.01)
        for later in log:
            if not (rejected.wall < later.wall < rejected.wall + RETRY_AFTER):
                continue
            if later.content == rejected.content or pod_of(later) == pod_of(rejected):
                continue
            cross += 1
            claimed = max(t for t in entries(later.content, "Claimed") if t <= later.wall + 0.01)
            lags.append(claimed - recorded)
    late = [lag for lag in lags if lag > CLAIM_SLACK]
    assert not late, f"claims of a cooling source {late} s after the 429 was recorded"

    # Spent is the tokens of every answered request times the price, exactly (decimals, no rounding).
    expected = sum((price_of(e) for e in answered), Decimal(0))
    assert Decimal(status["spent"]) == expected, (status["spent"], expected)
    # Tokens: the campaign's status.tokens are the usage of every answered request, exactly.
    tokens = {
        "input": sum(e.prompt_tokens for e in answered),
        "cachedInput": sum(e.cached_tokens for e in answered),
        "output": sum(e.completion_tokens for e in answered),
    }
    assert status["tokens"] == tokens, (status["tokens"], tokens)
    retried = defaultdict(int)
    for e in limited:
        retried[e.content] += 1
    print(
        f"\n{ITEMS} items, {len(log)} requests: {len(limited)} answered 429 (Retry-After {RETRY_AFTER:g}s, "
        f"{len(retried)} items retried), spent {status['spent']} = sum of tokens x price "
        f"{expected:.6f}; tokens {tokens}; {len({pod_of(e) for e in log})} worker pods; "
        f"{cross} request(s) of other pods inside a Retry-After, all from claims begun before the 429 "
        f"was recorded (claim - record: max {max(lags, default=0):.2f} s, bound {CLAIM_SLACK:g} s)"
    )


def test_refused_keys_bad_requests_and_json_schema_mode(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    secret(kube, bed.namespace, "revoked-key", "sk-revoked")
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        revoked = llm_campaign(
            "revoked", [{"q": "hello"}], server.base_url, llm={"apiKeySecret": {"name": "revoked-key"}}
        )
        bad = llm_campaign(
            "bad-requests", [{"q": "FAULT:400"}, {"q": "FAULT:context"}, {"q": "fine"}], server.base_url
        )
        structured = llm_campaign(
            "structured",
            [{"q": "two words"}, {"q": "FAULT:schema"}],
            server.base_url,
            llm={"responseFormat": ANSWER_SCHEMA_FORMAT},
        )
        for body in (revoked, bad, structured):
            bed.create_campaign(body)
        for name in ("revoked", "bad-requests", "structured"):
            bed.wait_phase(name, {"Succeeded", "Completed"}, timeout=240)
        refused = [e for e in server.requests() if e.status == 401]

    shards = bed.shards()
    of = defaultdict(list)
    for shard in shards:
        of[shard["spec"]["campaign"]].append(shard)

    # 401: Failed at once (one attempt), class unauthorized, the message names the Secret.
    (key_shard,) = of["revoked"]
    assert (
        bed.reasons(key_shard)[-2:] == ["Claimed", "Failed"] and bed.reasons(key_shard).count("Claimed") == 1
    )
    error = last_error(key_shard)
    assert error["class"] == "unauthorized" and error["source"] == SOURCE
    assert "Secret revoked-key key api-key" in error["message"], error
    assert len(refused) == 1

    # 400: that item's own error (invalid input, the provider's message); its shard is Done with the
    # item counted as errored, and so is the good item's.
    bad_shards = by_item(of["bad-requests"])
    for q, phrase in (
        ("FAULT:400", "Invalid value for 'temperature': too hot"),
        ("FAULT:context", "maximum context length is 8 tokens"),
    ):
        error = last_error(bad_shards[q])
        assert bad_shards[q]["status"]["phase"] == "Done"
        assert bad_shards[q]["status"]["progress"]["errored"] == 1
        assert error["class"] == "invalid-input" and phrase in error["message"], error
    assert bad_shards["fine"]["status"]["phase"] == "Done"
    assert "errored" not in bad_shards["fine"]["status"]["progress"]

    # JSON schema mode: the result holds the parsed JSON; a reply off the schema is bad-output.
    structured_shards = by_item(of["structured"])
    assert structured_shards["two words"]["status"]["phase"] == "Done"
    ref = structured_shards["two words"]["status"]["result"]["ref"]
    stored = next(c for c in attempt_configmaps(kube, bed.namespace) if c["metadata"]["name"] == ref)
    result = json.loads(stored["data"]["result.json"])["items"][0]["result"]
    assert result["json"] == {"answer": "answer: sdrow owt", "words": 2}
    off_schema = structured_shards["FAULT:schema"]
    assert off_schema["status"]["phase"] == "Done" and off_schema["status"]["progress"]["errored"] == 1
    error = last_error(off_schema)
    assert error["class"] == "bad-output"
    assert "does not match responseFormat's JSON schema" in error["message"], error
    assert bed.get_campaign("structured")["status"]["itemsErrored"] == 1


def test_a_source_that_stays_rate_limited_opens_its_breaker_and_its_shards_use_the_fallback(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    limited = Behaviour(api_key=API_KEY, rate_limited_share=1.0, retry_after="1")
    with (
        llm_server(limited) as flooded,
        llm_server(Behaviour(api_key=API_KEY)) as steady,
        bed.operator(),
    ):
        body = llm_campaign(
            "fallback",
            [{"q": f"question {n}"} for n in range(6)],
            steady.base_url,
            llm={"sources": [{"name": "flooded", "baseUrl": flooded.base_url, "model": "test-small"}]},
            sources=[
                {"name": "flooded", "fallback": SOURCE, "breakerThreshold": 2, "cooldownSeconds": 600},
                {"name": SOURCE},
            ],
            defaultSource="flooded",
            maxConcurrency=2,
            maxAttempts=6,
        )
        bed.create_campaign(body)
        done = bed.wait_phase("fallback", {"Succeeded", "Completed"}, timeout=240)
        flooded_log, steady_log = flooded.requests(), steady.requests()

    breakers = {b["source"]: b for b in done["status"].get("breakers") or []}
    assert breakers["flooded"]["state"] == "Open", breakers
    assert done["status"]["phase"] == "Succeeded"
    shards = bed.shards()
    assert all(s["status"]["phase"] == "Done" and s["status"]["source"] == SOURCE for s in shards)
    assert {e.status for e in flooded_log} == {429} and {e.model for e in flooded_log} == {"test-small"}
    assert sorted(e.content for e in steady_log if e.status == 200) == sorted(
        f"question {n}" for n in range(6)
    )
    print(
        f"\nbreaker opened after {len(flooded_log)} request(s) answered 429 by the flooded source; "
        f"{len(steady_log)} answered by the fallback"
    )


RPM = 120
RATE_WORKERS = 6
# Each worker spaces its requests 60 * RATE_WORKERS / RPM = 3 s apart and at most RATE_WORKERS run at
# once, so N requests take at least (N - RATE_WORKERS) * 60 / RPM seconds: 144 items are at least
# 69 s of traffic, more than one full 60 s window (the first minute, with every worker at its pace,
# is the one that tests the limit; more traffic after it only adds waiting).
RATE_ITEMS = int(os.environ.get("SHARDOPS_E2E_LLM_RATE_ITEMS", "144"))
# Small shards, so every worker stays busy to the end and each runs several in a row: its pace
# continues from one shard's `shardops llm` process to the next.
RATE_SHARD_SIZE = 4


def most_in_a_window(times: list[float], window: float, weights: list[int] | None = None) -> int:
    """The most requests (or, with `weights`, the most of their weights: tokens) in any `window`
    seconds, each window starting at a request: the maximum is always reached at one."""
    points = sorted(zip(times, weights or [1] * len(times), strict=True))
    best, end, inside = 0, 0, 0
    for start, (at, _) in enumerate(points):
        while end < len(points) and points[end][0] < at + window:
            inside += points[end][1]
            end += 1
        best = max(best, inside)
        inside -= points[start][1]
    return best


@pytest.mark.long
def test_a_rate_limit_holds_across_all_the_campaigns_workers(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        body = llm_campaign(
            "paced",
            [{"q": f"question {n}"} for n in range(RATE_ITEMS)],
            server.base_url,
            shardSize=RATE_SHARD_SIZE,
            maxConcurrency=RATE_WORKERS,
            sources=[{"name": SOURCE, "rateLimit": {"requestsPerMinute": RPM}}],
        )
        bed.create_campaign(body)
        done = bed.wait_phase("paced", {"Succeeded", "Completed"}, timeout=600)
        log = server.requests()

    assert done["status"]["phase"] == "Succeeded"
    times = [e.monotonic for e in log]
    span = max(times) - min(times)
    assert span > 60, f"only {span:.0f} s of traffic: no full minute to measure"
    peak = most_in_a_window(times, 60.0)
    pods = {pod_of(e) for e in log}
    print(
        f"\nrateLimit {RPM}/min, maxConcurrency {RATE_WORKERS}: {len(log)} requests over {span:.0f} s "
        f"from {len(pods)} pods; most in any 60 s window {peak} (limit + 10 % = {RPM * 1.1:.0f}); "
        f"average {len(log) / span * 60:.0f}/min"
    )
    assert peak <= RPM * 1.1, peak


def test_a_template_field_no_item_has_holds_the_campaign_at_the_error_threshold(bed: Bed) -> None:
    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    items = [{"id": n, "text": f"text {n}"} for n in range(30)]
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        body = llm_campaign(
            "broken-template",
            items,
            server.base_url,
            llm={"messages": [{"role": "user", "content": "Answer: {{ item.question }}"}], "prices": [PRICE]},
            maxConcurrency=3,
            backlogRatio=1,
            budget={"limit": 10},
        )
        bed.create_campaign(body)

        def held() -> JSON | None:
            status = bed.get_campaign("broken-template").get("status") or {}
            found = next((c for c in status.get("conditions") or [] if c["type"] == "ErrorThreshold"), None)
            return found if found is not None and found["status"] == "True" else None

        threshold = bed.wait_for("the error threshold to hold the campaign", held, timeout=180)
        # Running shards finish; then nothing moves.
        bed.wait_for(
            "running shards to finish",
            lambda: not [s for s in bed.shards() if s["status"].get("phase") == "Running"],
            timeout=60,
        )
        campaign = bed.wait_phase("broken-template", {"Suspended"}, timeout=60)
        phases = [s["status"].get("phase") for s in bed.shards()]
        requests = server.requests()

        def all_counted() -> JSON | None:
            # Done shards fold (their Shards go), so the campaign's counts are the ones that hold them
            # all; each shard is one item, and each of those errored.
            status = bed.get_campaign("broken-template")["status"]
            return status if status.get("itemsErrored") == status["counts"]["done"] else None

        counted = bed.wait_for("every Done shard counted as errored", all_counted, timeout=30)

    # Only the operator cuts shards, and never more than the window (maxConcurrency running plus
    # backlogRatio x running Pending); the pass that finds the fifth failure in a row cuts nothing and
    # pauses the Pending ones. So at most the four failures the pass before it saw, plus the window
    # it left, ran: however fast the workers fail them. Each item failed on its own (its shard Done,
    # every item errored), which the threshold counts as a failure.
    failed = counted["counts"]["done"]
    assert 5 <= failed <= (5 - 1) + 3 * (1 + 1), phases
    # Nothing claimable is left (the shards not yet run are Paused, if the workers left any), and the
    # rest of the items were never cut.
    assert set(phases) <= {"Done", "Paused"}, phases
    assert counted["counts"]["done"] + phases.count("Paused") < len(items)
    for phrase in (
        "failures in a row (errorThreshold.consecutive 5)",
        "invalid-input",
        "'question'",
        "kubectl campaign resume",
    ):
        assert phrase in threshold["message"], threshold["message"]
    assert requests == [] and Decimal(campaign["status"]["spent"]) == 0  # nothing was sent, nothing spent
    print(f"\nheld after {failed} errored shard(s) of {len(items)}: {threshold['message'][:160]}")


# Lines of the OpenAI batch run: the issue's figure, about a minute on a shared 2-core machine.
BATCH_LINES = int(os.environ.get("SHARDOPS_E2E_BATCH_LINES", "2000"))
# 40 shards whatever the lines: a shard's claim and command start cost more than its 50 requests.
BATCH_SHARD_SIZE = max(BATCH_LINES // 40, 1)
REFUSED = {7, BATCH_LINES // 2, BATCH_LINES - 1}


def test_an_openai_batch_file_runs_as_is_and_three_refused_lines_are_its_errors(
    bed: Bed, tmp_path: Path
) -> None:
    """OpenAI batch input lines as items: the answered lines come back as OpenAI's output file with the
    upstream's own bodies (parsed by the openai package's types), the three the upstream refuses (400)
    as its error file; every shard Done, none Failed, one request per line."""
    from openai.types.chat import ChatCompletion

    kube = bed.kube
    secret(kube, bed.namespace, SECRET, API_KEY)
    lines = [
        batch_line(f"task-{n}", chat_body(f"FAULT:400 question {n}" if n in REFUSED else f"question {n}"))
        for n in range(BATCH_LINES)
    ]
    with llm_server(Behaviour(api_key=API_KEY)) as server, bed.operator():
        body = llm_campaign(
            "batch",
            lines,
            server.base_url,
            llm={"format": "openai-batch"},
            shardSize=BATCH_SHARD_SIZE,
            maxConcurrency=4,
        )
        del body["spec"]["worker"]["llm"]["messages"]  # each line's body is its request
        bed.create_campaign(body)
        done = bed.wait_phase("batch", {"Succeeded", "Completed"}, timeout=300)
        log = server.requests()
        output, errors = tmp_path / "output.jsonl", tmp_path / "errors.jsonl"
        answer = openai_results(bed, output, errors)
        # The upstream fixed, `retry --errored` runs the three refused lines again, and only them.
        server.behaviour.faults_fixed = True
        asked = kc(bed.cluster, "retry", "batch", "--errored", "-n", bed.namespace)
        assert asked.returncode == 0, asked.stderr[-2000:]
        retried = wait_for(
            "the errored lines' retry to finish",
            lambda: (
                (c := bed.get_campaign("batch"))["status"].get("lastRetryGeneration") == 1
                and c["status"]["phase"] == "Succeeded"
                and not c["status"].get("itemsErrored")
                and c
            ),
            timeout=180,
        )
        rerun = server.requests()[len(log) :]
        output_after, errors_after = tmp_path / "output-after.jsonl", tmp_path / "errors-after.jsonl"
        answer_after = openai_results(bed, output_after, errors_after)

    status = done["status"]
    shards = -(-BATCH_LINES // BATCH_SHARD_SIZE)
    assert status["phase"] == "Succeeded", status
    assert (status["counts"]["done"], status["counts"]["failed"], status["counts"]["blocked"]) == (
        shards,
        0,
        0,
    )
    assert status["itemsErrored"] == len(REFUSED)
    # One request per line, each sent with the source's model.
    assert len(log) == BATCH_LINES and {e.model for e in log} == {"test-model"}
    assert sorted(e.content for e in log if e.status == 400) == sorted(
        f"FAULT:400 question {n}" for n in REFUSED
    )

    assert answer.returncode == 0, answer.stderr[-2000:]
    written = [json.loads(text) for text in output.read_text().splitlines()]
    refused = [json.loads(text) for text in errors.read_text().splitlines()]
    assert len(written) == BATCH_LINES - len(REFUSED) and len(refused) == len(REFUSED)
    assert {line["custom_id"] for line in refused} == {f"task-{n}" for n in REFUSED}
    assert {line["custom_id"] for line in written} == {
        f"task-{n}" for n in range(BATCH_LINES) if n not in REFUSED
    }
    for line in written:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"].startswith("req-")
        completion = ChatCompletion.model_validate(line["response"]["body"])
        question = "question " + line["custom_id"].removeprefix("task-")
        assert completion.choices[0].message.content == f"answer: {question[::-1]}"
    for line in refused:
        assert line["error"]["code"] == "invalid_value" and "too hot" in line["error"]["message"]
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["code"] == "invalid_value"
    print(
        f"\n{BATCH_LINES} OpenAI batch lines in {shards} shards: {len(written)} output lines, "
        f"{len(refused)} error lines, {len(log)} upstream requests"
    )

    # retry --errored: exactly the three refused lines were requested again (the upstream's log, by
    # their bodies), and the results are the 1,997 answers kept as they were plus the three the
    # upstream now gives, no error line; the campaign's counts and spent exact.
    assert sorted(e.content for e in rerun) == sorted(f"FAULT:400 question {n}" for n in REFUSED), [
        e.content for e in rerun
    ]
    assert {e.status for e in rerun} == {200}
    assert answer_after.returncode == 0, answer_after.stderr[-2000:]
    after = [json.loads(text) for text in output_after.read_text().splitlines()]
    assert len(after) == BATCH_LINES and not errors_after.read_text().strip()
    kept = [line for line in after if line["custom_id"] not in {f"task-{n}" for n in REFUSED}]
    assert sorted(kept, key=lambda line: line["custom_id"]) == sorted(
        written, key=lambda line: line["custom_id"]
    )
    answered = {line["custom_id"]: line for line in after if line not in kept}
    assert set(answered) == {f"task-{n}" for n in REFUSED}
    for custom_id, line in answered.items():
        assert line["error"] is None and line["response"]["status_code"] == 200
        content = ChatCompletion.model_validate(line["response"]["body"]).choices[0].message.content
        assert content == f"answer: {('FAULT:400 question ' + custom_id.removeprefix('task-'))[::-1]}"
    assert (retried["status"]["counts"]["done"], retried["status"]["counts"]["failed"]) == (shards, 0)
    assert Decimal(str(retried["status"]["spent"])) > Decimal(str(status["spent"])), (
        "the three calls are paid"
    )
    print(
        f"retry --errored: {len(rerun)} upstream requests ({', '.join(sorted(answered))}), "
        f"{len(kept)} + {len(answered)} output lines, 0 error lines"
    )


def openai_results(bed: Bed, output: Path, errors: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl campaign results batch --format openai`: OpenAI's output and error files."""
    return kc(
        bed.cluster,
        "results",
        "batch",
        "-n",
        bed.namespace,
        "--format",
        "openai",
        "-o",
        str(output),
        "--error-file",
        str(errors),
    )
