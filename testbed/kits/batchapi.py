"""The Batch API service in an e2e test: the chart's ServiceAccount and RBAC for it, and a
Deployment of `shardops batch-api` on the process-kubelet listening on loopback (as the operator
runs: schedulerkit.operator_running), so the test's `openai` client reaches it at 127.0.0.1; and the
tenants' ServiceAccount tokens it authenticates."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from testbed.cluster.lifecycle import free_port
from testbed.harness import Cluster, wait_for
from testbed.kits import chart as chartkit

SERVICE_NAME = "shardops-batch-api"
TEMPLATE = "templates/batch-api.yaml"
DEPLOYED_KINDS = frozenset({"Deployment", "Service"})  # the kit runs its own loopback Deployment


@dataclass
class BatchApi:
    cluster: Cluster
    namespace: str
    base_url: str

    def pods(self) -> list[client.V1Pod]:
        core = client.CoreV1Api(self.cluster.api)
        pods = core.list_namespaced_pod(self.namespace, label_selector=f"app={SERVICE_NAME}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def pid(self) -> int:
        """The running service process (the process-kubelet's containerID)."""
        for pod in self.pods():
            for status in pod.status.container_statuses or []:
                if status.state and status.state.running and status.container_id:
                    return int(status.container_id.removeprefix("process://"))
        raise AssertionError("no running Batch API process")

    def memory_kib(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) of the service process in KiB: now, and the peak since it started."""
        fields = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{self.pid()}/status").read_text().splitlines()
            if ":" in line
        )
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url.removesuffix('/v1')}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        core = client.CoreV1Api(self.cluster.api)
        return "\n".join(
            str(core.read_namespaced_pod_log(p.metadata.name, self.namespace)) for p in self.pods()
        )


def service_deployment(namespace: str, service_account: str, env: Mapping[str, str]) -> dict[str, Any]:
    labels = {"app": SERVICE_NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": SERVICE_NAME, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": service_account,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": "batch-api",
                            "image": "shardops:e2e",
                            "command": ["shardops", "batch-api"],
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                        }
                    ],
                },
            },
        },
    }


@contextlib.contextmanager
def batch_api_running(
    cluster: Cluster,
    namespace: str,
    tenants: Sequence[str],
    *,
    source: tuple[str, str],
    store_env: Mapping[str, str],
    shard_size: int = 10,
    max_concurrency: int = 2,
) -> Iterator[BatchApi]:
    """The chart's batch-api ServiceAccount and RBAC (its campaigns rules bound in `tenants`), and
    the service in `namespace` on a free loopback port, healthy before this yields."""
    kind, name = source
    values = {
        "batchAPI": {"enabled": True, "sourceRef": {"kind": kind, "name": name}},
        "resultStore": {"type": "S3", "s3": {"bucket": store_env["SHARDOPS_S3_BUCKET"]}},
        "watch": {"namespaces": list(tenants)},
        "workers": {"allowReleaseNamespace": True},
    }
    rendered = chartkit.render(namespace, values, show_only=[TEMPLATE])
    objects = [o for o in rendered if o["kind"] not in DEPLOYED_KINDS]
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    port = free_port()
    env = {
        **store_env,
        "SHARDOPS_BATCH_API_HOST": "127.0.0.1",
        "SHARDOPS_BATCH_API_PORT": str(port),
        "SHARDOPS_BATCH_API_SOURCE_KIND": kind,
        "SHARDOPS_BATCH_API_SOURCE_NAME": name,
        "SHARDOPS_BATCH_API_WORKER_IMAGE": "shardops:e2e",
        "SHARDOPS_BATCH_API_SHARD_SIZE": str(shard_size),
        "SHARDOPS_BATCH_API_MAX_CONCURRENCY": str(max_concurrency),
    }
    cluster.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump_all([*objects, service_deployment(namespace, account, env)])
    )
    service = BatchApi(cluster, namespace, f"http://127.0.0.1:{port}/v1")
    try:
        wait_for("the Batch API to answer /healthz", service.healthy, timeout=90)
        yield service
    finally:
        log = service.log()
        errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
        if errors:
            print(f"\n--- batch API: {len(errors)} error line(s), last ones:\n" + "\n".join(errors[-10:]))
        cluster.kubectl(
            "delete", "deployment", SERVICE_NAME, "-n", namespace, "--ignore-not-found", "--wait=false"
        )
        chartkit.delete_cluster_scoped(cluster, objects)


def tenant_token(cluster: Cluster, namespace: str, name: str, *, may_create_campaigns: bool = True) -> str:
    """A token of ServiceAccount `name` in `namespace` (`kubectl create token`, as a user gets one),
    the account made with a Role that lets it create Campaigns there unless told otherwise."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
    ]
    if may_create_campaigns:
        objects += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": f"{name}-batches", "namespace": namespace},
                "rules": [{"apiGroups": ["shardops.dev"], "resources": ["campaigns"], "verbs": ["create"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{name}-batches", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": f"{name}-batches",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    return str(cluster.kubectl("create", "token", name, "-n", namespace, "--duration=30m").stdout.strip())
