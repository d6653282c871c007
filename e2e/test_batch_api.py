"""The OpenAI Batch API served by shardops, driven by the official `openai` package exactly as a user
writes it (`files.create`, `batches.create`, `retrieve`, `files.content`, `cancel`) against the
loopback test upstream: every output line keyed by custom_id, its body parsed by the client's own
`ChatCompletion`; request_counts match the upstream's log; cancel stops claiming; a token of one
namespace gets 404 for another's batch and file; no token or a bad one gets 401."""

from __future__ import annotations

import json
import os
import shlex
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.harness import create_namespace, wait_for
from testbed.kits import chart as chartkit
from testbed.kits.batchapi import BatchApi, batch_api_running, tenant_token
from testbed.kits.scheduler import Operator
from testbed.upstream import Behaviour, LlmServer, batch_line, chat_body, llm_server

from e2e.test_llm_worker import API_KEY, SECRET, secret
from shardops.api.common import JSON
from shardops.k8s.api import CAMPAIGNS, SHARDS

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

SOURCE_NAME = "batch-llm"
LINES = 120
REFUSED = frozenset({7, 60, 119})


def _source(base_url: str, model: str) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Source",
        "metadata": {"name": SOURCE_NAME},
        "spec": {
            "baseUrl": base_url,
            "model": model,
            "apiKeySecret": {"name": SECRET, "key": "api-key"},
        },
    }


def _requests(path: Path, count: int, refused: frozenset[int] = frozenset()) -> Path:
    with path.open("w") as handle:
        for n in range(count):
            line = batch_line(f"task-{n}", chat_body("FAULT:400" if n in refused else f"question {n}"))
            handle.write(json.dumps(line) + "\n")
    return path


def _openai(base_url: str, token: str) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key=token, max_retries=0)


@dataclass
class Served:
    """The upstream, the service and a tenant's token of the test's namespace, on one installation."""

    server: LlmServer
    service: BatchApi
    operator: Operator
    token: str

    def start(self, path: Path) -> Any:
        """Upload `path` and create its batch (the client's two calls), as the tenant."""
        client = _openai(self.service.base_url, self.token)
        uploaded = client.files.create(file=open(path, "rb"), purpose="batch")  # noqa: SIM115
        return client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


@contextmanager
def batch_api_over(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    base_url: str,
    model: str = "test-model",
    tenants: tuple[str, ...] = (),
    shard_size: int = 10,
    max_concurrency: int = 2,
) -> Iterator[tuple[BatchApi, Operator, str]]:
    """The operator and the Batch API (serving the test's namespace and `tenants`) on the S3 store
    under a prefix of the test's own, with the Source every batch goes through: the upstream at
    `base_url` serving `model`, called with API_KEY. Yields them and a tenant's token."""
    env = bed.s3_store_env(object_store, f"e2e-{uuid.uuid4().hex[:8]}")
    secret(bed.kube, bed.namespace, SECRET, API_KEY)
    token = tenant_token(bed.cluster, bed.namespace, "batch-user")
    with (
        bed.operator(env=env) as operator,
        batch_api_running(
            bed.cluster,
            bed.namespace,
            [bed.namespace, *tenants],
            source=("Source", SOURCE_NAME),
            store_env=env,
            shard_size=shard_size,
            max_concurrency=max_concurrency,
        ) as service,
    ):
        bed.kube.request(
            "POST",
            f"/apis/shardops.dev/v1alpha1/namespaces/{bed.namespace}/sources",
            body=_source(base_url, model),
        )
        yield service, operator, token


@contextmanager
def served(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    behaviour: Behaviour,
    tenants: tuple[str, ...] = (),
    shard_size: int = 10,
    max_concurrency: int = 2,
) -> Iterator[Served]:
    """batch_api_over the test upstream."""
    with (
        llm_server(behaviour) as server,
        batch_api_over(
            bed,
            object_store,
            server.base_url,
            tenants=tenants,
            shard_size=shard_size,
            max_concurrency=max_concurrency,
        ) as (service, operator, token),
    ):
        yield Served(server, service, operator, token)


