"""`testbed/cluster/build.sh --check`, what unit tests use to find the tools: it answers from the cache
as it is and writes nothing, so a test run never races a `make tools` building into the same cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from testbed.cluster import lifecycle

BUILD = Path(lifecycle.__file__).resolve().parent / "build.sh"


def test_the_check_of_an_empty_cache_names_what_is_missing_and_writes_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    checked = subprocess.run(
        ["bash", str(BUILD), "--check"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHARDOPS_CACHE": str(cache)},
        timeout=60,
    )
    assert checked.returncode == 1 and checked.stdout == ""
    assert "run `make tools`" in checked.stderr and "kubectl and helm" in checked.stderr, checked.stderr
    assert "Kueue (v" in checked.stderr, checked.stderr
    assert not cache.exists(), "the check created the cache"


def test_bin_dir_without_building_raises_what_the_check_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDOPS_BIN_DIR", raising=False)
    monkeypatch.setenv("SHARDOPS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="make tools"):
        lifecycle.bin_dir(build=False)
    assert not (tmp_path / "cache").exists()


def test_an_unknown_argument_is_refused_before_anything_runs(tmp_path: Path) -> None:
    refused = subprocess.run(
        ["bash", str(BUILD), "--chek"], capture_output=True, text=True, check=False, timeout=60
    )
    assert refused.returncode == 2 and "usage: build.sh [--check]" in refused.stderr
