"""The Batch API's handlers driven by the `openai` package as a user writes it, over the in-memory
fakes: upload, create, retrieve, list, cancel, download; 404 across namespaces, 401 without a
tenant, a duplicate custom_id refused naming its line."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from testbed.upstream import batch_line

from shardops.api.enums import ErrorClass
from shardops.api.item_errors import errored_result
from shardops.api.names import CANCELLED_ANNOTATION
from shardops.api.openai_batch import batch_result
from shardops.batchapi import objects
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.logic.idempotency import item_subkey
from shardops.store.records import ResultMeta, encode_result
from tests.batchapikit import INSTALLATION, FakeReviews, Running, batch_api
from tests.clikit import chat_completion, done_status, shard_body
from tests.fakekube import FakeKube

TEAM_A, TEAM_B = "team-a", "team-b"
TOKENS = {"tok-a": f"system:serviceaccount:{TEAM_A}:batch", "tok-b": f"system:serviceaccount:{TEAM_B}:batch"}
LINES = [batch_line(f"task-{i}", {"model": "m", "n": i}) for i in range(3)]


@pytest.fixture
def service() -> Iterator[Running]:
    reviews = FakeReviews(TOKENS, {(TOKENS["tok-a"], TEAM_A), (TOKENS["tok-b"], TEAM_B)})
    with batch_api(FakeKube(), reviews, (TEAM_A, TEAM_B)) as running:
        yield running


def _client(service: Running, token: str = "tok-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=service.base_url, api_key=token, max_retries=0)


def _requests(tmp_path: Path, lines: list[dict[str, Any]] = LINES) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _finish(service: Running, name: str) -> None:
    """What the operator and workers leave of a finished batch: two Done shards (size 2) whose
    stored results answer task-0 and task-2 and refuse task-1 (400), the campaign Succeeded."""
    refused = {"error": {"message": "bad request", "type": "invalid_request_error", "code": "bad_param"}}
    answers = [
        batch_result(200, "up-0", chat_completion("zero")),
        errored_result(
            ErrorClass.INVALID_INPUT, "item 1: 400 bad request", "bad_param", batch_result(400, None, refused)
        ),
        batch_result(200, "up-2", chat_completion("two")),
    ]
    store = service.store(TEAM_A)
    for index, (start, end) in enumerate(((0, 2), (2, 3))):
        shard = shard_body(name, index, "Done", namespace=TEAM_A, status=done_status(60))
        items = LINES[start:end]
        shard["spec"].update(items=items, itemRange={"start": start, "end": end})
        key = shard["spec"]["idempotencyKey"]
        text = encode_result(
            key, [(p, item_subkey(item), answers[start + p]) for p, item in enumerate(items)]
        )
        stored, _ = store.store_result(
            key, text, ResultMeta(name, shard["metadata"]["name"], "w-1", 1, 1), len(items)
        )
        store.commit(key, stored)
        shard["status"]["result"] = {
            "ref": stored.name,
            "fingerprint": stored.fingerprint,
            "bytes": stored.bytes,
        }
        service.kube.add(SHARDS, shard)
    body = copy.deepcopy(service.kube.get(CAMPAIGNS, TEAM_A, name))
    body["status"] = {
        "phase": "Succeeded",
        "itemsTotal": 3,
        "itemsErrored": 1,
        "counts": {"done": 2, "total": 2},
        "resultStore": INSTALLATION.model_dump(by_alias=True, exclude_none=True),
    }
    service.kube.add(CAMPAIGNS, body)


def test_the_openai_client_round_trip(service: Running, tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletion

    client = _client(service)
    uploaded = client.files.create(file=open(_requests(tmp_path), "rb"), purpose="batch")  # noqa: SIM115
    assert uploaded.id.startswith("file-") and uploaded.filename == "requests.jsonl"
    assert client.files.retrieve(uploaded.id).bytes == _requests(tmp_path).stat().st_size
    # Stored in the caller's namespace's area, under the content's digest.
    (key,) = [k for k in service.s3.objects if "/inputs/" in k]
    assert key.startswith(f"shardops/{TEAM_A}/inputs/") and key.endswith(
        uploaded.id[len("file-") :] + ".jsonl"
    )
    assert client.files.content(uploaded.id).text == _requests(tmp_path).read_text()

    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert (batch.status, batch.metadata) == ("validating", {"run": "nightly"})
    campaign = service.kube.get(CAMPAIGNS, TEAM_A, batch.id)
    assert campaign["spec"]["itemsFrom"]["object"] == {"key": key, "bucket": "results"}
    assert campaign["spec"]["worker"]["llm"]["format"] == "openai-batch"

    _finish(service, batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id and done.error_file_id
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 2, 1)

    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["task-0", "task-2"]
    contents = [
        ChatCompletion.model_validate(line["response"]["body"]).choices[0].message.content for line in output
    ]
    assert contents == ["zero", "two"]
    (error,) = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert error["custom_id"] == "task-1" and error["error"]["code"] == "bad_param"
    assert error["response"]["status_code"] == 400

    listed = client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [batch.id] and not listed.has_more


def test_another_namespaces_batch_and_file_are_404_and_no_tenant_is_401(
    service: Running, tmp_path: Path
) -> None:
    client = _client(service)
    uploaded = client.files.create(file=open(_requests(tmp_path), "rb"), purpose="batch")  # noqa: SIM115
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    other = _client(service, "tok-b")
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):  # its input is not a file of team-b either
        other.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert other.batches.list().data == []
    with pytest.raises(openai.AuthenticationError):
        _client(service, "forged").batches.retrieve(batch.id)
    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(f"{service.base_url}/batches/{batch.id}")  # no Authorization header
    assert no_token.value.code == 401
    assert json.loads(no_token.value.read())["error"]["type"] == "invalid_authentication"


def test_a_repeated_custom_id_is_refused_naming_the_line_and_nothing_is_stored(
    service: Running, tmp_path: Path
) -> None:
    lines = [*LINES, {**LINES[0], "body": {"model": "m"}}]
    with pytest.raises(openai.BadRequestError) as refused:
        _client(service).files.create(file=open(_requests(tmp_path, lines), "rb"), purpose="batch")  # noqa: SIM115
    assert "line 4: custom_id 'task-0' is already the custom_id of line 1" in str(refused.value)
    assert not any("/inputs/" in key for key in service.s3.objects)


def test_cancel_records_the_cancel_as_kubectl_campaign_cancel_does(service: Running, tmp_path: Path) -> None:
    client = _client(service)
    uploaded = client.files.create(file=open(_requests(tmp_path), "rb"), purpose="batch")  # noqa: SIM115
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    body = copy.deepcopy(service.kube.get(CAMPAIGNS, TEAM_A, batch.id))
    body["status"] = {"phase": "Running", "itemsTotal": 3, "counts": {"running": 1, "total": 2}}
    service.kube.add(CAMPAIGNS, body)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling"
    campaign = service.kube.get(CAMPAIGNS, TEAM_A, batch.id)
    assert campaign["spec"]["suspend"] is True
    assert campaign["metadata"]["annotations"][CANCELLED_ANNOTATION] == "2026-03-01T12:00:00Z"
    assert objects.BATCH_LABEL in campaign["metadata"]["labels"]


DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-batch.md"
DOCUMENTED_BASE_URL = '"http://shardops-batch-api.shardops-system.svc/v1"'


def test_the_documented_client_code_runs_as_written(
    service: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/openai-batch.md's client code, run as it is printed but for its base_url (the test's
    loopback service): token.txt and requests.jsonl are read from the working directory."""
    import threading
    import time

    text = DOC.read_text(encoding="utf-8").split("## 4. Keep your client code", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert DOCUMENTED_BASE_URL in code
    monkeypatch.chdir(tmp_path)
    (tmp_path / "token.txt").write_text("tok-a\n")
    _requests(tmp_path)
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda _: real_sleep(0.05))  # the poll, without its 10 s waits

    def operator() -> None:
        """Finish the batch as soon as the service created its Campaign."""
        for _ in range(400):
            created = service.kube.list(CAMPAIGNS, TEAM_A)
            if created:
                _finish(service, created[0]["metadata"]["name"])
                return
            real_sleep(0.05)

    finisher = threading.Thread(target=operator)
    finisher.start()
    namespace: dict[str, Any] = {}
    exec(compile(code.replace(DOCUMENTED_BASE_URL, repr(service.base_url)), str(DOC), "exec"), namespace)
    finisher.join()
    assert namespace["batch"].status == "completed"
    assert [json.loads(line)["custom_id"] for line in namespace["output"].splitlines()] == [
        "task-0",
        "task-2",
    ]
    assert [json.loads(line)["custom_id"] for line in namespace["errors"].splitlines()] == ["task-1"]


