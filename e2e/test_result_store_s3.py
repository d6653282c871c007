"""Results in the S3 store (the local SeaweedFS, or the one SHARDOPS_S3_* names), end to end through
the operator, its worker Jobs and the real API server: no result ConfigMaps, every Done shard's
result an object that verifies, reuse on re-apply, a store outage mid-campaign, and the errors a
campaign gets before it spends anything when its store cannot hold or reach its results."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.harness import Cluster

from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, SHARDS, NotFound
from shardops.state import ledger
from shardops.store.configmap import PREFIXES
from shardops.store.records import sha256_of, store_label
from shardops_example_agent.agent import answer

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

FINISHED = {"Succeeded", "Completed", "Paused"}


@pytest.fixture
def prefix() -> str:
    """Each test's own key prefix in the shared bucket."""
    return f"e2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_operator_env(bed: Bed, object_store: lifecycle.ObjectStore, prefix: str) -> dict[str, str]:
    return bed.s3_store_env(object_store, prefix)


def _objects(s3: Any, bucket: str, prefix: str) -> list[str]:
    names: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        names.extend(entry["Key"] for entry in page.get("Contents") or [])
    return names


def _result_configmaps(bed: Bed) -> list[str]:
    return [
        c["metadata"]["name"]
        for c in bed.kube.list(CONFIGMAPS, bed.namespace)
        if c["metadata"]["name"].startswith(PREFIXES)
    ]


def _done_shards(bed: Bed, name: str, object_store: lifecycle.ObjectStore) -> dict[int, dict[str, Any]]:
    """Every Done work shard by index, as a ledger record: the folded ones from the campaign's
    ledger in the bucket, the live ones from their Shard objects (each index from one place only)."""
    if (bed.get_campaign(name).get("status") or {}).get("resultStore") is None:
        return {}  # not yet recorded: nothing ran
    shards = [Shard.parse(body) for body in bed.campaign_shards(name, object_store)]
    done = [s for s in shards if s.phase is ShardPhase.DONE]
    indices = [s.spec.index for s in done]
    assert len(indices) == len(set(indices)), "each Done shard once: folded or live, never both"
    return {s.spec.index: ledger.record(s) for s in done}


def _agent_pids(cluster: Cluster, namespace: str, campaign: str) -> list[int]:
    """The example agent processes the campaign's running worker pods have started (the
    process-kubelet runs each container as a local process: its pid is the containerID)."""
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"shardops.dev/campaign={campaign}"
    )
    found = []
    for pod in pods.items:  # at most the campaign's maxConcurrency
        for status in pod.status.container_statuses or []:
            if not (status.state and status.state.running and status.container_id):
                continue
            worker = status.container_id.removeprefix("process://")
            for task in Path(f"/proc/{worker}/task").glob("*/children"):
                for child in task.read_text().split():
                    with contextlib.suppress(OSError):
                        if b"shardops-example-agent" in Path(f"/proc/{child}/cmdline").read_bytes():
                            found.append(int(child))
    return found


def _live(kube: Any, namespace: str, shard: str) -> bool:
    try:
        kube.get(SHARDS, namespace, shard)
    except NotFound:
        return False
    return True


def _completions(record: dict[str, Any]) -> int:
    return [entry["reason"] for entry in record["history"]].count("Completed")


