"""Worker settings from the environment, and the holder identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardops.worker.settings import WorkerSettings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("POD_NAME", "SHARDOPS_POD_NAME", "SHARDOPS_NAMESPACE", "SHARDOPS_IDLE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    settings = WorkerSettings()
    assert settings.result_max_bytes is None, "unset means the result store's own cap"
    assert settings.store_retry_seconds == 120
    assert settings.claim_candidates == 5
    assert settings.idle_seconds is None, "unset means the campaign's spec.idleSeconds"
    assert settings.namespace is None


def test_environment_with_the_shardops_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHARDOPS_NAMESPACE", "team-a")
    monkeypatch.setenv("POD_NAME", "camp-worker-x7k2p")
    monkeypatch.setenv("SHARDOPS_IDLE_SECONDS", "12.5")
    monkeypatch.setenv("SHARDOPS_RESULT_MAX_BYTES", "4096")
    monkeypatch.setenv("SHARDOPS_CLAIM_CANDIDATES", "3")
    monkeypatch.setenv("SHARDOPS_WORK_DIR", str(tmp_path))
    settings = WorkerSettings()
    assert settings.resolved_namespace() == "team-a"
    assert (settings.idle_seconds, settings.result_max_bytes, settings.claim_candidates) == (12.5, 4096, 3)
    assert settings.work_dir == tmp_path
    assert settings.identity.startswith("camp-worker-x7k2p-")


def test_identity_is_stable_per_process_and_unique_across_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "p")
    one, two = WorkerSettings(), WorkerSettings()
    assert one.identity == one.identity
    assert one.identity != two.identity, "two processes in one pod must not share a holder identity"
    monkeypatch.delenv("POD_NAME")
    assert WorkerSettings().identity.count("-") >= 2, "host-pid-suffix without a pod name"
    monkeypatch.setenv("POD_NAME", "x" * 400)
    assert len(WorkerSettings().identity) <= 253


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDOPS_CLAIM_CANDIDATES", "0")
    with pytest.raises(ValueError, match="claim_candidates"):
        WorkerSettings()
