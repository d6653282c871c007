"""The local control plane compiles the checkout's sources its pods run, as an image's pip install
would: a pod process that may not write bytecode would otherwise compile them at every start."""

from __future__ import annotations

import importlib.util

from testbed.cluster.lifecycle import POD_SOURCES, REPO_ROOT, compile_pod_sources


def test_every_source_a_pod_runs_has_current_bytecode() -> None:
    compile_pod_sources()
    sources = [path for root in POD_SOURCES for path in (REPO_ROOT / root).rglob("*.py")]
    assert any(path.name == "runtime.py" for path in sources), "the worker runtime is among them"
    for path in sources:
        compiled = importlib.util.cache_from_source(str(path))
        assert (REPO_ROOT / compiled).stat().st_mtime >= path.stat().st_mtime, path