def _ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_results_live_in_s3_verify_and_are_reused_on_reapply(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    prefix: str,
    tmp_path: Path,
) -> None:
    kube = bed.kube
    s3 = object_store.client()
    ledger = tmp_path / "ledger.jsonl"
    items = [{"n": i} for i in range(24)]
    body = bed.campaign_body(
        "s3res",
        items,
        shardSize=3,
        maxConcurrency=4,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.05, "SHARDOPS_AGENT_LEDGER": ledger},
    )
    with bed.operator(env=s3_operator_env):
        bed.create_campaign(body)
        final = bed.wait_phase("s3res", FINISHED, timeout=240)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        store = final["status"]["resultStore"]
        assert store == {
            "type": "S3",
            "endpoint": object_store.endpoint,
            "region": object_store.region,
            "bucket": object_store.bucket,
            "prefix": prefix,
            "credentialsSecret": bed.STORE_SECRET,
        }
        assert _result_configmaps(bed) == [], "no result in etcd"

        done = _done_shards(bed, "s3res", object_store)
        assert sorted(done) == list(range(8))
        assert final["status"]["counts"]["done"] == 8
        root = f"{prefix}/{bed.namespace}/"
        objects = set(_objects(s3, object_store.bucket, root))
        for shard in done.values():
            result = shard["result"]
            # The Done write names this claim's object, and the bytes are what it says.
            assert result["ref"].startswith(f"{root}attempts/"), result
            data = s3.get_object(Bucket=object_store.bucket, Key=result["ref"])["Body"].read()
            assert sha256_of(data) == result["fingerprint"] and len(data) == result["bytes"]
            document = json.loads(data)
            assert document["idempotencyKey"] == shard["idempotencyKey"]
            assert [entry["index"] for entry in document["items"]] == [0, 1, 2], document
        first_refs = {index: shard["result"]["ref"] for index, shard in done.items()}
        pointers = sorted(o for o in objects if o.startswith(f"{root}results/"))
        assert len(pointers) == 8, "each key's result is committed for reuse"
        computed = [e for e in _ledger(ledger) if e["event"] == "done"]
        assert len(computed) == len(items)

        # A folded shard's timeline comes from the ledger once its Shard is gone.
        from e2e.test_cli_campaign import kc

        folded = [s["shard"] for s in done.values() if not _live(kube, bed.namespace, s["shard"])]
        if folded:
            timeline = kc(bed.cluster, "events", folded[0], "-n", bed.namespace)
            assert timeline.returncode == 0, timeline.stderr
            assert "Claimed" in timeline.stdout and "Completed" in timeline.stdout, timeline.stdout

        # Re-applied under the same name: every result comes from the store, no command runs.
        kube.delete(CAMPAIGNS, bed.namespace, "s3res")
        bed.wait_for("the campaign to go", lambda: _gone(kube, bed.namespace, "s3res"), timeout=120)
        bed.create_campaign(body)
        again = bed.wait_phase("s3res", FINISHED, timeout=240)
        assert again["status"]["phase"] == "Succeeded", again["status"]
        assert [e for e in _ledger(ledger) if e["event"] == "done"] == computed, "nothing recomputed"
        reused = {i: s["result"]["ref"] for i, s in _done_shards(bed, "s3res", object_store).items()}
        assert reused == first_refs, "each shard's result is the object the first run committed"
        assert _result_configmaps(bed) == []


def _phase(kube: Any, namespace: str, name: str) -> str | None:
    """The Campaign's phase; None when it has none yet or is gone."""
    try:
        return (kube.get(CAMPAIGNS, namespace, name).get("status") or {}).get("phase")
    except NotFound:
        return None


def _gone(kube: Any, namespace: str, name: str) -> bool:
    try:
        kube.get(CAMPAIGNS, namespace, name)
    except NotFound:
        return True
    return False


def test_store_outage_mid_campaign_is_retried_and_every_shard_is_done_once(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
) -> None:
    assert bed.cluster.local is not None
    items = [{"n": i} for i in range(30)]
    body = bed.campaign_body(
        "outage", items, shardSize=2, maxConcurrency=4, worker_env={"SHARDOPS_AGENT_LATENCY": 0.4}
    )
    with bed.operator(env=s3_operator_env):
        bed.create_campaign(body)

        def some_done() -> bool:
            # Counted live and folded: a Done shard may be folded into the ledger and deleted
            # before a list sees it, so live Shard objects alone can stay under three.
            return len(_done_shards(bed, "outage", object_store)) >= 3

        bed.wait_for("a few shards done", some_done, timeout=120)
        bed.cluster.local.restart_object_store()
        final = bed.wait_phase("outage", FINISHED, timeout=300)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        done = _done_shards(bed, "outage", object_store)
        assert sorted(done) == list(range(15))
        assert all(_completions(s) == 1 for s in done.values()), "each shard Done exactly once"
        assert _result_configmaps(bed) == []


