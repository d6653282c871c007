"""`kubectl campaign results` over the in-memory API (ConfigMap store): item order, the line shape,
--failed with the shard's lastError and the items not yet cut, --format openai, -o FILE."""

from __future__ import annotations

import json
from pathlib import Path

from shardops.api.enums import ErrorClass
from shardops.api.item_errors import errored_result
from shardops.api.openai_batch import batch_result
from shardops.k8s.api import CONFIGMAPS
from shardops.logic.idempotency import item_subkey
from shardops.state.results import json_line
from shardops.store.configmap import attempt_body, attempt_name
from shardops.store.records import ResultMeta, encode_result, sha256_of
from tests.clikit import campaign_body, chat_completion, cluster, done_status, run, shard_body


def _campaign_with_results() -> tuple[object, list[dict[str, object]]]:
    items = [{"n": i, "custom_id": f"c{i}"} for i in range(4)]
    body = campaign_body(items=0, status={"phase": "Running"})
    body["spec"]["items"] = items
    shards = []
    for index in range(3):
        phase = ["Done", "Failed", "Pending"][index]
        status = done_status(60) if phase == "Done" else {}
        shard = shard_body("papers", index, phase, status=status)
        shard["spec"]["items"] = [items[index]]
        if phase == "Failed":
            shard["status"]["lastError"] = {
                "class": "invalid-input",
                "message": "bad item",
                "at": "2026-01-01T00:00:00Z",
            }
        shards.append(shard)
    key = shards[0]["spec"]["idempotencyKey"]
    text = encode_result(key, [(0, item_subkey(items[0]), {"answer": "a0"})], {item_subkey(items[0]): 0.5})
    configmap = attempt_body(key, text, ResultMeta("papers", "papers-00000", "w-1", 1, 3), 1)
    configmap["metadata"]["namespace"] = "ns"
    shards[0]["status"]["result"] = {
        "ref": attempt_name(key, 3),
        "fingerprint": sha256_of(text),
        "bytes": len(text),
    }
    kube = cluster(body, *shards)
    kube.create(CONFIGMAPS, "ns", configmap)
    return kube, items


def test_done_items_in_order_with_their_shard_attempt_and_cost() -> None:
    kube, items = _campaign_with_results()
    answer = run(kube, "-n", "ns", "results", "papers")  # type: ignore[arg-type]
    assert answer.code == 0, answer.err
    assert [json.loads(line) for line in answer.out.splitlines()] == [
        {
            "index": 0,
            "key": item_subkey(items[0]),
            "item": items[0],
            "result": {"answer": "a0"},
            "cost": "0.5",
            "shard": "papers-00000",
            "attempt": 1,
        }
    ]


def test_failed_lists_every_item_not_done_with_its_reason_and_the_uncut_ones() -> None:
    kube, items = _campaign_with_results()
    answer = run(kube, "-n", "ns", "results", "papers", "--failed")  # type: ignore[arg-type]
    lines = [json.loads(line) for line in answer.out.splitlines()]
    assert [(line["index"], line["shard"], line["phase"]) for line in lines] == [
        (1, "papers-00001", "Failed"),
        (2, "papers-00002", "Pending"),
        (3, None, "Uncut"),
    ]
    assert lines[0]["lastError"]["class"] == "invalid-input" and lines[0]["item"] == items[1]


def test_openai_format_takes_custom_id_from_the_named_field(tmp_path: Path) -> None:
    kube, _ = _campaign_with_results()
    target = tmp_path / "out.jsonl"
    answer = run(kube, "-n", "ns", "results", "papers", "--format", "openai", "-o", str(target))  # type: ignore[arg-type]
    assert answer.code == 0 and answer.out == ""
    (line,) = [json.loads(text) for text in target.read_text().splitlines()]
    assert (
        line["custom_id"] == "c0" and line["response"]["body"] == {"answer": "a0"} and line["error"] is None
    )
    missing = run(kube, "-n", "ns", "results", "papers", "--format", "openai", "--custom-id", "id")  # type: ignore[arg-type]
    assert missing.code == 1 and "has no field 'id'" in missing.err and "--custom-id" in missing.err


def test_an_output_format_is_refused_with_what_o_means_here() -> None:
    kube, _ = _campaign_with_results()
    answer = run(kube, "-o", "json", "results", "papers")  # type: ignore[arg-type]
    assert answer.code == 2 and "writes JSONL" in answer.err


def test_a_result_line_holds_line_and_paragraph_separators_escaped_so_no_line_reader_splits_it() -> None:
    item = {"text": "one\u2028two\u2029three", "emoji": "🧪", "cjk": "中文"}
    line = json_line({"index": 0, "item": item})
    assert line.splitlines() == [line], "one line for every line reader"
    assert "\\u2028" in line and "\\u2029" in line and "🧪" in line and "中文" in line
    assert json.loads(line)["item"] == item