def test_an_upload_over_the_items_object_limit_is_refused_as_it_streams(
    service: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardops.batchapi import files

    monkeypatch.setattr(files, "MAX_UPLOAD_BYTES", 200)
    with pytest.raises(openai.APIStatusError) as refused:
        _client(service).files.create(file=open(_requests(tmp_path), "rb"), purpose="batch")  # noqa: SIM115
    assert refused.value.status_code == 413 and "over 200 bytes" in str(refused.value)
    assert not any("/inputs/" in key for key in service.s3.objects)


def test_a_shard_folded_while_the_output_file_is_read_keeps_its_lines(
    service: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator folds a finished batch's shards after it is completed: it records them in the
    Campaign's status, then deletes them. A fold between the service's read of the Campaign and its
    list of Shards must not lose the folded shard's lines (they are read from the ledger)."""
    from shardops.api.folded import FoldedShards
    from shardops.api.shard import Shard
    from shardops.state import ledger

    client = _client(service)
    uploaded = client.files.create(file=open(_requests(tmp_path), "rb"), purpose="batch")  # noqa: SIM115
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _finish(service, batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.output_file_id

    def fold_first_shard() -> None:
        (first,) = [
            Shard.parse(body) for body in service.kube.list(SHARDS, TEAM_A) if body["spec"]["index"] == 0
        ]
        body = copy.deepcopy(service.kube.get(CAMPAIGNS, TEAM_A, batch.id))
        service.store(TEAM_A).write_ledger(batch.id, body["metadata"]["uid"], 1, [ledger.record(first)])
        body["status"]["folded"] = ledger.fold(FoldedShards(), [first]).model_dump(
            by_alias=True, exclude_none=True
        )
        service.kube.add(CAMPAIGNS, body)
        service.kube.delete(SHARDS, TEAM_A, first.name)

    listed = service.kube.list
    folds = [fold_first_shard]

    def list_after_a_fold(resource: Any, *args: Any, **kwargs: Any) -> Any:
        if resource == SHARDS and folds:
            folds.pop()()
        return listed(resource, *args, **kwargs)

    monkeypatch.setattr(service.kube, "list", list_after_a_fold)
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert not folds, "the fold ran"
    assert [line["custom_id"] for line in output] == ["task-0", "task-2"]