def test_the_openai_client_round_trip_and_a_token_never_reaches_another_namespace(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    import openai
    from openai.types.chat import ChatCompletion

    kube = bed.kube
    other = create_namespace(bed.cluster)
    token_b = tenant_token(bed.cluster, other, "batch-user")
    with served(bed, object_store, Behaviour(api_key=API_KEY), (other,)) as up:
        server, service, token_a = up.server, up.service, up.token
        # --- as a user writes it -----------------------------------------------------------------
        client = openai.OpenAI(base_url=service.base_url, api_key=token_a)
        batch_input_file = client.files.create(
            file=open(_requests(tmp_path / "requests.jsonl", LINES, REFUSED), "rb"),  # noqa: SIM115 (as OpenAI's guide writes it)
            purpose="batch",
        )
        batch = client.batches.create(
            input_file_id=batch_input_file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"description": "nightly eval job"},
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(2)
            batch = client.batches.retrieve(batch.id)
        output = client.files.content(batch.output_file_id).text
        errors = client.files.content(batch.error_file_id).text
        # ----------------------------------------------------------------------------------------
        log = server.requests()
        campaign = kube.get(CAMPAIGNS, bed.namespace, batch.id)

        # Another namespace's token: 404 for this batch and its files, never 403; its list is empty.
        client_b = _openai(service.base_url, token_b)
        for call in (
            lambda: client_b.batches.retrieve(batch.id),
            lambda: client_b.batches.cancel(batch.id),
            lambda: client_b.files.retrieve(batch_input_file.id),
            lambda: client_b.files.content(batch_input_file.id),
            lambda: client_b.files.content(batch.output_file_id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert client_b.batches.list().data == []
        # A forged token, and a real token of an account that may not create Campaigns: 401; and
        # no token at all (the client refuses to send none, so a bare request).
        no_rights = tenant_token(bed.cluster, bed.namespace, "reader", may_create_campaigns=False)
        for token in ("forged-token", no_rights):
            with pytest.raises(openai.AuthenticationError):
                _openai(service.base_url, token).batches.retrieve(batch.id)
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(f"{service.base_url}/batches/{batch.id}")
        assert no_token.value.code == 401
        assert json.loads(no_token.value.read())["error"]["type"] == "invalid_authentication"

    assert batch.status == "completed", batch
    assert campaign["status"]["phase"] == "Succeeded" and campaign["status"]["counts"]["failed"] == 0
    assert campaign["spec"]["sources"][0]["sourceRef"] == {"kind": "Source", "name": SOURCE_NAME}
    written = [json.loads(text) for text in output.splitlines()]
    refused = [json.loads(text) for text in errors.splitlines()]
    assert sorted(line["custom_id"] for line in written) == sorted(
        f"task-{n}" for n in range(LINES) if n not in REFUSED
    )
    assert sorted(line["custom_id"] for line in refused) == sorted(f"task-{n}" for n in REFUSED)
    for line in written:
        completion = ChatCompletion.model_validate(line["response"]["body"])
        question = "question " + line["custom_id"].removeprefix("task-")
        assert completion.choices[0].message.content == f"answer: {question[::-1]}"
    assert all(line["response"]["status_code"] == 400 for line in refused)
    # request_counts are the upstream's log: one call per line, 200 or 400.
    counts = batch.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (
        len(log),
        sum(1 for e in log if e.status == 200),
        sum(1 for e in log if e.status == 400),
    )
    assert (counts.total, counts.failed) == (LINES, len(REFUSED))


def test_cancel_mid_run_stops_claiming(bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path) -> None:
    lines = 400
    with served(bed, object_store, Behaviour(api_key=API_KEY, latency_seconds=0.2)) as up:
        server, client = up.server, _openai(up.service.base_url, up.token)
        batch = up.start(_requests(tmp_path / "r.jsonl", lines))
        wait_for("the first answers", lambda: len(server.requests()) >= 20, timeout=180)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        final = wait_for(
            "the running shards to finish",
            lambda: (b := client.batches.retrieve(batch.id)).status == "cancelled" and b,
            timeout=180,
        )
        settled = len(server.requests())
        # Said cancelled: no shard of it runs or can be claimed any more (the rest are Paused).
        phases = [(s.get("status") or {}).get("phase") for s in bed.kube.list(SHARDS, bed.namespace)]
        time.sleep(10)  # a window in which a claim would show as new requests
        after = len(server.requests())
        campaign = bed.kube.get(CAMPAIGNS, bed.namespace, batch.id)

    assert "Running" not in phases and "Pending" not in phases, phases
    assert after == settled < lines, (settled, after)
    assert (
        campaign["spec"]["suspend"] is True and campaign["metadata"]["annotations"]["shardops.dev/cancelled"]
    )
    assert final.request_counts is not None and final.request_counts.completed <= settled
    print(f"\ncancelled after {settled} of {lines} requests; none after it settled")


def test_a_batch_completes_across_a_restart_of_the_service(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    """The service holds nothing of a batch (the Campaign and the store do): its pod deleted mid-run,
    the new one answers for the same batch, which completes with one upstream call per custom_id."""
    from collections import Counter

    lines = 200
    with served(bed, object_store, Behaviour(api_key=API_KEY, latency_seconds=0.05)) as up:
        server, service, client = up.server, up.service, _openai(up.service.base_url, up.token)
        batch = up.start(_requests(tmp_path / "r.jsonl", lines))
        wait_for("the first answers", lambda: len(server.requests()) >= 10, timeout=180)
        (old,) = [p.metadata.name for p in service.pods()]
        bed.cluster.kubectl("delete", "pod", old, "-n", bed.namespace, "--wait=true")
        wait_for(
            "a new Batch API pod to answer",
            lambda: [p.metadata.name for p in service.pods()] not in ([], [old]) and service.healthy(),
            timeout=120,
        )
        assert len(server.requests()) < lines, "the restart happened mid-run"
        done = wait_for(
            "the batch to complete",
            lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
            timeout=300,
        )
        output = client.files.content(done.output_file_id).text
        log = server.requests()

    written = [json.loads(text) for text in output.splitlines()]
    assert sorted(line["custom_id"] for line in written) == sorted(f"task-{n}" for n in range(lines))
    calls = Counter(entry.content for entry in log)
    assert len(log) == lines and max(calls.values()) == 1, "one upstream call per custom_id"
    assert done.request_counts is not None and done.request_counts.completed == lines


# The upload measurement's lines: 100,000 (18 MiB) unless asked for more, to show the figure is flat.
UPLOAD_LINES = int(os.environ.get("SHARDOPS_E2E_UPLOAD_LINES", "100000"))
# What an upload may add to the service's peak RSS whatever its lines. Measured (2 shared cores):
# +27 MiB at 100,000 lines (18 MiB, 3 parts), +41 MiB at 300,000 (55 MiB), +42 MiB at 600,000
# (110 MiB): flat once the transfer has its parts in flight (the check alone adds 4 MiB at 100,000
# or 300,000). Before the check spilled to disk: +41 MiB at 100,000, ~120 B more a line.
UPLOAD_RSS_BOUND = 48 * 2**20


@pytest.mark.long
def test_a_hundred_thousand_lines_go_through_the_service_in_bounded_memory(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    """A 100,000-line batch file (18 MiB; SHARDOPS_E2E_UPLOAD_LINES on request) uploaded through the
    service and read back. Reading it back streams pages of lines: the peak RSS does not move. The
    upload is checked in chunks and spooled to disk, its custom_ids past the first
    CUSTOM_IDS_IN_MEMORY in a SQLite file beside it, and the S3 transfer holds UPLOAD_PARTS_IN_FLIGHT
    parts: what it adds to the RSS is a constant, whatever the lines. Figures in the output."""
    lines = UPLOAD_LINES
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    env = bed.s3_store_env(object_store, prefix)
    token = tenant_token(bed.cluster, bed.namespace, "batch-user")
    requests = _requests(tmp_path / "big.jsonl", lines)
    size = requests.stat().st_size
    with batch_api_running(
        bed.cluster, bed.namespace, [bed.namespace], source=("Source", SOURCE_NAME), store_env=env
    ) as service:
        client = _openai(service.base_url, token)
        # A small file first: the S3 clients (boto3's transfer manager) are loaded once, not per file.
        small = client.files.create(file=open(_requests(tmp_path / "small.jsonl", 10), "rb"), purpose="batch")  # noqa: SIM115
        client.files.content(small.id).read()
        _, warm = service.memory_kib()
        started = time.monotonic()
        uploaded = client.files.create(file=open(requests, "rb"), purpose="batch")  # noqa: SIM115
        upload_seconds = time.monotonic() - started
        _, peak_upload = service.memory_kib()
        started = time.monotonic()
        content = client.files.content(uploaded.id).read()
        download_seconds = time.monotonic() - started
        rss_after, peak = service.memory_kib()

    assert content == requests.read_bytes()
    print(
        f"\n{lines} lines ({size / 2**20:.1f} MiB): service peak RSS {warm / 1024:.0f} MiB warm, "
        f"{peak_upload / 1024:.0f} MiB after the upload ({upload_seconds:.1f} s), "
        f"{peak / 1024:.0f} MiB after reading it back ({download_seconds:.1f} s); "
        f"RSS {rss_after / 1024:.0f} MiB at the end"
    )
    assert (peak - peak_upload) * 1024 < 8 * 2**20, "reading a file back holds one page of lines at a time"
    # What an upload holds: the duplicate check's dict up to CUSTOM_IDS_IN_MEMORY ids (~1.2 MB) then
    # SQLite's page cache (SPILL_CACHE_KIB), and boto3's parts (two of 8 MiB waiting, one read); the
    # bytes go to the spool on disk. So a constant, reached at a few parts (UPLOAD_RSS_BOUND).
    assert (peak_upload - warm) * 1024 < UPLOAD_RSS_BOUND, "an upload's memory does not grow with its lines"


DOC = Path(__file__).resolve().parents[1] / "docs" / "openai-batch.md"


def documented_token_commands(namespace: str) -> list[list[str]]:
    """The kubectl commands of docs/openai-batch.md's "Who may call it", for `namespace` (the docs
    say team-a), without the prompt and the final `> token.txt`."""
    section = DOC.read_text(encoding="utf-8").split("### Who may call it", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line.removeprefix("$ ").replace("team-a", namespace))
        commands.append(words[1 : words.index(">")] if ">" in words else words[1:])
    return commands


def test_the_documented_commands_give_an_api_key(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    """docs/openai-batch.md's three commands, run as printed (in the test's namespace): the token
    they give is an API key the service takes, because `edit` may create Campaigns there."""
    env = bed.s3_store_env(object_store, f"e2e-{uuid.uuid4().hex[:8]}")
    aggregate = chartkit.render(
        bed.namespace, chartkit.local_values(bed.namespace), show_only=["templates/rbac-aggregate.yaml"]
    )
    chartkit.apply_objects(bed.cluster, aggregate)
    try:
        *setup, token_command = documented_token_commands(bed.namespace)
        assert [c[:2] for c in setup] == [["-n", bed.namespace]] * 2 and token_command[2:4] == [
            "create",
            "token",
        ]
        for command in setup:
            bed.cluster.kubectl(*command)
        with batch_api_running(
            bed.cluster, bed.namespace, [bed.namespace], source=("Source", SOURCE_NAME), store_env=env
        ) as service:

            def accepted() -> bool:
                token = bed.cluster.kubectl(*token_command).stdout.strip()
                try:
                    _openai(service.base_url, token).batches.list()
                except Exception:  # 401 until edit has aggregated the chart's Campaign rules
                    return False
                return True

            wait_for("the documented token to be accepted", accepted, timeout=90)
    finally:
        chartkit.delete_cluster_scoped(bed.cluster, aggregate)


# The restart test's size: what `make test` runs (the properties are the same at any size), and the
# measurement's 100,000 on request.
BATCH_LINES = int(os.environ.get("SHARDOPS_E2E_BATCH_LINES", "10000"))


@pytest.mark.long
def test_a_large_batch_completes_across_operator_and_service_restarts(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    """A batch of BATCH_LINES lines (10,000 in `make test`; the issue's 100,000 with
    SHARDOPS_E2E_BATCH_LINES=100000, about 17 minutes): the operator's and the service's pods deleted
    mid-run, the batch completes, every custom_id answered once (the upstream's log: nothing paid
    twice), and the service streams the output file with its peak RSS measured."""
    from collections import Counter

    lines = BATCH_LINES
    with served(bed, object_store, Behaviour(api_key=API_KEY), shard_size=500, max_concurrency=5) as up:
        server, service, client = up.server, up.service, _openai(up.service.base_url, up.token)
        started = time.monotonic()
        batch = up.start(_requests(tmp_path / "big.jsonl", lines))
        wait_for(
            "a fifth of the answers", lambda: len(server.requests()) >= lines // 5, timeout=900, interval=2
        )
        for pod in up.operator.pods():
            bed.cluster.kubectl("delete", "pod", str(pod.metadata.name), "-n", bed.namespace, "--wait=true")
        (old,) = [str(p.metadata.name) for p in service.pods()]
        bed.cluster.kubectl("delete", "pod", old, "-n", bed.namespace, "--wait=true")
        restarted_at = len(server.requests())
        wait_for("a new Batch API pod", lambda: service.pods() and service.healthy(), timeout=120)
        done = wait_for(
            "the batch to complete",
            lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
            timeout=1800,
            interval=5,
        )
        elapsed = time.monotonic() - started
        _, before = service.memory_kib()
        output = client.files.content(done.output_file_id).text
        _, peak = service.memory_kib()
        log = server.requests()

    custom_ids = [json.loads(text)["custom_id"] for text in output.splitlines()]
    assert len(custom_ids) == lines and len(set(custom_ids)) == lines
    calls = Counter(entry.content for entry in log)
    assert len(log) == lines and max(calls.values()) == 1, "one upstream call per custom_id"
    assert done.request_counts is not None and (
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (
        lines,
        0,
    )
    print(
        f"\n{lines} lines: completed in {elapsed:.0f} s, restarts after {restarted_at} answers; output file "
        f"({len(output) / 2**20:.1f} MiB) streamed with the service's peak RSS {before / 1024:.0f} -> "
        f"{peak / 1024:.0f} MiB"
    )
