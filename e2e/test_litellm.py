"""shardops against a server no one here wrote: an OpenAI batch file through the Batch API, driven
by the official `openai` client, with the LiteLLM proxy (testbed/litellm, the version pinned there)
as the upstream, serving a mocked model. Every output line's body parses as the client's own
`ChatCompletion` with the mocked answer, one line per custom_id; the lines LiteLLM refuses (400)
land in the error file and the rest complete. Skipped, naming why, where LiteLLM cannot be
installed (no PyPI); under CI=true that fails instead."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.harness import wait_for
from testbed.litellm.proxy import LiteLlmProxy, LiteLlmUnavailable, installed, litellm_proxy
from testbed.upstream import batch_line

from e2e.test_batch_api import batch_api_over
from e2e.test_llm_worker import API_KEY
from shardops.k8s.api import CAMPAIGNS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

LINES = 48
REFUSED = frozenset({5, 31})
MOCKED = "A mocked answer from LiteLLM."


@pytest.fixture(scope="module")
def litellm_bin() -> Path:
    try:
        return installed()
    except LiteLlmUnavailable as why:
        if os.environ.get("CI"):
            pytest.fail(f"LiteLLM must run in CI (PyPI is reachable there): {why}")
        pytest.skip(f"LiteLLM is not installed here: {why}")


@pytest.fixture
def litellm(litellm_bin: Path, tmp_path: Path) -> Iterator[LiteLlmProxy]:
    with litellm_proxy(litellm_bin, tmp_path / "litellm", api_key=API_KEY, mock_response=MOCKED) as proxy:
        yield proxy


def _requests(path: Path) -> Path:
    with path.open("w") as handle:
        for n in range(LINES):
            body: dict[str, object] = {"model": "gpt-4o-mini", "max_tokens": 16}
            if n in REFUSED:
                # A completions body on the chat endpoint: LiteLLM answers 400 ("Missing required
                # parameter: 'messages'") before its mocked model is asked; the mock answers anything else.
                body["prompt"] = f"question {n}"
            else:
                body["messages"] = [{"role": "user", "content": f"question {n}"}]
            line = batch_line(f"task-{n}", body)
            handle.write(json.dumps(line) + "\n")
    return path


def _answered(log: Path) -> list[int]:
    """The status of every chat completion LiteLLM answered, from its access log."""
    pattern = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" (\d{3})')
    return [int(m.group(1)) for m in pattern.finditer(log.read_text(errors="replace"))]


def test_a_batch_through_a_litellm_proxy(
    bed: Bed, object_store: lifecycle.ObjectStore, litellm: LiteLlmProxy, tmp_path: Path
) -> None:
    import openai
    from openai.types.chat import ChatCompletion

    with batch_api_over(bed, object_store, litellm.base_url, litellm.model) as (service, _, token):
        client = openai.OpenAI(base_url=service.base_url, api_key=token)
        with _requests(tmp_path / "requests.jsonl").open("rb") as requests:
            uploaded = client.files.create(file=requests, purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        final: Any = wait_for(
            "the batch to end",
            lambda: (
                (b := client.batches.retrieve(batch.id)).status
                in ("completed", "failed", "expired", "cancelled")
                and b
            ),
            timeout=240,
            interval=1,
        )
        output = client.files.content(final.output_file_id).text if final.output_file_id else ""
        errors = client.files.content(final.error_file_id).text if final.error_file_id else ""
        campaign = bed.kube.get(CAMPAIGNS, bed.namespace, batch.id)
    answered = _answered(litellm.log)

    assert final.status == "completed", final
    assert campaign["status"]["phase"] == "Succeeded" and campaign["status"]["counts"]["failed"] == 0
    written = [json.loads(text) for text in output.splitlines()]
    refused = [json.loads(text) for text in errors.splitlines()]
    assert sorted(line["custom_id"] for line in written) == sorted(
        f"task-{n}" for n in range(LINES) if n not in REFUSED
    )
    for line in written:
        assert line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.choices[0].message.content == MOCKED
    assert sorted(line["custom_id"] for line in refused) == sorted(f"task-{n}" for n in REFUSED)
    assert all(line["response"]["status_code"] == 400 for line in refused), refused
    # LiteLLM's own log: one call per line, each answered once (nothing retried or sent twice).
    assert sorted(answered) == sorted([200] * (LINES - len(REFUSED)) + [400] * len(REFUSED)), answered
    counts = final.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (
        LINES,
        LINES - len(REFUSED),
        len(REFUSED),
    )
    print(
        f"\nLiteLLM answered {answered.count(200)}, refused {answered.count(400)}: {refused[0]['response']}"
    )
