"""A campaign whose input is a JSONL object in S3, started from a local file with `kubectl campaign
apply --items` (no S3 tooling): 100,000 items at shardSize 100 run to Succeeded with zero result
ConfigMaps and a bounded number of Shards; its results come back in item order. Bad input gets a
line-numbered condition before anything runs."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.bed import Bed
from testbed.cluster import lifecycle

from e2e.test_cli_campaign import kc
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS
from shardops.store.configmap import PREFIXES

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

ITEMS = 100_000
SHARD_SIZE = 100
# Worker Jobs at once. On the 2-core CI machine the run is CPU-bound (each shard is a command start,
# a claim, S3 writes and a Done write): 5 workers keep both cores busy, and 10 only added contention
# (more CPU in all, and a longer run). The bound on live Shards scales with it.
WORKERS = 5


def _manifest(path: Path, name: str, store: lifecycle.ObjectStore, prefix: str, **spec: Any) -> Path:
    body = Bed.campaign_body(name, [], **spec)
    del body["spec"]["items"]
    body["spec"]["resultStore"] = {
        "type": "S3",
        "s3": {
            "endpoint": store.endpoint,
            "bucket": store.bucket,
            "prefix": prefix,
            "credentialsSecret": Bed.STORE_SECRET,
        },
    }
    target = path / f"{name}.yaml"
    target.write_text(yaml.safe_dump(body))
    return target


@pytest.mark.long
def test_a_hundred_thousand_items_from_a_local_file_run_with_no_result_configmaps(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    kube = bed.kube
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    env = bed.s3_store_env(object_store, prefix)
    items = tmp_path / "items.jsonl.gz"
    with gzip.open(items, "wt", encoding="utf-8") as handle:
        for i in range(ITEMS):
            handle.write(json.dumps({"custom_id": f"req-{i}", "n": i}) + "\n")
    manifest = _manifest(
        tmp_path,
        "big",
        object_store,
        prefix,
        shardSize=SHARD_SIZE,
        maxConcurrency=WORKERS,
        worker_env={"SHARDOPS_AGENT_LATENCY": 0},
    )
    before = bed.cluster.etcd_bytes() or 0
    with bed.operator(env=env):
        applied = kc(bed.cluster, "apply", "-f", str(manifest), "--items", str(items), "-n", bed.namespace)
        assert applied.returncode == 0, applied.stderr
        assert f"uploaded {ITEMS} item(s)" in applied.stderr and "created" in applied.stdout
        spec = kube.get(CAMPAIGNS, bed.namespace, "big")["spec"]
        assert spec["itemsFrom"]["object"]["key"].startswith(f"{prefix}/{bed.namespace}/inputs/big/")

        peak = {"shards": 0}

        def finished() -> dict[str, Any] | None:
            peak["shards"] = max(peak["shards"], len(bed.shards()))
            body = kube.get(CAMPAIGNS, bed.namespace, "big")
            return body if (body.get("status") or {}).get("phase") in {"Succeeded", "Completed"} else None

        started = time.monotonic()
        final = bed.wait_for("the 100,000-item campaign to finish", finished, timeout=1500, interval=1.0)
        ran = time.monotonic() - started
        status = final["status"]
        assert status["phase"] == "Succeeded", status
        assert status["itemsTotal"] == ITEMS and status["counts"]["done"] == ITEMS // SHARD_SIZE
        after = bed.cluster.etcd_bytes() or 0
        configmaps = [
            c["metadata"]["name"]
            for c in kube.list(CONFIGMAPS, bed.namespace)
            if c["metadata"]["name"].startswith(PREFIXES)
        ]
        assert configmaps == [], "every result is in S3"
        # The window: at most backlogRatio x maxConcurrency pending + maxConcurrency running + the
        # Done shards of one pass before they fold — never the campaign's 1,000.
        assert peak["shards"] <= 2 * WORKERS + WORKERS + 500, peak
        print(
            f"\n100,000 items / {ITEMS // SHARD_SIZE} shards: etcd grew {after - before:+,} bytes "
            f"(apiserver_storage_size_bytes {before:,} -> {after:,}); peak Shards alive {peak['shards']}"
        )

        started = time.monotonic()
        answer = kc(bed.cluster, "results", "big", "-n", bed.namespace)
        read = time.monotonic() - started
        print(f"ran in {ran:.0f} s with maxConcurrency {WORKERS}; kubectl campaign results took {read:.0f} s")
        assert answer.returncode == 0, answer.stderr[-2000:]
        lines = answer.stdout.splitlines()
        assert len(lines) == ITEMS
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        assert (first["index"], first["item"]["custom_id"]) == (0, "req-0")
        assert (last["index"], last["item"]["custom_id"]) == (ITEMS - 1, f"req-{ITEMS - 1}")


def test_an_object_that_is_not_jsonl_is_named_with_its_line_before_anything_runs(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    kube = bed.kube
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    env = bed.s3_store_env(object_store, prefix)
    s3 = object_store.client()
    key = f"{prefix}/{bed.namespace}/bad.jsonl"
    s3.put_object(Bucket=object_store.bucket, Key=key, Body=b'{"n": 1}\n{"n": 2}\nnot json\n')
    body = bed.campaign_body("bad", [])
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"object": {"key": key}}
    with bed.operator(env=env):
        kube.create(CAMPAIGNS, bed.namespace, body)

        def refused() -> dict[str, Any] | None:
            ready = bed.condition(kube.get(CAMPAIGNS, bed.namespace, "bad"), "Ready")
            return ready if ready and ready.get("reason") == "ItemsInvalid" else None

        ready = bed.wait_for("Ready=False ItemsInvalid", refused, timeout=60)
        assert f"s3://{object_store.bucket}/{key} line 3: not valid JSON" in ready["message"], ready
        assert bed.shards() == []
        missing = bed.campaign_body("missing", [])
        del missing["spec"]["items"]
        missing["spec"]["itemsFrom"] = {"object": {"key": f"{prefix}/{bed.namespace}/nope.jsonl"}}
        kube.create(CAMPAIGNS, bed.namespace, missing)
        gone = bed.wait_phase("missing", {"Invalid"}, timeout=60)
        assert "does not exist" in bed.condition(gone, "Ready")["message"]
    # A bad local file is refused before anything is uploaded.
    local = tmp_path / "local.jsonl"
    local.write_text('{"n": 1}\n[1, 2]\n')
    manifest = _manifest(tmp_path, "local", object_store, prefix)
    refused_apply = kc(bed.cluster, "apply", "-f", str(manifest), "--items", str(local), "-n", bed.namespace)
    assert refused_apply.returncode == 1
    assert (
        "line 2: an item must be a JSON object" in refused_apply.stderr
        and "nothing was uploaded" in refused_apply.stderr
    )
