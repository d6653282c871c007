"""The image `make image` builds (hack/image.sh): an OCI archive that skopeo reads, with the chart's
non-root user, the `shardops` entry point and the venv on Debian's Python.

Needs the archive: `make e2e` builds it first (`make image`); run alone, build it with `make image`.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from testbed.cluster.images import SHARDOPS_ARCHIVE, layer_names, read_archive

pytestmark = pytest.mark.skipif(
    not SHARDOPS_ARCHIVE.is_file(), reason=f"no image archive at {SHARDOPS_ARCHIVE}: run `make image`"
)


def test_skopeo_reads_the_archive_user_and_entrypoint() -> None:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.skip("skopeo is not installed (`make image` installs it)")
    reference = f"oci-archive:{SHARDOPS_ARCHIVE}"
    inspected = json.loads(
        subprocess.run([skopeo, "inspect", reference], check=True, capture_output=True).stdout
    )
    config = json.loads(
        subprocess.run([skopeo, "inspect", "--config", reference], check=True, capture_output=True).stdout
    )["config"]
    (image,) = read_archive(SHARDOPS_ARCHIVE)
    assert inspected["Digest"] == image.digest
    assert (SHARDOPS_ARCHIVE.parent / "shardops-image.digest").read_text().strip() == image.digest
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["shardops"]
    assert config["Cmd"] == ["operator"]
    assert config["WorkingDir"] == "/tmp"
    assert image.names == ("ghcr.io/shardops/shardops:0.1.0",)
    assert image.matches("ghcr.io/shardops/shardops:0.1.0") and not image.matches("shardops:0.1.0")


def test_the_layer_holds_the_venv_on_debians_python_without_pip() -> None:
    (image,) = read_archive(SHARDOPS_ARCHIVE)
    names = layer_names(image)
    assert "opt/shardops/bin/shardops" in names
    assert "opt/shardops/bin/shardops-example-agent" in names
    assert "usr/bin/python3.11" in names, "Python comes from Debian's python3 package"
    assert "var/lib/dpkg/status" in names
    assert "usr/bin/apt-get" in names, "images built on top can apt-get install, as on debian:bookworm-slim"
    assert not [n for n in names if n.startswith("opt/shardops/bin/pip")], "pip is removed from the venv"
    assert not [n for n in names if n.startswith("usr/lib/python3/dist-packages/pip")]
    compiled = [n for n in names if n.startswith("opt/shardops/lib/python3.11/site-packages/shardops/")]
    assert any(n.endswith(".cpython-311.pyc") for n in compiled), "bytecode compiled at build time"
