"""`kubectl explain campaign.spec --recursive` (and shard) is the field reference the user guide points
to: every field of spec and status in the committed CRDs carries a description worth reading."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = Path(__file__).resolve().parents[2] / "crds"
MIN_DESCRIPTION = 10


def _fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, child in (node.get("properties") or {}).items():
        where = f"{path}.{name}"
        yield where, child
        if child.get("type") == "object":
            yield from _fields(child, where)
        items = child.get("items") or {}
        if child.get("type") == "array" and items.get("type") == "object":
            yield from _fields(items, where + "[]")


@pytest.mark.parametrize("crd", ["shardops.dev_campaigns.yaml", "shardops.dev_shards.yaml"])
def test_every_spec_and_status_field_is_described(crd: str) -> None:
    schema = yaml.safe_load((CRDS / crd).read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = [
        (where, node) for top in ("spec", "status") for where, node in _fields(schema["properties"][top], top)
    ]
    assert len(fields) > 20
    thin = [
        where for where, node in fields if len(str(node.get("description") or "").strip()) < MIN_DESCRIPTION
    ]
    assert not thin, f"fields without a useful description in {crd}: {thin}"