def test_configmap_store_refuses_a_campaign_over_its_ceiling_before_cutting_a_shard(bed: Bed) -> None:
    kube = bed.kube
    items = [{"n": i} for i in range(1001)]
    body = bed.campaign_body("toobig", items, shardSize=1, maxConcurrency=2)
    with bed.operator():
        bed.create_campaign(body)

        def refused() -> dict[str, Any] | None:
            ready = bed.condition(kube.get(CAMPAIGNS, bed.namespace, "toobig"), "Ready")
            return ready if ready and ready.get("reason") == "ResultStoreTooSmall" else None

        ready = bed.wait_for("Ready=False ResultStoreTooSmall", refused, timeout=60)
        assert ready["status"] == "False"
        assert "1001 work shards" in ready["message"] and "spec.resultStore.type: S3" in ready["message"]
        assert bed.shards() == [], "nothing is cut"
        assert kube.get(CAMPAIGNS, bed.namespace, "toobig")["status"].get("resultStore") is None


def test_missing_bucket_is_named_before_anything_runs(bed: Bed, s3_operator_env: dict[str, str]) -> None:
    kube = bed.kube
    body = bed.campaign_body("nobucket", [{"n": 1}])
    # The installation's bucket is missing (a campaign may not move its store without its own keys).
    with bed.operator(env={**s3_operator_env, "SHARDOPS_S3_BUCKET": "no-such-bucket-e2e"}):
        bed.create_campaign(body)

        def refused() -> dict[str, Any] | None:
            ready = bed.condition(kube.get(CAMPAIGNS, bed.namespace, "nobucket"), "Ready")
            return ready if ready and ready.get("reason") == "ResultStoreUnavailable" else None

        ready = bed.wait_for("Ready=False ResultStoreUnavailable", refused, timeout=60)
        assert "no-such-bucket-e2e" in ready["message"] and "NoSuchBucket" in ready["message"], ready
        assert bed.shards() == []