def test_failed_lists_the_items_of_gave_up_shards_folded_into_the_ledger() -> None:
    """Folded Failed/Blocked shards are gone from the API: `--failed` streams them from the ledger,
    each folded index once (a repeated segment), never a Done line or an index no longer folded."""
    from shardops.api.folded import FoldedShards, IndexRange
    from shardops.cli.campaign_results import folded_failed_lines

    items = [{"id": i} for i in range(8)]
    error = {"class": "invalid-input", "message": "not JSON"}
    ledger_lines = [
        {"index": 0, "shard": "c-00000", "phase": "Done", "itemRange": {"start": 0, "end": 2}},
        {
            "index": 1,
            "shard": "c-00001",
            "phase": "Failed",
            "itemRange": {"start": 2, "end": 4},
            "lastError": error,
        },
        {
            "index": 1,
            "shard": "c-00001",
            "phase": "Failed",
            "itemRange": {"start": 2, "end": 4},
            "lastError": error,
        },
        {
            "index": 2,
            "shard": "c-00002",
            "phase": "Blocked",
            "itemRange": {"start": 4, "end": 6},
            "attempt": 2,
        },
        {"index": 3, "shard": "c-00003", "phase": "Failed", "itemRange": {"start": 6, "end": 8}},
    ]
    folded = FoldedShards(shards=1, failed=1, blocked=1, done_ranges=[IndexRange(start=0, end=3)])
    lines = list(folded_failed_lines(iter(ledger_lines), folded, lambda: items))
    assert [(line["index"], line["phase"], line["shard"]) for line in lines] == [
        (2, "Failed", "c-00001"),
        (3, "Failed", "c-00001"),
        (4, "Blocked", "c-00002"),
        (5, "Blocked", "c-00002"),
    ]
    assert lines[0]["lastError"] == error and lines[0]["item"] == {"id": 2} and lines[2]["attempt"] == 2


def _batch_campaign() -> object:
    """Three OpenAI batch lines, each its own Done shard: two answered, the middle one refused (400)."""
    items = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
        for i in range(3)
    ]
    llm = {"baseUrl": "http://upstream/v1", "model": "test-model", "format": "openai-batch"}
    body = campaign_body(items=0, status={"phase": "Succeeded", "itemsErrored": 1})
    body["spec"]["items"] = items
    body["spec"]["worker"] = {"image": "shardops:dev", "command": ["shardops", "llm"], "llm": llm}
    refused = {
        "error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    results = [
        batch_result(200, "up-0", chat_completion("zero")),
        errored_result(
            ErrorClass.INVALID_INPUT,
            "item 0: 400 too long",
            "context_length_exceeded",
            batch_result(400, "up-1", refused),
        ),
        batch_result(200, None, chat_completion("two")),
    ]
    kube_objects: list[dict[str, object]] = []
    configmaps = []
    for index, (item, result) in enumerate(zip(items, results, strict=True)):
        shard = shard_body("papers", index, "Done", status=done_status(60))
        shard["spec"]["items"] = [item]
        key = shard["spec"]["idempotencyKey"]
        text = encode_result(key, [(0, item_subkey(item), result)], {item_subkey(item): 0})
        configmap = attempt_body(key, text, ResultMeta("papers", shard["metadata"]["name"], "w-1", 1, 3), 1)
        configmap["metadata"]["namespace"] = "ns"
        configmaps.append(configmap)
        shard["status"]["result"] = {
            "ref": attempt_name(key, 3),
            "fingerprint": sha256_of(text),
            "bytes": len(text),
        }
        kube_objects.append(shard)
    kube = cluster(body, *kube_objects)
    for configmap in configmaps:
        kube.create(CONFIGMAPS, "ns", configmap)
    return kube


def test_openai_batch_results_are_openais_output_and_error_files(tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletion

    kube = _batch_campaign()
    output, errors = tmp_path / "output.jsonl", tmp_path / "errors.jsonl"
    answer = run(
        kube,
        "-n",
        "ns",
        "results",
        "papers",
        "--format",
        "openai",
        "-o",
        str(output),
        "--error-file",
        str(errors),
    )  # type: ignore[arg-type]
    assert answer.code == 0, answer.err
    written = [json.loads(text) for text in output.read_text().splitlines()]
    assert [line["custom_id"] for line in written] == ["req-0", "req-2"]
    assert all(
        set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None for line in written
    )
    assert [line["response"]["status_code"] for line in written] == [200, 200]
    # The upstream's request id when it sent one, else shardops' key of the item.
    assert written[0]["response"]["request_id"] == "up-0" and written[1]["response"]["request_id"]
    bodies = [ChatCompletion.model_validate(line["response"]["body"]) for line in written]
    assert [b.choices[0].message.content for b in bodies] == ["zero", "two"]
    (error,) = [json.loads(text) for text in errors.read_text().splitlines()]
    assert error["custom_id"] == "req-1"
    assert error["error"] == {"code": "context_length_exceeded", "message": "item 0: 400 too long"}
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_an_errored_item_shows_its_error_in_results_and_in_failed() -> None:
    kube = _batch_campaign()
    lines = [json.loads(text) for text in run(kube, "-n", "ns", "results", "papers").out.splitlines()]  # type: ignore[arg-type]
    assert ["error" in line for line in lines] == [False, True, False]
    assert lines[1]["error"]["class"] == "invalid-input" and lines[1]["result"]["statusCode"] == 400
    failed = [
        json.loads(text) for text in run(kube, "-n", "ns", "results", "papers", "--failed").out.splitlines()
    ]  # type: ignore[arg-type]
    assert [(line["index"], line["phase"], line["lastError"]["code"]) for line in failed] == [
        (1, "Done", "context_length_exceeded")
    ]


def test_status_says_how_many_items_errored_and_where_to_find_them() -> None:
    answer = run(_batch_campaign(), "-n", "ns", "status", "papers")  # type: ignore[arg-type]
    assert answer.code == 0, answer.err
    assert "(1 errored: kubectl campaign results --failed)" in answer.out
