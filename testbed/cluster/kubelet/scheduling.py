"""Which pods this node's scheduler binds, and where (pure); node.py does the binding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.cluster.kubelet.pod_status import TERMINAL_PHASES, is_deleting

DEFAULT_SCHEDULER = "default-scheduler"


def wants_binding(pod: Mapping[str, Any]) -> bool:
    """Whether the default scheduler would consider this pod (we are that scheduler)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or is_deleting(pod):
        return False
    if (spec.get("schedulerName") or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return False
    if spec.get("schedulingGates"):
        return False
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def node_selector_matches(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(key) == value for key, value in selector.items())
