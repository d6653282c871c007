"""A recorded run passes the fault checker: 40 one-item shards, maxConcurrency 4, leaseSeconds 10, the
S3 store (so Done shards fold), and one worker frozen (SIGSTOP) past its lease while it holds a
shard, then thawed. Every write to Shards, Campaign status and Leases in the test's namespace is
read back from the API server's audit log (testbed/faults/history.py) and checked offline
(testbed/faults/checker.py): no violation, and the fault was exercised (a claim taken over from the
frozen worker, its late writes refused)."""

from __future__ import annotations

from collections import Counter

import pytest
from testbed.cluster import lifecycle
from testbed.faults import checker, inject
from testbed.faults.recording import AuditTail
from testbed.harness import Cluster, wait_for
from testbed.kits import chart as chartkit
from testbed.kits.scheduler import (
    LEASE_SECONDS,
    OPERATOR_NAME,
    campaign_body,
    continue_group,
    create_campaign,
    kube_for,
    operator_running,
    s3_store_env,
    stop_group,
    wait_phase,
)

from shardops.k8s.api import SHARDS, NotFound

pytestmark = pytest.mark.usefixtures("crds_installed")

ITEMS = 40
CONCURRENCY = 4
IDENTITIES = checker.Identities(
    operator_accounts=frozenset({OPERATOR_NAME}),
    worker_accounts=frozenset({chartkit.worker_service_account()}),
)


def test_a_run_with_a_worker_frozen_past_its_lease_passes_the_checker(
    local_cluster: Cluster, history_namespace: str, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    namespace = history_namespace  # its writes are audited with their bodies
    kube = kube_for(local_cluster)
    store_env = s3_store_env(local_cluster, namespace, object_store, f"e2e-{namespace}")
    body = campaign_body(
        "faults",
        [{"n": i, "latency": 2.0} for i in range(ITEMS)],
        shardSize=1,
        maxConcurrency=CONCURRENCY,
        leaseSeconds=LEASE_SECONDS,
    )
    with operator_running(local_cluster, namespace, env=store_env):
        create_campaign(kube, namespace, body)
        shard, owner, pid = wait_for(
            "a worker holding a shard",
            lambda: next(iter(inject.held_shards(kube, local_cluster, namespace, "faults")), None),
            120,
        )
        stop_group(pid)

        def taken_over() -> bool:
            try:
                status = kube.get(SHARDS, namespace, shard).get("status") or {}
            except NotFound:  # completed by its new owner and folded
                return True
            # Done (its owner gone with the claim), or claimed by another worker: the frozen one comes
            # back as a stale holder.
            new_owner = status.get("owner")
            return status.get("phase") == "Done" or (new_owner is not None and new_owner != owner)

        try:
            wait_for(f"{shard} to be claimed away from its frozen owner {owner}", taken_over, timeout=90)
        finally:
            continue_group(pid)
        final = wait_phase(kube, namespace, "faults", {"Succeeded", "Completed"}, timeout=300)
        wait_for(
            "every worker to exit", lambda: not inject.worker_pids(local_cluster, namespace, "faults"), 120
        )
        history = audit_tail.history(namespace)

    tally: Counter[str] = Counter()
    violations = checker.check(history, IDENTITIES, tally)
    frozen_refused = [w for w in history.failed_writes if w.agent_identity == owner]
    print(
        f"\n{ITEMS} one-item shards, maxConcurrency {CONCURRENCY}, leaseSeconds {LEASE_SECONDS}; worker "
        f"{owner} frozen holding {shard}, thawed after it was taken over; campaign "
        f"{final['status']['phase']}. Checked: "
        + ", ".join(f"{name} {count}" for name, count in sorted(tally.items()))
        + f"; the frozen worker's refused writes {len(frozen_refused)}; violations {len(violations)}"
    )
    for violation in violations:
        print(f"  {violation}")
    assert not violations, "\n".join(map(str, violations))
    # The fault was exercised: the frozen claim was judged lost, and its holder's late write refused.
    assert tally["lost-holder charges"] >= 1 and tally["folded shards"] >= 1, tally
    assert frozen_refused, "the thawed worker wrote nothing: the fence was not exercised"
