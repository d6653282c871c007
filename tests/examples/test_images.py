"""Every example and sample names the image the build produces, so it runs on a real cluster as
written: examples/*.yaml, crds/samples/*.yaml (the chart's NOTES point at them) and the YAML in the
docs. An image no build makes (`shardops:dev`) leaves a worker pod in ErrImagePull."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.kits.chart import built_image

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "crds" / "samples").glob("*.yaml")])
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "charts" / "shardops" / "README.md"])
# `image: <reference>` in a document's text, YAML code blocks included.
IMAGE_LINE = re.compile(r"^\s*(?:-\s*)?image:\s*[\"']?([^\s\"'#]+)", re.MULTILINE)


def _images(node: Any) -> Iterator[str]:
    """Every `image` value of a worker or finalize block, wherever it sits in the document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for value in node:
            yield from _images(value)


def test_built_image_is_the_charts_default() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "shardops" / "Chart.yaml").read_text())
    assert built_image() == f"ghcr.io/shardops/shardops:{chart['appVersion']}"
    # hack/image.sh names the archive it builds after the same repository.
    assert 'image_name="ghcr.io/shardops/shardops:$version"' in (ROOT / "hack" / "image.sh").read_text()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_names_the_built_image(path: Path) -> None:
    images = [image for doc in yaml.safe_load_all(path.read_text()) for image in _images(doc)]
    if path.parent.name == "samples" and ("shard" in path.name or "source" in path.name):
        return  # Shards and Sources carry no image
    assert images, f"{path.name} names no image"
    wrong = [image for image in images if image != built_image()]
    assert not wrong, f"{path.name}: {wrong} is not the built image {built_image()}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_name_the_built_image_when_they_name_shardops(path: Path) -> None:
    """A snippet may name the user's own image (built FROM shardops); one naming shardops names the
    image the build produces."""
    named = [
        ref for ref in IMAGE_LINE.findall(path.read_text()) if ref.rsplit("/", 1)[-1].startswith("shardops")
    ]
    wrong = [ref for ref in named if ref != built_image()]
    assert not wrong, f"{path.name}: {wrong} is not the built image {built_image()}"
