"""The bad-input table: malformed manifests, names that break DNS rules or overflow derived names,
absurd numbers, items that are not JSON or not objects, inputs too big for the API server or for a
shard, a ConfigMap input near its size limit, a large item, unicode — each refused at admission
with a message naming the field, or reported as a condition naming the fix before anything runs,
or run to the exact results; all against one operator, next to a campaign that must not notice.

The table this test prints is docs/faults.md's "Bad input" table."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.harness import Cluster

from e2e.test_cli_campaign import kc
from shardops.api.common import JSON
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS
from shardops_example_agent.agent import answer

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

# A ConfigMap holds at most 1 MiB (1,048,576 bytes) in all; this input leaves ~40 KB for the rest.
NEAR_CONFIGMAP_LIMIT = 1_000_000
# One item bigger than any Shard object can carry (1 MiB of items: logic.shard_items), and one that fits.
HUGE_ITEM_BYTES = 4 * 1024 * 1024
LARGE_ITEM_BYTES = 900 * 1024
# Strings that break naive handling: astral emoji, CJK, right-to-left, combining marks, a BOM, the
# line and paragraph separators (str.splitlines() splits on them, JSONL does not), controls.
UNICODE_TEXTS = [
    "emoji 🧪🚀👩🏽‍💻",
    "中文 日本語 한국어",
    "עברית العربية",
    "e\u0301 a\u0308 combining",
    "\ufeffbyte order mark",
    "line\u2028separator\u2029paragraph",
    "tab\tnewline\nreturn\r",
    "nul\u0000and\u0007bell",
    "surrogate-free \U0001f600\U0010fffd",
]


@dataclass
class Row:
    case: str
    given: str
    outcome: str


def _apply(cluster: Cluster, namespace: str, tmp_path: Path, name: str, text: str) -> str:
    """`kubectl apply -f` a manifest as a user would; kubectl's stderr, which must be a refusal."""
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(text, encoding="utf-8")
    done = cluster.kubectl("apply", "-n", namespace, "-f", str(manifest), check=False)
    assert done.returncode != 0, f"{name} was accepted: {done.stdout}"
    return done.stderr


def _manifest(name: str, **spec: Any) -> str:
    body = Bed.campaign_body(name, [{"n": 1}], **spec)
    return yaml.safe_dump(body, allow_unicode=True)


def _refusals(big_items: list[JSON]) -> list[tuple[str, str, Callable[[str], str], str]]:
    """(case, what is given, the manifest for a name, what the refusal must say)."""
    too_long = "x" * 64
    return [
        (
            "malformed manifest",
            "YAML that does not parse",
            lambda n: f"kind: Campaign\nmetadata: {{name: {n}\n",
            "yaml",
        ),
        (
            "unknown field",
            "spec.itemz (a typo)",
            lambda n: _manifest(n, itemz=[{"n": 1}]),
            'unknown field "spec.itemz"',
        ),
        (
            "name breaks DNS rules",
            "metadata.name Bad_Name",
            lambda n: _manifest("Bad_Name"),
            "RFC 1123",
        ),
        (
            "unicode name",
            "metadata.name kampaniya-кампания",
            lambda n: _manifest("kampaniya-кампания"),
            "RFC 1123",
        ),
        (
            "name overflows derived names",
            "metadata.name of 64 characters",
            lambda n: _manifest(too_long),
            "at most 63 characters",
        ),
        (
            "absurd number",
            "maxConcurrency 1000000",
            lambda n: _manifest(n, maxConcurrency=1_000_000),
            "less than or equal to 1000",
        ),
        (
            "number past int64",
            "leaseSeconds 10^20",
            lambda n: _manifest(n, leaseSeconds=10**20),
            "leaseSeconds",
        ),
        ("zero shard size", "shardSize 0", lambda n: _manifest(n, shardSize=0), "greater than or equal to 1"),
        (
            "items not objects",
            'items [1, "two"]',
            lambda n: yaml.safe_dump(Bed.campaign_body(n, [1, "two"])),  # type: ignore[list-item]
            "spec.items[0]",
        ),
        (
            "inline items too big",
            f"{len(big_items)} inline items, {len(json.dumps(big_items)) // 1024 // 1024} MiB",
            lambda n: json.dumps(Bed.campaign_body(n, big_items)),
            "too large",
        ),
    ]