def test_results_command_streams_done_items_in_order_while_running_and_after(
    bed: Bed,
    s3_operator_env: dict[str, str],
    object_store: lifecycle.ObjectStore,
    tmp_path: Path,
) -> None:
    from e2e.test_cli_campaign import kc
    from shardops_example_agent.agent import answer

    items: list[dict[str, Any]] = [{"custom_id": f"req-{i}", "n": i} for i in range(16)]
    items[9]["fault"] = "invalid"  # shard 2 (items 8-11) fails for good
    # Shard 3 (items 12-15) hangs at item 13 in its first attempt, so it is still Running however
    # long we look (a latency would end on its own clock, and a slow machine could outlast it); once
    # we have looked, its command is killed and attempt 2 finishes it.
    items[13].update(fault="hang", faultAttempts=[1])
    body = bed.campaign_body(
        "res",
        items,
        shardSize=4,
        maxConcurrency=4,
        backoff={"baseSeconds": 0.5, "capSeconds": 1},
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.02},
    )

    def lines(*args: str) -> list[dict[str, Any]]:
        answer_ = kc(bed.cluster, "results", "res", "-n", bed.namespace, *args)
        assert answer_.returncode == 0, answer_.stderr
        return [json.loads(line) for line in answer_.stdout.splitlines()]

    with bed.operator(env=s3_operator_env):
        bed.create_campaign(body)

        def settled_but_running() -> bool:
            # Done shards may be folded into the ledger already (their Shards deleted).
            phases = {s["metadata"]["name"]: bed.phase_of(s) for s in bed.shards()}
            live = {name: phase for name, phase in phases.items() if phase != "Done"}
            done = _done_shards(bed, "res", object_store)
            return sorted(done) == [0, 1] and live == {"res-00002": "Failed", "res-00003": "Running"}

        bed.wait_for("shards 0-1 Done, 2 Failed, 3 Running", settled_but_running, timeout=120)
        # The user has no AWS_* of their own: the CLI reads the campaign's credentials Secret.
        running = lines()
        assert [line["index"] for line in running] == list(range(8))
        assert [line["item"] for line in running] == items[:8]
        assert all(line["result"]["answer"] == answer(line["item"]) for line in running)
        assert {line["shard"] for line in running} == {"res-00000", "res-00001"}
        assert all(line["attempt"] == 1 and line["cost"] == "0.01" for line in running)

        failed = lines("--failed")
        assert [line["index"] for line in failed] == list(range(8, 16))
        by_shard = {line["shard"]: line for line in failed}
        assert by_shard["res-00002"]["phase"] == "Failed"
        assert by_shard["res-00002"]["lastError"]["class"] == "invalid-input"
        assert by_shard["res-00003"]["phase"] == "Running"

        openai = lines("--format", "openai")
        assert [line["custom_id"] for line in openai] == [f"req-{i}" for i in range(8)]
        assert all(
            set(line) == {"id", "custom_id", "response", "error"}
            and line["response"]["status_code"] == 200
            and line["error"] is None
            and line["response"]["body"]["answer"] == answer(items[int(line["custom_id"][4:])])
            for line in openai
        )

        hung = bed.wait_for(
            "the hung command of shard 3", lambda: _agent_pids(bed.cluster, bed.namespace, "res")
        )
        assert len(hung) == 1, hung
        os.kill(hung[0], signal.SIGKILL)
        final = bed.wait_phase("res", FINISHED | {"Failed"}, timeout=180)
        assert final["status"]["phase"] == "Completed", final["status"]
        target = tmp_path / "results.jsonl"
        assert kc(bed.cluster, "results", "res", "-n", bed.namespace, "-o", str(target)).returncode == 0
        written = [json.loads(line) for line in target.read_text().splitlines()]
        assert [line["index"] for line in written] == [*range(8), *range(12, 16)]
        assert written == lines()
        assert [line["index"] for line in lines("--failed")] == list(range(8, 12))


def test_operator_killed_between_recording_a_fold_and_deleting_its_shards_loses_and_repeats_nothing(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    tmp_path: Path,
) -> None:
    kube = bed.kube
    agent_ledger = tmp_path / "agent.jsonl"
    marker = tmp_path / "failpoint-hit"
    items = [{"n": i} for i in range(30)]
    body = bed.campaign_body(
        "crash",
        items,
        shardSize=1,
        maxConcurrency=4,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.2, "SHARDOPS_AGENT_LEDGER": agent_ledger},
    )
    env = {**s3_operator_env, "SHARDOPS_FAILPOINT": "fold-recorded", "SHARDOPS_FAILPOINT_MARKER": str(marker)}
    with bed.operator(env=env) as operator:
        bed.create_campaign(body)
        bed.wait_for("the operator to die at the failpoint", marker.exists, timeout=120)
        bed.wait_for("the operator pod to restart", lambda: operator.restarts() >= 1, timeout=60)
        final = bed.wait_phase("crash", FINISHED, timeout=300)
        assert final["status"]["phase"] == "Succeeded", final["status"]

        # Every Done shard folds, the ones left over by the killed pass included: no Shard stays.
        def all_folded() -> bool | str:
            left = bed.shards()
            return not left or f"{[(s['metadata']['name'], bed.phase_of(s)) for s in left]}"[:0]

        try:
            bed.wait_for("every shard folded and deleted", all_folded, timeout=60)
        except AssertionError:
            left = [(s["metadata"]["name"], bed.phase_of(s)) for s in bed.shards()]
            folded = kube.get(CAMPAIGNS, bed.namespace, "crash")["status"]["folded"]
            for pod in operator.pods():
                print(operator.log(pod.metadata.name)[-3000:])
            raise AssertionError(f"left: {left}; folded: {folded}") from None
        status = kube.get(CAMPAIGNS, bed.namespace, "crash")["status"]
        assert status["folded"]["shards"] == 30 and status["counts"]["done"] == 30, status
        assert status["folded"]["doneRanges"] == [{"start": 0, "end": 30}]
        assert status["counts"]["total"] == 30 and status["cutShards"] == 30
        done = _done_shards(bed, "crash", object_store)
        assert sorted(done) == list(range(30))
        assert all(_completions(s) == 1 for s in done.values()), "no shard ran twice"
        computed = Counter(e["key"] for e in _ledger(agent_ledger) if e["event"] == "done")
        assert len(computed) == 30 and set(computed.values()) == {1}, "no item computed twice"


