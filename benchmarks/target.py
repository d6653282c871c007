"""The cluster under measurement: the local control plane (testbed/cluster/lifecycle.py) or the one
KUBECONFIG names, with what the benchmarks read of it (process CPU and memory, etcd's size, object
counts, the audit log) and the operator installed the way the operator e2e tests install it.

Figures that only the local control plane can give (the audit log, the agent's ledger file, /proc
of the control-plane processes and pods) are None on another cluster, and reported as such.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from testbed.cluster import lifecycle
from testbed.harness import REPO_ROOT, Cluster, create_namespace, external_kubeconfig, install_crds, wait_for
from testbed.kits import scheduler as schedulerkit

from shardops.k8s.api import Kube, Resource
from shardops.scheduler.settings import OperatorSettings

JSON = dict[str, Any]
FIELD_MANAGER = "shardops-bench"
# The user agent of the benchmark's own requests, which the API cost leaves out (benchmarks/audit.py).
USER_AGENT = "shardops-bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Images are recorded, never pulled, by the process-kubelet; another cluster needs a real one.
DEFAULT_IMAGE = "shardops:e2e"


def operator_env() -> dict[str, str]:
    """The operator's own defaults (what a user who sets nothing gets), spelled out because the e2e
    helper that starts it shortens them for tests."""
    fields = OperatorSettings.model_fields
    return {
        "SHARDOPS_TICK_SECONDS": str(fields["tick_seconds"].default),
        "SHARDOPS_LEADER_ELECTION_RENEW_SECONDS": str(fields["leader_election_renew_seconds"].default),
        "SHARDOPS_LEADER_ELECTION_RETRY_SECONDS": str(fields["leader_election_retry_seconds"].default),
    }


def default_leader_lease_seconds() -> int:
    return int(OperatorSettings.model_fields["leader_election_lease_seconds"].default)


@dataclass(frozen=True)
class ProcessStat:
    """CPU seconds and memory of one process, from /proc."""

    cpu_seconds: float
    children_cpu_seconds: float
    rss_bytes: int
    peak_rss_bytes: int


def stat_fields(directory: Path) -> list[str]:
    """The fields of a process's `stat` file (`directory`: /proc/PID) after its command name, which
    may hold spaces and parentheses: utime, stime, cutime, cstime are the 12th..15th, starttime the
    20th. OSError when the process is gone."""
    return (directory / "stat").read_text().rsplit(")", 1)[1].split()


def process_stat(pid: int) -> ProcessStat | None:
    try:
        fields = stat_fields(Path(f"/proc/{pid}"))
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])

    def kib(name: str) -> int:
        match = re.search(rf"^{name}:\s+(\d+) kB", status, re.MULTILINE)
        return int(match.group(1)) * 1024 if match else 0

    return ProcessStat(
        (utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS, kib("VmRSS"), kib("VmHWM")
    )


@dataclass
class Target:
    cluster: Cluster
    kube: Kube
    work_dir: Path
    image: str = DEFAULT_IMAGE
    namespaces: list[str] = field(default_factory=list)

    @property
    def local(self) -> lifecycle.LocalCluster | None:
        return self.cluster.local

    @property
    def kind(self) -> str:
        return (
            "local control plane (testbed/cluster)" if self.local else f"KUBECONFIG {self.cluster.kubeconfig}"
        )

    # --- namespaces and the operator ---------------------------------------------------------------

    def namespace(self, prefix: str) -> str:
        name = create_namespace(self.cluster, prefix)
        self.namespaces.append(name)
        return name

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(self.cluster.api).delete_namespace(name, propagation_policy="Background")

    @contextlib.contextmanager
    def operator(
        self, namespace: str, replicas: int = 1, env: Mapping[str, str] | None = None
    ) -> Iterator[schedulerkit.Operator]:
        """The operator as the e2e tests run it (chart RBAC + a Deployment), with its default settings."""
        settings = {**operator_env(), **self.store_env(namespace), **(env or {})}
        with schedulerkit.operator_running(
            self.cluster,
            namespace,
            replicas=replicas,
            lease_seconds=default_leader_lease_seconds(),
            env=settings,
        ) as operator:
            operator.kube.api_client.user_agent = USER_AGENT
            try:
                yield operator
            finally:
                # Stopped before the next scenario, so that it costs nothing there.
                self.cluster.kubectl(
                    "delete",
                    "deployment",
                    schedulerkit.OPERATOR_NAME,
                    "-n",
                    namespace,
                    "--wait=false",
                    check=False,
                )
                wait_for("the operator pods to stop", lambda: not operator.pods(), timeout=60)

    def store_env(self, namespace: str) -> dict[str, str]:
        """Results in the cluster's S3 store when it has one (what a campaign of this size needs: the
        ConfigMap store stops at 1,000 shards), under a prefix of the namespace's own."""
        if self.cluster.object_store is None:
            return {}
        return schedulerkit.s3_store_env(
            self.cluster, namespace, self.cluster.object_store, self.store_prefix(namespace)
        )

    @staticmethod
    def store_prefix(namespace: str) -> str:
        """The S3 prefix of the namespace's results; its keys reach `<prefix>/<namespace>/` only."""
        return f"bench-{namespace}"

    # --- what only the local control plane shows ---------------------------------------------------

    def component_pids(self) -> dict[str, int]:
        if self.local is None:
            return {}
        return {name: process.pid for name, process in self.local.processes.items() if process.poll() is None}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each control-plane process; 'pods' is what exited pod processes
        used (the kubelet reaps them, so it is the kubelet's children's time)."""
        found: dict[str, float] = {}
        for name, pid in self.component_pids().items():
            stat = process_stat(pid)
            if stat is None:
                continue
            found[name] = stat.cpu_seconds
            if name == "kubelet":
                found["pods"] = stat.children_cpu_seconds
        times = os.times()
        found["bench"] = times.user + times.system
        return found

    def etcd_bytes(self) -> int | None:
        return self.cluster.etcd_bytes()

    def count(self, resource: Resource, namespace: str) -> int:
        """Objects of `resource` in `namespace`: one list of one item and the server's remaining count."""
        page = self.kube.request("GET", resource.path(namespace), query={"limit": 1})
        items = len(page.get("items") or [])
        remaining = int((page.get("metadata") or {}).get("remainingItemCount") or 0)
        return items + remaining

    def versions(self) -> dict[str, str]:
        found: dict[str, str] = {}
        with contextlib.suppress(Exception):
            info = client.VersionApi(self.cluster.api).get_code()
            found["kube-apiserver"] = str(info.git_version)
        versions_env = lifecycle.CLUSTER_DIR / "versions.env"
        for line in versions_env.read_text().splitlines():
            if line.startswith("ETCD_VERSION=") and self.local:
                found["etcd"] = line.split("=", 1)[1]
        kubectl = self.cluster.kubectl("version", "--client", "-o", "json", check=False)
        with contextlib.suppress(ValueError, KeyError):
            found["kubectl"] = json.loads(kubectl.stdout)["clientVersion"]["gitVersion"]
        return found


