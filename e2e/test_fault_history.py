"""A recorded run passes the fault checker: 40 one-item shards, maxConcurrency 4, leaseSeconds 10, the
S3 store (so Done shards fold), and one worker frozen (SIGSTOP) past its lease while it holds a
shard, then thawed. Every write to Shards, Campaign status and Leases in the test's namespace is
read back from the API server's audit log (testbed/faults/history.py) and checked offline
(testbed/faults/checker.py): no violation, and the fault was exercised (a claim taken over from the
frozen worker, its late writes refused)."""

from __future__ import annotations

from collections import Counter

import pytest
from testbed.bed import Bed
from testbed.cluster import lifecycle
from testbed.faults import checker, inject
from testbed.faults.recording import AuditTail

from shardops.k8s.api import SHARDS, NotFound

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

ITEMS = 40
CONCURRENCY = 4
IDENTITIES = checker.Identities(
    operator_accounts=frozenset({Bed.OPERATOR_NAME}),
    worker_accounts=frozenset({Bed.chart.worker_service_account()}),
)


def test_a_run_with_a_worker_frozen_past_its_lease_passes_the_checker(
    history_bed: Bed, object_store: lifecycle.ObjectStore, audit_tail: AuditTail
) -> None:
    bed = history_bed  # its writes are audited with their bodies
    kube = bed.kube
    store_env = bed.s3_store_env(object_store, f"e2e-{bed.namespace}")
    body = bed.campaign_body(
        "faults",
        [{"n": i, "latency": 2.0} for i in range(ITEMS)],
        shardSize=1,
        maxConcurrency=CONCURRENCY,
        leaseSeconds=bed.LEASE_SECONDS,
    )
    with bed.operator(env=store_env):
        bed.create_campaign(body)
        shard, owner, pid = bed.wait_for(
            "a worker holding a shard",
            lambda: next(iter(inject.held_shards(kube, bed.cluster, bed.namespace, "faults")), None),
            120,
        )
        bed.stop_group(pid)

        def taken_over() -> bool:
            try:
                status = kube.get(SHARDS, bed.namespace, shard).get("status") or {}
            except NotFound:  # completed by its new owner and folded
                return True
            # Done (its owner gone with the claim), or claimed by another worker: the frozen one comes
            # back as a stale holder.
            new_owner = status.get("owner")
            return status.get("phase") == "Done" or (new_owner is not None and new_owner != owner)

        try:
            bed.wait_for(f"{shard} to be claimed away from its frozen owner {owner}", taken_over, timeout=90)
        finally:
            bed.continue_group(pid)
        final = bed.wait_phase("faults", {"Succeeded", "Completed"}, timeout=300)
        bed.wait_for(
            "every worker to exit", lambda: not inject.worker_pids(bed.cluster, bed.namespace, "faults"), 120
        )
        history = audit_tail.history(bed.namespace)

    tally: Counter[str] = Counter()
    violations = checker.check(history, IDENTITIES, tally)
    frozen_refused = [w for w in history.failed_writes if w.agent_identity == owner]
    print(
        f"\n{ITEMS} one-item shards, maxConcurrency {CONCURRENCY}, leaseSeconds {bed.LEASE_SECONDS}; worker "
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
