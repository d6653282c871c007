"""Bed: one e2e test's view of the cluster under test, as one object.

A test asks for the `bed` fixture (e2e/conftest.py; with `local_cluster` too when it needs the
local control plane's audit log or process-kubelet, or `history_bed` for a history namespace)
instead of importing a list of names from the kits: what it does in its namespace is a method
(`bed.apply_campaign(...)`, `bed.wait_phase(...)`, `bed.operator()`), and the kits' questions about
objects, their constants and the process-group signals are attributes of the class
(`bed.phase_of(shard)`, `bed.LEASE_SECONDS`). The chart and worker kits are there whole, for what
only a few tests use (`bed.chart.render(...)`, `bed.workers.worker_pool(...)`).

The kits stay plain functions of (cluster or kube, namespace): the benchmarks use them directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shardops.api.common import JSON
from shardops.k8s.api import Kube
from shardops.store.records import StoredResult
from testbed import harness
from testbed.cluster import lifecycle
from testbed.harness import Cluster
from testbed.kits import chart as chartkit
from testbed.kits import scheduler as schedulerkit
from testbed.kits import worker as workerkit


@dataclass
class Bed:
    """The cluster under test and one test's namespace, with what the kits do there."""

    cluster: Cluster
    namespace: str

    # The kits whole, for what only a few tests use.
    chart = chartkit
    scheduler = schedulerkit
    workers = workerkit

    # Constants of the e2e settings (testbed/kits/scheduler.py says why each is what it is).
    REPO_ROOT = harness.REPO_ROOT
    OPERATOR_NAME = schedulerkit.OPERATOR_NAME
    LEADER_LEASE = schedulerkit.LEADER_LEASE
    TERMINAL = frozenset(schedulerkit.TERMINAL)
    LEASE_SECONDS = schedulerkit.LEASE_SECONDS
    HEARTBEAT_SECONDS = schedulerkit.HEARTBEAT_SECONDS
    STALE_READ_GRACE = schedulerkit.STALE_READ_GRACE
    HOLD_WINDOW = schedulerkit.HOLD_WINDOW
    STORE_SECRET = schedulerkit.STORE_SECRET

    # Questions about objects and histories (pure), and the harness's helpers.
    wait_for = staticmethod(harness.wait_for)
    dump_json = staticmethod(harness.dump_json)
    objects_in = staticmethod(harness.objects_in)
    campaign_body = staticmethod(schedulerkit.campaign_body)
    agent_env = staticmethod(schedulerkit.agent_env)
    phase_of = staticmethod(schedulerkit.phase_of)
    condition = staticmethod(schedulerkit.condition)
    history = staticmethod(schedulerkit.history)
    reasons = staticmethod(schedulerkit.reasons)
    parse_time = staticmethod(schedulerkit.parse_time)
    now = staticmethod(schedulerkit.now)
    running_intervals = staticmethod(schedulerkit.running_intervals)
    max_overlap = staticmethod(schedulerkit.max_overlap)
    phase_counts = staticmethod(schedulerkit.phase_counts)
    writes_by_shard = staticmethod(schedulerkit.writes_by_shard)
    worker_transitions = staticmethod(schedulerkit.worker_transitions)
    print_writes_table = staticmethod(schedulerkit.print_writes_table)
    # A container's process group (the process-kubelet's `process://<pid>`): kill, freeze, thaw.
    kill_group = staticmethod(schedulerkit.kill_group)
    stop_group = staticmethod(schedulerkit.stop_group)
    continue_group = staticmethod(schedulerkit.continue_group)

    @cached_property
    def kube(self) -> Kube:
        """An admin client of the cluster under test."""
        return schedulerkit.kube_for(self.cluster)

    @property
    def local(self) -> bool:
        return self.cluster.local is not None

    def namespaced(self, namespace: str) -> Bed:
        """The same cluster, another namespace (a test that spans two)."""
        return Bed(self.cluster, namespace)

    # --- the operator ------------------------------------------------------------------------

    def operator(
        self, *, replicas: int = 1, lease_seconds: int = 10, env: Mapping[str, str] | None = None
    ) -> contextlib.AbstractContextManager[schedulerkit.Operator]:
        """The chart's RBAC and an operator Deployment in this namespace, leading before it yields."""
        return schedulerkit.operator_running(
            self.cluster, self.namespace, replicas=replicas, lease_seconds=lease_seconds, env=env
        )

    def s3_store_env(self, store: lifecycle.ObjectStore, prefix: str) -> dict[str, str]:
        """Operator settings whose default result store is `store`, its Secret created here."""
        return schedulerkit.s3_store_env(self.cluster, self.namespace, store, prefix)

    def recording(self, *kinds: str) -> contextlib.AbstractContextManager[dict[str, schedulerkit.Recorder]]:
        """Watch recorders of `kinds` ("shards", "jobs", ...) in this namespace while inside."""
        return schedulerkit.recording(self.cluster, self.namespace, *kinds)

    # --- campaigns and shards ------------------------------------------------------------------

    def create_campaign(self, body: JSON) -> JSON:
        return schedulerkit.create_campaign(self.kube, self.namespace, body)

    def apply_campaign(self, name: str, items: Sequence[JSON], **spec: Any) -> JSON:
        """Create the campaign `campaign_body(name, items, **spec)` makes (the e2e defaults)."""
        return self.create_campaign(schedulerkit.campaign_body(name, items, **spec))

    def get_campaign(self, name: str) -> JSON:
        return schedulerkit.get_campaign(self.kube, self.namespace, name)

    def patch_spec(self, name: str, spec: JSON) -> JSON:
        return schedulerkit.patch_spec(self.kube, self.namespace, name, spec)

    def campaign_phase(self, name: str) -> str | None:
        return schedulerkit.campaign_phase(self.kube, self.namespace, name)

    def wait_phase(self, name: str, phases: set[str], timeout: float = 180) -> JSON:
        """The campaign once its phase is one of `phases` (fails after `timeout` seconds)."""
        return schedulerkit.wait_phase(self.kube, self.namespace, name, phases, timeout)

    def shards(self) -> list[JSON]:
        """Every Shard in this namespace (one campaign's: `campaign_shards`)."""
        return schedulerkit.shards_of(self.kube, self.namespace)

    def shard_phase(self, name: str) -> str | None:
        """The shard's phase, or None while it does not exist yet (a probe for `wait_for`)."""
        return schedulerkit.shard_phase(self.kube, self.namespace, name)

    def campaign_shards(self, name: str, store: lifecycle.ObjectStore | None) -> list[JSON]:
        """Every shard of the campaign, those folded into its ledger rebuilt from their records."""
        return schedulerkit.campaign_shards(self.kube, self.namespace, name, store)

    def committed_result(self, shard: JSON) -> StoredResult:
        """The committed result of the shard's key (ConfigMap store), waited for and verified."""
        return schedulerkit.committed_result(self.kube, self.namespace, shard)

    def campaign_events(self, campaign: str, reason: str) -> list[JSON]:
        """The Events with `reason` regarding the Campaign (for its shards' transitions: one series)."""
        return schedulerkit.campaign_events(self.kube, self.namespace, campaign, reason)

    def wait_campaign_events(self, campaign: str, reason: str, count: int, timeout: float = 30) -> list[JSON]:
        """`campaign_events` once one counts at least `count` occurrences (its series trails the status)."""
        return schedulerkit.wait_campaign_events(self.kube, self.namespace, campaign, reason, count, timeout)

    def audit_entries(self) -> list[JSON]:
        """This namespace's completed requests in the local control plane's audit log."""
        return schedulerkit.audit_entries(self.cluster, self.namespace)
