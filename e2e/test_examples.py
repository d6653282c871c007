"""Every manifest in examples/ is created on a real API server (not a dry run): the CRD's schema and
CEL rules accept it, the stored Campaign parses with the API models, its worker (and finalize step)
names the image the build produces (the chart's default, so the example runs on a real cluster), the
ConfigMap an itemsFrom names exists with readable items, and `kubectl campaign plan` plans it
(cutting its first shards)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.kits.chart import built_image

from shardops.api.campaign import Campaign
from shardops.cli import campaign as cli
from shardops.k8s import campaigns
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, Kube, NotFound

EXAMPLES = sorted((Bed.REPO_ROOT / "examples").glob("*.yaml"))
# What the test puts in an itemsFrom ConfigMap that the example only names (one JSONL item).
SAMPLE_ITEMS = '{"id": "sample-1"}\n'


def test_there_are_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert len(names) >= 5, names
    kinds = {tuple(sorted((d.get("spec") or {}).keys())) for p in EXAMPLES for d in Bed.objects_in(p)}
    joined = {key for keys in kinds for key in keys}
    # minimal, itemsFrom, budget, sources with fallback, finalize step
    assert {"items", "itemsFrom", "budget", "sources", "finalize"} <= joined


def _campaigns(path: Path) -> list[dict[str, Any]]:
    return [d for d in Bed.objects_in(path) if d.get("kind") == "Campaign"]


@pytest.mark.usefixtures("crds_installed")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_created_and_planned(bed: Bed, example: Path) -> None:
    created = bed.cluster.kubectl("create", "-n", bed.namespace, "-f", str(example), check=False)
    assert created.returncode == 0, f"{example.name} was refused:\n{created.stderr}"
    kube = Kube.from_environment("e2e-examples", str(bed.cluster.kubeconfig))
    for document in _campaigns(example):
        name = document["metadata"]["name"]
        stored = Campaign.parse(kube.get(CAMPAIGNS, bed.namespace, name))
        workers = [stored.spec.worker, *([stored.spec.finalize] if stored.spec.finalize else [])]
        assert [w.image for w in workers] == [built_image()] * len(workers), example.name
        source = stored.spec.items_from
        if source is not None:
            try:
                kube.get(CONFIGMAPS, bed.namespace, source.config_map_name)
            except NotFound:
                config_map = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": source.config_map_name},
                    "data": {source.key: SAMPLE_ITEMS},
                }
                bed.cluster.kubectl("create", "-n", bed.namespace, "-f", "-", stdin=bed.dump_json(config_map))
            items, _ = campaigns.read_items(kube, bed.namespace, source)
            assert items, f"{example.name}: ConfigMap {source.config_map_name} key {source.key} has no items"
            expected_items = len(items)
        else:
            expected_items = len(stored.spec.items or [])
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(
            ["plan", name, "-n", bed.namespace, "-o", "json", "--kubeconfig", str(bed.cluster.kubeconfig)],
            stdout=out,
            stderr=err,
        )
        assert code == 0, f"{example.name}: {err.getvalue()}"
        plan = json.loads(out.getvalue())
        assert plan["observed"]["itemsTotal"] == expected_items
        # Nothing exists yet, so the operator's first pass cuts shards (unless suspended).
        if not stored.spec.suspend:
            assert plan["plan"]["materialize"] > 0, plan["message"]