def test_a_finished_campaign_is_deleted_after_its_ttl_and_its_results_stay(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    prefix: str,
) -> None:
    kube = bed.kube
    body = bed.campaign_body("ttl", [{"n": i} for i in range(4)], shardSize=2, ttlSecondsAfterFinished=3)
    with bed.operator(env=s3_operator_env):
        bed.create_campaign(body)
        bed.wait_phase("ttl", {"Succeeded"}, timeout=120)
        bed.wait_for(
            "the campaign to be deleted after its TTL", lambda: _gone(kube, bed.namespace, "ttl"), timeout=60
        )
        bed.wait_for("its shards to go with it", lambda: bed.shards() == [], timeout=60)
    pointers = _objects(object_store.client(), object_store.bucket, f"{prefix}/{bed.namespace}/results/")
    assert len(pointers) == 2, "results outlive the campaign"


def test_purge_deletes_the_campaign_then_every_result_it_stored(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    prefix: str,
) -> None:
    from e2e.test_cli_campaign import kc

    kube = bed.kube
    s3 = object_store.client()
    root = f"{prefix}/{bed.namespace}/"
    with bed.operator(env=s3_operator_env):
        bed.create_campaign(bed.campaign_body("gone", [{"n": i} for i in range(6)], shardSize=2))
        bed.wait_phase("gone", {"Succeeded"}, timeout=120)
        assert len(_objects(s3, object_store.bucket, f"{root}results/")) == 3
        dry = kc(bed.cluster, "purge", "gone", "-n", bed.namespace)
        assert dry.returncode == 0 and "nothing was deleted" in dry.stdout
        assert not _gone(kube, bed.namespace, "gone")
        done = kc(bed.cluster, "purge", "gone", "-n", bed.namespace, "--yes")
        assert done.returncode == 0, done.stderr
        assert "3 shard key(s)" in done.stdout, done.stdout
        assert _gone(kube, bed.namespace, "gone")
    left = [o for o in _objects(s3, object_store.bucket, root) if "/attempts/" in o or "/results/" in o]
    assert left == [], left


GONE_RETENTION = 6