def _jsonl(items: list[JSON]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def _ready_false(bed: Bed, name: str) -> JSON | None:
    body = bed.get_campaign(name)
    ready = bed.condition(body, "Ready")
    return (
        ready if ready and ready["status"] == "False" and body["status"].get("phase") == "Invalid" else None
    )


def _results(cluster: Cluster, namespace: str, name: str) -> list[JSON]:
    answered = kc(cluster, "results", name, "-n", namespace)
    assert answered.returncode == 0, answered.stderr[-2000:]
    # The line and paragraph separators come escaped, so even a reader that splits on them sees
    # whole lines; split here as JSONL is, on "\n" only.
    assert "\u2028" not in answered.stdout and "\u2029" not in answered.stdout
    return [json.loads(line) for line in answered.stdout.split("\n") if line]


def _assert_exact(lines: list[JSON], items: list[JSON]) -> None:
    """Every item back, in order, byte for byte as given, with the answer the command computed from
    exactly those bytes (the example agent hashes the item it read)."""
    assert [line["index"] for line in lines] == list(range(len(items)))
    for line, item in zip(lines, items, strict=True):
        assert line["item"] == item
        assert line["result"]["answer"] == answer(item), line["index"]


def test_bad_input_is_refused_or_reported_and_harms_nothing(
    bed: Bed, object_store: lifecycle.ObjectStore, tmp_path: Path
) -> None:
    kube = bed.kube
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    env = bed.s3_store_env(object_store, prefix)
    s3 = object_store.client()
    rows: list[Row] = []
    fast = {"SHARDOPS_AGENT_LATENCY": 0}

    with bed.operator(env=env) as operator:
        started_as = operator.running_pids()
        # The bystander: a campaign already running when the bad input arrives.
        steady_items = [{"n": i} for i in range(30)]
        kube.create(
            CAMPAIGNS,
            bed.namespace,
            bed.campaign_body(
                "steady",
                steady_items,
                shardSize=1,
                maxConcurrency=2,
                worker_env={"SHARDOPS_AGENT_LATENCY": 0.3},
            ),
        )

        # 1. Refused at admission (kubectl apply, as a user would): nothing is created.
        big_items = [{"n": i, "pad": "x" * 1000} for i in range(3500)]
        for number, (case, given, manifest, says) in enumerate(_refusals(big_items)):
            name = f"refused-{number}"
            stderr = _apply(bed.cluster, bed.namespace, tmp_path, name, manifest(name))
            assert says in stderr, f"{case}: {stderr[-600:]}"
            rows.append(Row(case, given, f"refused at admission: {_first_line(stderr)}"))
        names = {c["metadata"]["name"] for c in kube.list(CAMPAIGNS, bed.namespace)}
        assert names == {"steady"}, names

        # 2. Accepted, then reported before anything runs: Ready=False naming the fix, no shard.
        reported: list[tuple[str, str, str, JSON, str]] = []
        kube.create(
            CONFIGMAPS,
            bed.namespace,
            {"metadata": {"name": "not-json"}, "data": {"items.jsonl": '{"n": 1}\n{"n": 2,\n'}},
        )
        reported.append(
            (
                "items not JSON",
                'a ConfigMap line {"n": 2,',
                "bad-line",
                {"configMapName": "not-json", "key": "items.jsonl"},
                "line 2: not valid JSON",
            )
        )
        kube.create(
            CONFIGMAPS,
            bed.namespace,
            {"metadata": {"name": "not-objects"}, "data": {"items.jsonl": '{"n": 1}\n[1, 2]\n'}},
        )
        reported.append(
            (
                "item not an object",
                "a ConfigMap line [1, 2]",
                "bad-item",
                {"configMapName": "not-objects", "key": "items.jsonl"},
                "line 2",
            )
        )
        reported.append(
            (
                "input missing",
                "itemsFrom a ConfigMap that does not exist",
                "no-input",
                {"configMapName": "nowhere", "key": "items.jsonl"},
                "create it",
            )
        )
        s3.put_object(
            Bucket=object_store.bucket, Key=f"{prefix}/{bed.namespace}/broken.jsonl.gz", Body=b'{"n": 1}\n'
        )
        reported.append(
            (
                "object not gzip",
                "itemsFrom object broken.jsonl.gz holding plain text",
                "not-gzip",
                {"object": {"key": f"{prefix}/{bed.namespace}/broken.jsonl.gz"}},
                "not valid gzip",
            )
        )
        s3.put_object(
            Bucket=object_store.bucket,
            Key=f"{prefix}/{bed.namespace}/latin1.jsonl",
            Body='{"name": "café"}\n'.encode("latin-1"),
        )
        reported.append(
            (
                "object not UTF-8",
                "itemsFrom object in Latin-1",
                "not-utf8",
                {"object": {"key": f"{prefix}/{bed.namespace}/latin1.jsonl"}},
                "not JSONL text",
            )
        )
        huge_items: list[JSON] = [{"n": 0}, {"n": 1, "blob": "h" * HUGE_ITEM_BYTES}, {"n": 2}]
        s3.put_object(
            Bucket=object_store.bucket, Key=f"{prefix}/{bed.namespace}/huge.jsonl", Body=_jsonl(huge_items)
        )
        reported.append(
            (
                "an item too big for any shard",
                f"one item of {HUGE_ITEM_BYTES // 1024 // 1024} MiB in an itemsFrom object",
                "huge-item",
                {"object": {"key": f"{prefix}/{bed.namespace}/huge.jsonl"}},
                "item 1 alone is",
            )
        )
        heavy = [{"n": i, "blob": "w" * 120_000} for i in range(20)]
        s3.put_object(
            Bucket=object_store.bucket, Key=f"{prefix}/{bed.namespace}/heavy.jsonl", Body=_jsonl(heavy)
        )
        reported.append(
            (
                "a shard too big for its object",
                "20 items of 120 KB at shardSize 10 (1.2 MB a shard)",
                "heavy-shards",
                {"object": {"key": f"{prefix}/{bed.namespace}/heavy.jsonl"}},
                "lower spec.shardSize (about 8 items",
            )
        )
        for _case, _given, name, source, _says in reported:
            body = bed.campaign_body(name, [])
            del body["spec"]["items"]
            body["spec"]["itemsFrom"] = source
            kube.create(CAMPAIGNS, bed.namespace, body)
        for case, given, name, _source, says in reported:
            ready = bed.wait_for(
                f"{name}: Ready=False", lambda name=name: _ready_false(bed, name), timeout=90
            )
            assert says in ready["message"], f"{case}: {ready['message']}"
            rows.append(Row(case, given, f"condition Ready=False {ready['reason']}: {ready['message']}"))
        cut = {s["spec"]["campaign"] for s in bed.shards()}
        assert not cut & {name for _c, _g, name, _s, _w in reported}, cut

        # 3. Accepted and run to the exact results.
        per_item = NEAR_CONFIGMAP_LIMIT // 100
        near_items = [
            {"n": i, "text": "q" * (100 - len(json.dumps({"n": i, "text": ""})) - 1)} for i in range(per_item)
        ]
        near_text = "".join(json.dumps(item) + "\n" for item in near_items)
        assert NEAR_CONFIGMAP_LIMIT - 100 <= len(near_text) <= NEAR_CONFIGMAP_LIMIT
        kube.create(
            CONFIGMAPS,
            bed.namespace,
            {"metadata": {"name": "near-limit"}, "data": {"items.jsonl": near_text}},
        )
        near = bed.campaign_body("near-limit", [], shardSize=2000, maxConcurrency=2, worker_env=fast)
        del near["spec"]["items"]
        near["spec"]["itemsFrom"] = {"configMapName": "near-limit", "key": "items.jsonl"}
        kube.create(CAMPAIGNS, bed.namespace, near)

        unicode_items: list[JSON] = [
            {"text": text, "ключ": "значение", "🔑": i} for i, text in enumerate(UNICODE_TEXTS)
        ]
        kube.create(
            CAMPAIGNS,
            bed.namespace,
            bed.campaign_body("unicode", unicode_items, shardSize=3, worker_env=fast),
        )
        # Through an object too: JSONL written without ASCII escapes, so U+2028 stands raw in a line.
        unicode_key = f"{prefix}/{bed.namespace}/unicode.jsonl"
        s3.put_object(
            Bucket=object_store.bucket,
            Key=unicode_key,
            Body="".join(json.dumps(item, ensure_ascii=False) + "\n" for item in unicode_items).encode(),
        )
        from_object = bed.campaign_body("unicode-object", [], shardSize=3, worker_env=fast)
        del from_object["spec"]["items"]
        from_object["spec"]["itemsFrom"] = {"object": {"key": unicode_key}}
        kube.create(CAMPAIGNS, bed.namespace, from_object)

        large_items: list[JSON] = [{"n": 0}, {"n": 1, "blob": "l" * LARGE_ITEM_BYTES}, {"n": 2}]
        large_key = f"{prefix}/{bed.namespace}/large.jsonl"
        s3.put_object(Bucket=object_store.bucket, Key=large_key, Body=_jsonl(large_items))
        large = bed.campaign_body("large-item", [], shardSize=1, worker_env=fast)
        del large["spec"]["items"]
        large["spec"]["itemsFrom"] = {"object": {"key": large_key}}
        kube.create(CAMPAIGNS, bed.namespace, large)

        ran = [
            (
                "ConfigMap input near its size limit",
                f"{len(near_items):,} items, {len(near_text):,} bytes in one ConfigMap key",
                "near-limit",
                near_items,
            ),
            (
                "unicode items",
                f"{len(unicode_items)} inline items: emoji, CJK, RTL, combining, BOM, U+2028, NUL",
                "unicode",
                unicode_items,
            ),
            (
                "unicode items from an object",
                "the same as raw UTF-8 JSONL (U+2028 unescaped)",
                "unicode-object",
                unicode_items,
            ),
            (
                "a large item that fits",
                f"one item of {LARGE_ITEM_BYTES // 1024} KiB in an itemsFrom object, shardSize 1",
                "large-item",
                large_items,
            ),
        ]
        for case, given, name, items in ran:
            final = bed.wait_phase(name, {"Succeeded", "Failed", "Completed"}, timeout=300)
            assert final["status"]["phase"] == "Succeeded", (case, final["status"])
            assert final["status"]["itemsTotal"] == len(items)
            _assert_exact(_results(bed.cluster, bed.namespace, name), items)
            rows.append(Row(case, given, f"Succeeded: {len(items)} results, each item back exactly as given"))

        # The bystander ran through all of it: done, nothing charged twice.
        steady = bed.wait_phase("steady", {"Succeeded", "Failed", "Completed"}, timeout=300)
        assert steady["status"]["phase"] == "Succeeded" and steady["status"]["counts"]["done"] == 30
        _assert_exact(_results(bed.cluster, bed.namespace, "steady"), steady_items)
        rows.append(
            Row(
                "other campaigns",
                "a campaign running through all of the above",
                "Succeeded, every result exact",
            )
        )

        # The operator: the same process from start to end, nothing it could not handle in its log.
        assert operator.running_pids() == started_as and operator.restarts() == 0
        log = operator.log(next(iter(started_as)))
        assert "Traceback" not in log, log[-3000:]
        rows.append(
            Row("the operator", "all of the above, one process", "same process, no restart, no traceback")
        )

    print("\n| case | given | outcome |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row.case} | {row.given} | {row.outcome.replace('|', '/')} |")


def _first_line(stderr: str) -> str:
    """kubectl's refusal as one line (the API server's answer may span several), path-free."""
    said = " ".join(stderr.split())
    said = re.sub(r'error when creating "[^"]*": ', "", said)
    said = re.sub(r"error parsing \S+: ", "", said)
    return said if len(said) <= 400 else said[:397] + "..."
