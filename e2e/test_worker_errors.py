"""Failures end in a clear error class and message on the shard, and nothing half-written.

One campaign whose items inject faults through the example agent (an oversized result, an
unreadable result line, an invalid input, a source that keeps answering 429, a cost over the
per-shard cap), and one whose command does not exist.
"""

from __future__ import annotations

from pathlib import Path

from testbed.harness import Cluster
from testbed.kits import worker as kit

from shardops.k8s.events import series_name

CAP = 8192


def test_each_failure_has_its_class_message_and_event_and_nothing_is_half_written(
    local_cluster: Cluster, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    kube = kit.admin_kube(local_cluster)
    faults = kit.campaign_body(
        "faults",
        [
            {"id": 0, "fault": "big", "bytes": 3 * CAP},
            {"id": 1, "fault": "garbage"},
            {"id": 2, "fault": "invalid"},
            {"id": 3, "fault": "rate-limited"},
            {"id": 4, "cost": 5},
        ],
        maxAttempts=2,
        backoff={"baseSeconds": 0.2, "capSeconds": 0.5},
        budget={"limit": 100, "maxPerShard": 1},
    )
    missing = kit.campaign_body("nocmd", [{"id": 0}], command=["shardops-no-such-command", "--flag"])
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        kit.materialize(kube, namespace, faults)
        kit.materialize(kube, namespace, missing)
        workers = [
            pool.start("faults", f"faults-{i}", SHARDOPS_RESULT_MAX_BYTES=str(CAP)) for i in range(2)
        ] + [pool.start("nocmd", "nocmd-0")]
        assert kit.wait_exit(workers, timeout=120) == [0, 0, 0]

    shards = {
        s.name: s for s in kit.shards_of(kube, namespace, "faults") + kit.shards_of(kube, namespace, "nocmd")
    }
    expected = {
        "faults-00000": (
            "Failed",
            "result-too-large",
            [
                "item results of shard faults-00000 take",
                "over the result size cap of 8192 bytes",
                "nothing was stored",
            ],
        ),
        "faults-00001": ("Failed", "bad-output", ["results line 1 is not valid JSON", "this is not JSON {"]),
        "faults-00002": ("Failed", "invalid-input", ["item 0 is not a valid request"]),
        "faults-00003": ("Blocked", "rate-limited", ["429 Too Many Requests from the default source"]),
        "faults-00004": ("Failed", "over-budget", ["passed the per-shard cap spec.budget.maxPerShard 1"]),
        "nocmd-00000": ("Failed", "command-not-found", ["command not found: 'shardops-no-such-command'"]),
    }
    table = []
    for name, (phase, error_class, phrases) in expected.items():
        status = shards[name].current_status
        error = status.last_error
        assert status.phase == phase, (name, status.phase, error)
        assert error is not None and error.error_class == error_class, (name, error)
        for phrase in phrases:
            assert phrase in error.message, (name, error.message)
        # Names the campaign's Event for the reason, which the operator's pass counts it in (no
        # operator here): workers post no Event of their own.
        assert error.event == series_name(shards[name].spec.campaign, status.history[-1].reason), (
            name,
            error,
        )
        assert status.history[-1].reason == ("Blocked" if phase == "Blocked" else "Failed")
        assert status.result is None and status.owner is None
        table.append(f"  {name}: {phase} attempt {status.attempt} {error_class}: {error.message[:90]}")

    # Retryable: attempt 1 backed off to Pending (notBefore), attempt 2 was the last one.
    limited = [(h.reason, h.attempt) for h in shards["faults-00003"].current_status.history]
    assert limited == [
        ("Materialized", 1),
        ("Claimed", 1),
        ("AttemptFailed", 1),
        ("Claimed", 2),
        ("Blocked", 2),
    ]
    for name in expected:
        if name != "faults-00003":
            assert [h.reason for h in shards[name].current_status.history][-2:] == ["Claimed", "Failed"]

    # Nothing half-written: no shard result at all; item results only where an item really finished.
    assert kit.result_configmaps(kube, namespace) == []
    assert kit.attempt_configmaps(kube, namespace) == []
    with_items = {
        c["metadata"]["annotations"]["shardops.dev/idempotency-key"]
        for c in kit.items_configmaps(kube, namespace)
    }
    over_budget_key = shards["faults-00004"].spec.idempotency_key
    assert with_items <= {over_budget_key}, with_items
    print("\nfailures:\n" + "\n".join(table))
