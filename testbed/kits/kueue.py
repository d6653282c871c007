"""Kueue objects for the e2e tests (testbed/cluster/kueue.py runs Kueue): a ResourceFlavor, a
ClusterQueue whose quota counts pods, a LocalQueue, and what Kueue says of a Job's Workload."""

from __future__ import annotations

import json
from typing import Any

from testbed.harness import Cluster

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The flavor every test queue hands out: the process-kubelet's one node has no labels to tell
# flavors apart.
FLAVOR = "e2e-default-flavor"


def resource_flavor() -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}


def cluster_queue(name: str, *, pods: int, cohort: str | None = None) -> dict[str, Any]:
    """A ClusterQueue admitting at most `pods` pods at once (Kueue counts the `pods` resource of each
    Workload), open to every namespace."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["pods"],
                "flavors": [{"name": FLAVOR, "resources": [{"name": "pods", "nominalQuota": pods}]}],
            }
        ],
    }
    if cohort is not None:
        spec["cohortName"] = cohort
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(items))


def delete(cluster: Cluster, *objects: dict[str, Any]) -> None:
    """Best effort, not waiting: a ClusterQueue goes once its Workloads have (with their namespace)."""
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=json.dumps(items), check=False
    )


def active(cluster: Cluster, *names: str) -> bool:
    """Every ClusterQueue named is Active: Kueue knows its flavors and admits to it from now on."""
    for name in names:
        queue = json.loads(cluster.kubectl("get", "clusterqueue", name, "-o", "json").stdout)
        if (condition(queue, "Active") or {}).get("status") != "True":
            return False
    return True


def workloads(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    listed = cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
    found: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return found


def conditions(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(found) for found in (workload.get("status") or {}).get("conditions") or []]


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in conditions(workload):
        if found.get("type") == kind:
            return found
    return None


def admitted(workload: dict[str, Any], cluster_queue: str | None = None) -> bool:
    """Admitted now (to `cluster_queue` when given: a Workload of another ClusterQueue, such as a
    finished test's Job in a namespace still being deleted, holds none of its quota)."""
    found = condition(workload, "Admitted")
    if found is None or found.get("status") != "True":
        return False
    admission = (workload.get("status") or {}).get("admission") or {}
    return cluster_queue is None or admission.get("clusterQueue") == cluster_queue