def _target(cluster: Cluster, work_dir: Path, image: str = DEFAULT_IMAGE) -> Target:
    cluster.api.user_agent = USER_AGENT
    kube = Kube.from_environment(FIELD_MANAGER, str(cluster.kubeconfig))
    kube.api_client.user_agent = USER_AGENT
    return Target(cluster, kube, work_dir, image)


@contextlib.contextmanager
def acquire(work_dir: Path) -> Iterator[Target]:
    """The local control plane (started fresh under `work_dir`) or the KUBECONFIG cluster."""
    work_dir.mkdir(parents=True, exist_ok=True)
    image = os.environ.get("BENCH_IMAGE", DEFAULT_IMAGE)
    external = external_kubeconfig()
    if external is not None:
        api = config.new_client_from_config(str(external))
        cluster = Cluster(
            external, lifecycle.bin_dir(), api, None, lifecycle.ObjectStore.from_env(os.environ)
        )
        install_crds(cluster)
        yield _target(cluster, work_dir, image)
        return
    directory = work_dir / "cluster"
    shutil.rmtree(directory, ignore_errors=True)
    with lifecycle.running_cluster(directory) as local:
        api = config.new_client_from_config(str(local.kubeconfig))
        # With its S3 store: campaigns of this size need it (the ConfigMap store stops at 1,000 shards).
        cluster = Cluster(local.kubeconfig, local.binaries, api, local, local.object_store)
        install_crds(cluster)
        try:
            yield _target(cluster, work_dir, image)
        finally:
            api.close()


def for_cluster(cluster: Cluster, work_dir: Path) -> Target:
    """A Target on a cluster someone else started (the e2e session's, for the smoke test)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    return _target(cluster, work_dir)


# What a run writes itself: a tree changed only there is the tree that was measured.
BENCH_OUTPUTS = ("benchmarks/results",)


def git_revision() -> str:
    """The commit measured, `-dirty` when tracked files other than the run's own outputs differ."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
        )
        return result.stdout.strip()

    revision = git("describe", "--always", "--abbrev=12")
    if not revision:
        return "unknown"
    excluded = [f":(exclude){path}" for path in BENCH_OUTPUTS]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded)
    return f"{revision}-dirty" if changed else revision
