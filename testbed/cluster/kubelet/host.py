"""The node's host: the one address every pod shares, its capacity and labels, the Node status.

Requests and limits are not enforced: the capacity is only what the Node reports and what
`resourceFieldRef` limits default to.
"""

from __future__ import annotations

import platform
import socket
import uuid
from pathlib import Path
from typing import Any

HOST_IP = "127.0.0.1"
POD_IP = HOST_IP
NODE_CAPACITY = {"cpu": "2", "memory": "24Gi", "pods": "110"}


def node_labels(node_name: str) -> dict[str, str]:
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine(), platform.machine()
    )
    return {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": arch,
    }


def node_status(
    node_name: str, kubelet_version: str, ready_since: str, now: str, kubelet_port: int | None = None
) -> dict[str, Any]:
    def condition(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": ready_since,
        }

    labels = node_labels(node_name)
    return {
        "capacity": dict(NODE_CAPACITY),
        "allocatable": dict(NODE_CAPACITY),
        "conditions": [
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition(
                "PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"
            ),
            condition("Ready", "True", "KubeletReady", "process-kubelet is posting ready status"),
        ],
        # kube-apiserver reaches the kubelet API (container logs) at the InternalIP: it is started
        # with --kubelet-preferred-address-types=InternalIP, as the Hostname resolves nowhere.
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": node_name}],
        **({"daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}}} if kubelet_port else {}),
        "nodeInfo": {
            "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, socket.gethostname()).hex,
            "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, node_name)),
            "bootID": _boot_id(),
            "kernelVersion": platform.release(),
            "osImage": f"process-kubelet on {platform.system()}",
            "containerRuntimeVersion": "process://local",
            "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": labels["kubernetes.io/arch"],
        },
    }


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
