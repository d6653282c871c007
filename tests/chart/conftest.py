"""The helm binary the chart tests render with."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    try:
        from testbed.cluster.lifecycle import bin_dir

        # Only a helm `make tools` has built: a test run never builds into the shared cache.
        path = bin_dir(build=False) / "helm"
    except OSError as error:
        pytest.skip(f"no helm binary: {error}")
    if not path.exists():
        pytest.skip(f"no helm binary at {path}; run `make tools`")
    return path
