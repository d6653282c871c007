"""Hostile inputs against one shared operator: a decompression bomb, a 1 GiB line, a million tiny
lines and an item `source` no Shard could carry. Each bad campaign carries a condition naming the
problem, the operator process stays the same one with its memory under a stated bound (read from
/proc), and a campaign running next to them finishes.

The operator runs as a pod of the chart's RBAC and the e2e operator Deployment
(`schedulerkit.operator_running`), on the process-kubelet, so its pid is a local process. Every
input is generated as it is uploaded: neither the test nor the operator ever holds one whole."""

from __future__ import annotations

import io
import itertools
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from testbed.cluster import lifecycle
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    JSON,
    campaign_body,
    condition,
    get_campaign,
    kube_for,
    operator_running,
    s3_store_env,
    wait_phase,
)

from shardops.api.enums import StoreType
from shardops.api.items import MAX_GZIP_RATIO, MAX_ITEM_LINE_BYTES, ItemsObject
from shardops.api.store import ResultStoreStatus
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, Kube
from shardops.store.items import object_items
from shardops.store.lines import ItemsChanged
from shardops.store.s3 import S3Store, boto3_client_for, client_for

GIB = 1024**3
MIB = 1024**2
# The operator's peak resident memory (VmHWM) over the whole test. It idles near 80 MiB; without the
# bounds, the 1 GiB line alone took it past 1 GiB (a 700 MiB line measured 3.9 GB).
OPERATOR_PEAK_BOUND = 400 * MIB
TINY_LINES = 1_000_000


