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


def test_a_clock_offset_shifts_the_wall_clock_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt
    import random

    from shardops.clock import ClockSkewSettings
    from shardops.scheduler.settings import OperatorSettings

    assert ClockSkewSettings().wall_clock()().tzinfo is dt.UTC
    monkeypatch.setenv("SHARDOPS_CLOCK_OFFSET_SECONDS", "-30")
    for settings in (WorkerSettings(), OperatorSettings()):
        lag = dt.datetime.now(dt.UTC) - settings.wall_clock()()
        assert dt.timedelta(seconds=29) < lag < dt.timedelta(seconds=31)
    monkeypatch.setenv("SHARDOPS_CLOCK_OFFSET_SPREAD_SECONDS", "10")
    offsets = set()
    for seed in range(20):
        lag = dt.datetime.now(dt.UTC) - WorkerSettings().wall_clock(random.Random(seed))()
        assert dt.timedelta(seconds=19) < lag < dt.timedelta(seconds=41)
        offsets.add(round(lag.total_seconds()))
    assert len(offsets) > 5, "each process draws its own offset"
    monkeypatch.setenv("SHARDOPS_CLOCK_OFFSET_SECONDS", "100000")
    with pytest.raises(ValueError, match="clock_offset_seconds"):
        WorkerSettings()