def test_results_past_their_retention_go_once_no_campaign_of_that_name_exists(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    prefix: str,
) -> None:
    """Two campaigns with short retentions: the one deleted after its TTL loses every stored object
    (results, item results, ledger) and its retention record at the first sweep after its retention
    passed; the one that still exists keeps everything, however long past its retention."""
    kube = bed.kube
    s3 = object_store.client()
    root = f"{prefix}/{bed.namespace}/"
    # "gone" is deleted 1 s after it finished and its results are kept until GONE_RETENTION s after
    # it finished: a window in which they are seen to outlive the Campaign (with a retention of 1 s
    # the sweep could delete them before the test had seen the Campaign go).
    gone = bed.campaign_body(
        "gone",
        [{"n": i} for i in range(6)],
        shardSize=2,
        ttlSecondsAfterFinished=1,
        resultStore={"retentionSeconds": GONE_RETENTION},
    )
    kept = bed.campaign_body(
        "kept", [{"n": i} for i in range(4)], shardSize=2, resultStore={"retentionSeconds": 1}
    )
    env = {**s3_operator_env, "SHARDOPS_RETENTION_SWEEP_SECONDS": "1"}
    with bed.operator(env=env):
        bed.create_campaign(kept)
        bed.create_campaign(gone)
        bed.wait_phase("kept", {"Succeeded"}, timeout=120)
        kept_done = _done_shards(bed, "kept", object_store)
        kept_labels = {store_label(record["idempotencyKey"]) for record in kept_done.values()}
        # Succeeded, or already deleted by its 1 s TTL, which deletes only a finished campaign: while
        # the test waited for "kept", "gone" may have finished and gone.
        bed.wait_for(
            "the campaign with a TTL to succeed (or to be deleted by its TTL, once finished)",
            lambda: _gone(kube, bed.namespace, "gone") or _phase(kube, bed.namespace, "gone") == "Succeeded",
            timeout=120,
        )
        # Its keys from the bucket, not from the Campaign, which its 1 s TTL may have deleted by now:
        # every key's attempt object is written before its shard's Done write (`attempts/<label>/`),
        # and only the two campaigns write under this test's prefix.
        attempts = f"{root}attempts/"
        gone_labels = {n[len(attempts) :].split("/")[0] for n in _objects(s3, object_store.bucket, attempts)}
        gone_labels -= kept_labels
        assert len(gone_labels) == 3 and len(kept_labels) == 2
        bed.wait_for(
            "the campaign with a TTL to be deleted", lambda: _gone(kube, bed.namespace, "gone"), timeout=60
        )

        def gone_objects() -> list[str]:
            return [
                n for n in _objects(s3, object_store.bucket, root) if any(label in n for label in gone_labels)
            ]

        def records() -> list[str]:
            return _objects(s3, object_store.bucket, f"{prefix}/_retention/{bed.namespace}/")

        assert gone_objects(), "results outlive the Campaign until their retention passed"
        # A sweep deletes a campaign's records last, after everything they name.
        bed.wait_for(
            "the sweep to delete the deleted campaign's results and then its record",
            lambda: not gone_objects() and not [r for r in records() if "/gone/" in r],
            timeout=60,
        )
        # The deleted campaign's record went with its results; the existing one's stays, and so do
        # all its objects although its retention passed long ago.
        assert [r.split("/")[-2] for r in records()] == ["kept"], records()
        left = _objects(s3, object_store.bucket, root)
        assert not [n for n in left if "/ledger/gone-" in n], left
        for label in kept_labels:
            assert f"{root}results/{label}.json" in left, (label, left)
            assert any(n.startswith(f"{root}attempts/{label}/") for n in left), (label, left)


def test_the_finalize_shard_reads_every_result_in_item_order_folded_shards_included(
    bed: Bed,
    object_store: lifecycle.ObjectStore,
    s3_operator_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The closing step's $SHARDOPS_CAMPAIGN_RESULTS_FILE holds one line per item, in item order,
    each the result the agent computed (its ledger), although most shards were folded into the
    ledger and their Shard objects deleted by the time the finalize shard ran."""
    ledger_file, copy = tmp_path / "agent.jsonl", tmp_path / "campaign-results.jsonl"
    items = [{"n": i} for i in range(16)]
    script = f"import os, shutil; shutil.copy(os.environ['SHARDOPS_CAMPAIGN_RESULTS_FILE'], {str(copy)!r})"
    body = bed.campaign_body(
        "closing",
        items,
        shardSize=2,
        maxConcurrency=3,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0.05, "SHARDOPS_AGENT_LEDGER": ledger_file},
        finalize={"image": "shardops:e2e", "command": ["python3", "-c", script]},
    )
    with bed.operator(env=s3_operator_env):
        bed.create_campaign(body)
        final = bed.wait_phase("closing", FINISHED, timeout=240)
        assert final["status"]["phase"] == "Succeeded", final["status"]
        folded = final["status"].get("folded") or {}
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(16))
    assert [line["item"] for line in lines] == items
    computed = {e["key"]: e for e in _ledger(ledger_file) if e["event"] == "done"}
    assert {line["key"] for line in lines} == set(computed)
    for line in lines:
        assert line["result"]["answer"] == answer(line["item"]) and line["shard"].startswith("closing-")
    print(
        f"\nfinalize read {len(lines)} results; {folded.get('shards', 0)} of 8 work shards folded at the end"
    )
