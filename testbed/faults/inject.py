"""Finding the processes to fault in a running campaign: its worker containers' pids (the
process-kubelet names a container `process://<pid>`) and which of them holds a Running shard."""

from __future__ import annotations

from kubernetes import client

from shardops.api.names import CAMPAIGN_LABEL
from shardops.k8s.api import SHARDS, Kube
from testbed.harness import Cluster


def worker_pids(cluster: Cluster, namespace: str, campaign: str) -> dict[str, int]:
    """Pod name -> pid of each running worker container of `campaign`."""
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}"
    )
    return {
        pod.metadata.name: int(status.container_id.removeprefix("process://"))
        for pod in pods.items
        for status in pod.status.container_statuses or []
        if status.state and status.state.running and status.container_id
    }


def held_shards(kube: Kube, cluster: Cluster, namespace: str, campaign: str) -> list[tuple[str, str, int]]:
    """(shard, owner, pid of the owner's pod) of each Running shard whose worker is running; the
    window bounds the list (Shards of one campaign that are not folded)."""
    pids = worker_pids(cluster, namespace, campaign)
    held = []
    for shard in kube.list(SHARDS, namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}"):
        status = shard.get("status") or {}
        owner = status.get("owner") or ""
        if status.get("phase") != "Running":
            continue
        for pod, pid in pids.items():
            if owner.startswith(f"{pod}-"):
                held.append((shard["metadata"]["name"], owner, pid))
    return held