class Generated(io.RawIOBase):
    """A readable file whose bytes come from an iterator of chunks as they are read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size], self._pending = self._pending[:size], self._pending[size:]
        return size


def one_long_line(size: int) -> Iterator[bytes]:
    yield b'{"blob": "'
    block = b"x" * MIB
    for _ in range(size // MIB):
        yield block
    yield b'"}\n'


def gzip_of(chunks: Iterator[bytes]) -> Iterator[bytes]:
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for chunk in chunks:
        if out := packer.compress(chunk):
            yield out
    yield packer.flush()


def tiny_lines(count: int) -> Iterator[bytes]:
    numbers = iter(range(count))
    while batch := list(itertools.islice(numbers, 10_000)):
        yield b"".join(b'{"n":%d}\n' % n for n in batch)


def memory_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes, from /proc."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def ready_false(kube: Kube, namespace: str, name: str) -> JSON | None:
    ready = condition(get_campaign(kube, namespace, name), "Ready")
    return ready if ready and ready["status"] == "False" else None


@pytest.mark.usefixtures("crds_installed")
def test_hostile_inputs_are_refused_with_bounded_memory_and_harm_no_other_campaign(
    local_cluster: Cluster, namespace: str, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    kube = kube_for(local_cluster)
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    env = s3_store_env(local_cluster, namespace, object_store, prefix)
    s3 = object_store.client()
    bucket = object_store.bucket

    with operator_running(local_cluster, namespace, env=env) as operator:
        (pid,) = operator.running_pids().values()
        before = memory_of(pid)
        steady = [{"n": i} for i in range(12)]
        kube.create(
            CAMPAIGNS,
            namespace,
            campaign_body(
                "steady", steady, shardSize=2, maxConcurrency=2, worker_env={"SHARDOPS_AGENT_LATENCY": 0.2}
            ),
        )

        # A refused source inline: the API server says so at admission, naming the field.
        manifest = tmp_path / "bad-source.yaml"
        manifest.write_text(
            yaml.safe_dump(campaign_body("bad-source", [{"n": 0, "source": "not a name!"}])),
            encoding="utf-8",
        )
        refused = local_cluster.kubectl("apply", "-n", namespace, "-f", str(manifest), check=False)
        assert refused.returncode != 0 and "spec.items[0].source" in refused.stderr, refused.stderr[-600:]

        # The inputs, each generated as it is uploaded.
        uploads = {
            "bomb": (
                f"{prefix}/{namespace}/bomb.jsonl.gz",
                gzip_of(b'{"n": 0}\n' * 100_000 for _ in range(GIB // 900_000)),
            ),
            "long-line": (f"{prefix}/{namespace}/long-line.jsonl", one_long_line(GIB)),
            "million": (f"{prefix}/{namespace}/million.jsonl", tiny_lines(TINY_LINES)),
        }
        for key, chunks in uploads.values():
            s3.upload_fileobj(io.BufferedReader(Generated(chunks), 8 * MIB), bucket, key)
        kube.create(
            CONFIGMAPS,
            namespace,
            {
                "metadata": {"name": "sources"},
                "data": {"items.jsonl": '{"n": 0}\n{"n": 1, "source": "a b"}\n'},
            },
        )
        for name, (key, _) in uploads.items():
            body = campaign_body(name, [], shardSize=10_000, suspend=name == "million")
            del body["spec"]["items"]
            body["spec"]["itemsFrom"] = {"object": {"key": key}}
            kube.create(CAMPAIGNS, namespace, body)
        cm_source = campaign_body("cm-source", [])
        del cm_source["spec"]["items"]
        cm_source["spec"]["itemsFrom"] = {"configMapName": "sources", "key": "items.jsonl"}
        kube.create(CAMPAIGNS, namespace, cm_source)

        expected = {
            "bomb": f"over the limit of {MAX_GZIP_RATIO:,} times",
            "long-line": "line 1: item 0 alone is longer than one item may be, over the limit of "
            f"{MAX_ITEM_LINE_BYTES:,} bytes",
            "cm-source": "ConfigMap sources key items.jsonl line 2: source 'a b' is not a source name",
        }
        for name, says in expected.items():
            ready = wait_for(
                f"{name}: Ready=False", lambda name=name: ready_false(kube, namespace, name), timeout=180
            )
            assert ready["reason"] == "ItemsInvalid" and says in ready["message"], (name, ready)
            assert get_campaign(kube, namespace, name)["status"]["phase"] == "Invalid"
            print(f"{name}: {ready['message']}")

        counted = wait_for(
            "the million lines counted",
            lambda: (get_campaign(kube, namespace, "million").get("status") or {}).get("itemsTotal"),
            timeout=300,
        )
        assert counted == TINY_LINES
        assert get_campaign(kube, namespace, "million")["status"]["phase"] != "Invalid"

        wait_phase(kube, namespace, "steady", {"Succeeded"}, timeout=300)
        after = memory_of(pid)
        assert operator.running_pids() == {next(iter(operator.running_pids())): pid}, "the same process"
        assert operator.restarts() == 0
        print(
            f"operator memory: RSS {before['VmRSS'] / MIB:.0f} MiB before, {after['VmRSS'] / MIB:.0f} MiB "
            f"after, peak {after['VmHWM'] / MIB:.0f} MiB (bound {OPERATOR_PEAK_BOUND / MIB:.0f} MiB)"
        )
        assert after["VmHWM"] < OPERATOR_PEAK_BOUND, after
        for key, _ in uploads.values():
            s3.delete_object(Bucket=bucket, Key=key)


@pytest.mark.parametrize("client", ["wire", "boto3"])
def test_an_object_replaced_after_its_first_read_is_refused_by_the_real_store(
    object_store: lifecycle.ObjectStore, client: str
) -> None:
    """The pin against SeaweedFS: the ETag of the first read, sent as If-Match on the next, refuses
    a replaced object with ItemsChanged (the store answers 412, or the ETags differ)."""
    location = ResultStoreStatus(
        type=StoreType.S3,
        endpoint=object_store.endpoint,
        region=object_store.region,
        bucket=object_store.bucket,
    )
    keys = {
        "AWS_ACCESS_KEY_ID": object_store.access_key_id,
        "AWS_SECRET_ACCESS_KEY": object_store.secret_access_key,
    }
    s3 = client_for(location, keys) if client == "wire" else boto3_client_for(location, keys)
    store = S3Store(location, "ns", client=s3)
    key = f"{location.area('ns')}e2e-pin/{uuid.uuid4().hex}/items.jsonl"
    object_store.client().put_object(Bucket=object_store.bucket, Key=key, Body=b'{"n": 0}\n{"n": 1}\n')
    streamed = object_items(ItemsObject(key=key), store)
    assert streamed.total() == 2 and streamed.pin is not None and streamed.pin.etag
    assert streamed[0:2] == [{"n": 0}, {"n": 1}], "the same version reads again under If-Match"
    object_store.client().put_object(Bucket=object_store.bucket, Key=key, Body=b'{"n": 1}\n{"n": 0}\n')
    with pytest.raises(ItemsChanged, match="changed after the campaign first read it"):
        streamed[0:1]
