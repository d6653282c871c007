"""Process-kubelet: the kubelet (and scheduler) of the local e2e control plane, running pods as processes.

The local control plane (e2e/cluster/lifecycle.py) is a real kube-apiserver, kube-controller-manager
and etcd, but the machines it runs on have no container runtime. This program plays the kubelet of
one node and, since there is no kube-scheduler either, the scheduler too:

    python -m e2e.cluster.kubelet --kubeconfig ADMIN_KUBECONFIG --node-name local-node \\
        --state-dir DIR [--python PATH]

It runs until SIGTERM/SIGINT, then stops every pod process (SIGTERM, grace period, SIGKILL) and exits.

What it does:

* registers the Node (Ready, cpu 2 / memory 24Gi / 110 pods, InternalIP 127.0.0.1) and keeps it
  alive: a node Lease in kube-node-lease renewed every 10 s, NodeReady heartbeats, and removal of
  the not-ready/unreachable taints nobody else would remove;
* binds every unscheduled pod meant for the default scheduler to that node (pods/binding);
* runs each pod's containers as local process groups: init containers one after the other (native
  sidecars, i.e. init containers with restartPolicy Always, keep running), then all containers;
  honours restartPolicy (with a small, capped back-off), readiness probes (httpGet, tcpSocket, exec),
  activeDeadlineSeconds and graceful deletion (SIGTERM to the process group, grace period, SIGKILL),
  then removes the pod object like a kubelet does (delete with gracePeriodSeconds=0);
* gives each pod the identity of its service account (unless automountServiceAccountToken is
  false): a pod-bound token from the TokenRequest API, written as a kubeconfig ($KUBECONFIG) and as
  the usual token / ca.crt / namespace files ($SHARDOPS_SA_DIR) under DIR/pods/<uid>/, refreshed at
  80% of its lifetime, so RBAC applies to pods exactly as in a real cluster;
* reports pod status the way the Job, ReplicaSet and Deployment controllers need it.

Differences from a real kubelet, by necessity or on purpose:

* Images are recorded in the status but never pulled or used. A container runs `command + args`
  on this machine, with the host's filesystem and tools; the directory of --python comes first on
  PATH, so `python` and the venv's console scripts resolve to the test venv. A container without
  `command` cannot fall back to its image's entrypoint: the pod fails with reason
  ImageEntrypointUnsupported.
* No isolation. Every pod shares the host network (podIP = hostIP = 127.0.0.1, hostPort is ignored,
  two pods listening on the same port conflict), the filesystem, the users and the resources;
  requests and limits are not enforced.
* Volumes are not mounted; the service account files are the only exception, and they live in
  $SHARDOPS_SA_DIR, not /var/run/secrets/kubernetes.io/serviceaccount. workingDir is used when it
  exists on this machine, otherwise the pod's state directory DIR/pods/<uid>.
* The environment is the kubelet's own (minus KUBECONFIG and in-cluster discovery variables) plus
  the container's env/envFrom, HOSTNAME=<pod name> and PYTHONUNBUFFERED=1 (so logs are live).
* Scheduling looks only at schedulerName, schedulingGates, nodeSelector and spec.unschedulable;
  affinity, taints/tolerations and resource fit are ignored (there is only one node anyway).
* No liveness or startup probes, lifecycle hooks, ephemeral containers or kubelet API (so no
  `kubectl logs/exec/port-forward`). Logs are files: DIR/logs/<namespace>/<pod>/<container>.log
  (stdout and stderr, appended across restarts and across pods that reuse a name); see
  pod_log_path().
* A restarted kubelet does not adopt processes: it kills the ones it recorded for pods it finds
  running (pid files) and marks those pods Failed with reason KubeletRestarted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import http.client
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("process-kubelet")

HOST_IP = "127.0.0.1"
POD_IP = HOST_IP
NODE_CAPACITY = {"cpu": "2", "memory": "24Gi", "pods": "110"}
LEASE_NAMESPACE = "kube-node-lease"
HEARTBEAT_SECONDS = 10.0
# What a real kubelet uses: four missed renewals before the lease counts as expired.
LEASE_DURATION_SECONDS = 40
TOKEN_EXPIRATION_SECONDS = 3600
TOKEN_REFRESH_FRACTION = 0.8
# The serviceaccount controller creates "default" moments after a namespace appears; a pod racing
# it should wait, a pod naming a service account that never comes should fail visibly.
SERVICE_ACCOUNT_WAIT_SECONDS = 60.0
DEFAULT_GRACE_SECONDS = 30
# A force-deleted pod (grace 0) still gets a moment to handle SIGTERM, as with a real kubelet.
MIN_FORCED_GRACE_SECONDS = 2
# lifecycle.py gives the kubelet 20 s to stop before SIGKILL; every pod stops in parallel.
SHUTDOWN_GRACE_CAP_SECONDS = 10
# Much shorter than the real 10 s .. 5 min: tests should see restarts, not wait for them.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0
BACKOFF_RESET_AFTER_SECONDS = 60.0
CONFIG_ERROR_RETRY_SECONDS = 2.0
MESSAGE_TAIL_LINES = 20
MESSAGE_TAIL_BYTES = 2048
POLL_SECONDS = 0.25
API_TIMEOUT = (5, 30)
WATCH_TIMEOUT_SECONDS = 240
DEFAULT_SCHEDULER = "default-scheduler"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# Taints the node lifecycle controller or admission put on nodes that are not (yet) healthy; with no
# node lifecycle controller running they would stay forever, and NoExecute ones evict pods.
REMOVABLE_TAINT_KEYS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/network-unavailable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    }
)
# Kept out of pods: the kubelet's admin credentials, and the in-cluster discovery variables that
# would send client libraries to look for /var/run/secrets/... before reading $KUBECONFIG.
STRIPPED_ENV = frozenset({"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"})

WAITING = "waiting"
RUNNING = "running"
TERMINATED = "terminated"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


# --------------------------------------------------------------------------------------------------
# Pure parts: no API, no processes. Pods, containers and statuses are the API's JSON (camelCase dicts).
# --------------------------------------------------------------------------------------------------


class EntrypointUnsupported(Exception):
    """A container without `command`: only the image's entrypoint could run it, and images are not used."""


class EnvResolutionError(Exception):
    """The container's environment cannot be built yet (missing ConfigMap/Secret/key, bad reference)."""


class NotYet(Exception):
    """Something the pod needs does not exist yet but is expected to appear (retried, then fatal)."""


def rfc3339(timestamp: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(timestamp: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_log_path(state_dir: Path | str, namespace: str, pod_name: str, container: str) -> Path:
    """Where the stdout+stderr of `container` in pod `namespace/pod_name` is appended."""
    return Path(state_dir) / "logs" / namespace / pod_name / f"{container}.log"


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion, as in k8s.io/kubernetes/third_party/forked/golang/expansion.

    `$(NAME)` becomes the value of NAME when defined and stays as written otherwise; `$$` is an
    escaped `$` (so `$$(NAME)` yields the literal `$(NAME)`); an unterminated `$(` and any other
    `$x` are kept literally.
    """
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        char = value[i]
        if char != "$" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        following = value[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = value.find(")", i + 2)
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = value[i + 2 : close]
                out.append(env.get(name, f"$({name})"))
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def build_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """argv = command + args with `$(VAR)` expanded from the container's environment."""
    command = list(container.get("command") or [])
    if not command:
        raise EntrypointUnsupported(
            f"container {container.get('name')!r} has no command: the process-kubelet runs "
            f"`command + args` on the host and cannot use the entrypoint of image "
            f"{container.get('image')!r}; set `command` in the pod spec"
        )
    return [expand(str(part), env) for part in [*command, *(container.get("args") or [])]]


_SUBSCRIPT_FIELD = re.compile(r"^metadata\.(labels|annotations)\[(['\"])(.+)\2\]$")


def field_ref_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The downward-API value of `field_path` for env vars (the paths the API server allows there)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    match = _SUBSCRIPT_FIELD.match(field_path)
    if match:
        # A missing label or annotation yields "", as with a real kubelet.
        return str((meta.get(match.group(1)) or {}).get(match.group(3), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
    }
    if field_path not in simple:
        raise EnvResolutionError(f"fieldRef {field_path!r} is not supported in env")
    value = simple[field_path]
    return "" if value is None else str(value)


_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_QUANTITY_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(text: str | int | float) -> Decimal:
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise EnvResolutionError(f"invalid quantity {text!r}")
    try:
        return Decimal(match.group(1)) * _QUANTITY_SUFFIX[match.group(2) or ""]
    except InvalidOperation as exc:
        raise EnvResolutionError(f"invalid quantity {text!r}") from exc


def resource_field_value(container: Mapping[str, Any], resource: str, divisor: str | None) -> str:
    """resourceFieldRef for env: the container's request/limit, limits defaulting to node allocatable."""
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise EnvResolutionError(f"resourceFieldRef {resource!r} is not supported")
    declared = ((container.get("resources") or {}).get(kind)) or {}
    if name in declared:
        quantity = parse_quantity(declared[name])
    elif kind == "limits":
        quantity = parse_quantity(NODE_CAPACITY.get(name, "0"))
    else:
        quantity = Decimal(0)
    unit = parse_quantity(divisor or "1")
    if unit <= 0:
        raise EnvResolutionError(f"resourceFieldRef {resource!r} has a non-positive divisor")
    return str(math.ceil(quantity / unit))


# (kind "ConfigMap" | "Secret", name) -> decoded data, or None when the object does not exist.
SourceLookup = Callable[[str, str], Mapping[str, str] | None]


def _key_ref_value(ref: Mapping[str, Any], kind: str, lookup: SourceLookup) -> str | None:
    data = lookup(kind, str(ref.get("name", "")))
    key = str(ref.get("key", ""))
    if data is not None and key in data:
        return data[key]
    if ref.get("optional"):
        return None
    if data is None:
        raise EnvResolutionError(f"{kind.lower()} {ref.get('name')!r} not found")
    raise EnvResolutionError(f"couldn't find key {key} in {kind} {ref.get('name')}")


def resolve_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    lookup: SourceLookup,
    context: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's declared environment (envFrom, then env), resolved like a kubelet does.

    `$(VAR)` in a literal value refers to `context` (variables the kubelet provides) and to the
    variables declared before it; valueFrom values are never expanded. Optional references that
    cannot be resolved are skipped; required ones raise EnvResolutionError.
    """
    declared: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(ref_key)
            if not ref:
                continue
            data = lookup(kind, str(ref.get("name", "")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvResolutionError(f"{kind.lower()} {ref.get('name')!r} not found")
            for key, item in data.items():
                # The kubelet skips keys that cannot be environment variable names.
                if "=" not in key and key:
                    declared[prefix + key] = item
    for var in container.get("env") or []:
        name = str(var["name"])
        value_from = var.get("valueFrom")
        value: str | None
        if value_from:
            if "fieldRef" in value_from:
                value = field_ref_value(pod, str(value_from["fieldRef"].get("fieldPath", "")))
            elif "resourceFieldRef" in value_from:
                ref = value_from["resourceFieldRef"]
                value = resource_field_value(container, str(ref.get("resource", "")), ref.get("divisor"))
            elif "configMapKeyRef" in value_from:
                value = _key_ref_value(value_from["configMapKeyRef"], "ConfigMap", lookup)
            elif "secretKeyRef" in value_from:
                value = _key_ref_value(value_from["secretKeyRef"], "Secret", lookup)
            else:
                raise EnvResolutionError(f"env {name}: unsupported valueFrom {sorted(value_from)}")
            if value is None:
                continue
        else:
            value = expand(str(var.get("value") or ""), {**(context or {}), **declared})
        declared[name] = value
    return declared


def process_env(
    inherited: Mapping[str, str],
    injected: Mapping[str, str],
    declared: Mapping[str, str],
    python_bin_dir: str,
) -> dict[str, str]:
    """The full environment of a container process: host env < kubelet-provided < pod-declared."""
    env = {key: value for key, value in inherited.items() if key not in STRIPPED_ENV}
    path = inherited.get("PATH") or os.defpath
    env["PATH"] = f"{python_bin_dir}{os.pathsep}{path}" if python_bin_dir else path
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(injected)
    env.update(declared)
    return env


def exit_code_from_returncode(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes 128+N, as a container runtime reports it."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """Whether a regular container that exited with `exit_code` is started again."""
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def backoff_seconds(step: int) -> float:
    return min(BACKOFF_BASE_SECONDS * 2.0 ** max(step, 0), BACKOFF_CAP_SECONDS)


def tail_text(data: bytes, max_lines: int = MESSAGE_TAIL_LINES, max_bytes: int = MESSAGE_TAIL_BYTES) -> str:
    """The last lines of a log, bounded, for a termination message."""
    lines = data.decode("utf-8", errors="replace").rstrip("\n").splitlines()[-max_lines:]
    text = "\n".join(lines)
    encoded = text.encode()
    if len(encoded) > max_bytes:
        text = encoded[-max_bytes:].decode("utf-8", errors="ignore")
    return text


def terminated_state(
    exit_code: int,
    started_at: str | None,
    finished_at: str,
    pid: int | None,
    *,
    message: str = "",
    reason: str | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or terminated_reason(exit_code),
        "finishedAt": finished_at,
    }
    if started_at:
        state["startedAt"] = started_at
    if pid is not None:
        state["containerID"] = f"process://{pid}"
    if message:
        state["message"] = message
    return state


@dataclass
class ContainerRun:
    """What the kubelet knows about one container of a pod (no process handle: that stays in the worker)."""

    name: str
    image: str
    sidecar: bool = False
    state: str = WAITING
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    started_at: str | None = None
    pid: int | None = None
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    restart_count: int = 0
    ready: bool = False

    @property
    def ever_started(self) -> bool:
        return self.pid is not None or self.terminated is not None or self.last_terminated is not None

    @property
    def exit_code(self) -> int | None:
        return None if self.terminated is None else int(self.terminated["exitCode"])


def container_status(run: ContainerRun) -> dict[str, Any]:
    state: dict[str, Any]
    if run.state == RUNNING:
        state = {"running": {"startedAt": run.started_at}}
    elif run.state == TERMINATED and run.terminated is not None:
        state = {"terminated": dict(run.terminated)}
    else:
        waiting: dict[str, Any] = {"reason": run.waiting_reason}
        if run.waiting_message:
            waiting["message"] = run.waiting_message
        state = {"waiting": waiting}
    status: dict[str, Any] = {
        "name": run.name,
        "image": run.image,
        # Never pulled: there is no digest to report, only what the pod asked for.
        "imageID": f"process://{run.image}",
        "ready": run.state == RUNNING and run.ready,
        "started": run.state == RUNNING,
        "restartCount": run.restart_count,
        "state": state,
        "lastState": {"terminated": dict(run.last_terminated)} if run.last_terminated else {},
    }
    if run.pid is not None:
        status["containerID"] = f"process://{run.pid}"
    return status


def _init_done(run: ContainerRun) -> bool:
    if run.sidecar:
        return run.ever_started
    return run.state == TERMINATED and run.exit_code == 0


def compute_phase(
    restart_policy: str,
    init_runs: Sequence[ContainerRun],
    runs: Sequence[ContainerRun],
    *,
    stopping: bool = False,
) -> str:
    """The pod phase. `stopping`: the pod is being deleted or killed and nothing will restart."""
    if any(not r.sidecar and r.state == TERMINATED and r.exit_code != 0 for r in init_runs):
        return "Failed"
    all_exited = bool(runs) and all(r.state == TERMINATED for r in runs)
    all_zero = all_exited and all(r.exit_code == 0 for r in runs)
    if stopping:
        return "Succeeded" if all_zero else "Failed"
    if all_exited and not any(should_restart(restart_policy, r.exit_code or 0) for r in runs):
        return "Succeeded" if all_zero else "Failed"
    if any(r.ever_started for r in runs):
        return "Running"
    return "Pending"


Condition = tuple[str, str, str, str]  # type, status, reason, message


def pod_conditions(
    phase: str,
    init_runs: Sequence[ContainerRun],
    runs: Sequence[ContainerRun],
    *,
    initialized: bool,
    readiness_gates_ok: bool = True,
) -> list[Condition]:
    conditions: list[Condition] = [("PodScheduled", "True", "", "")]
    if initialized or not init_runs:
        conditions.append(("Initialized", "True", "", ""))
    else:
        incomplete = " ".join(r.name for r in init_runs if not _init_done(r))
        conditions.append(
            (
                "Initialized",
                "False",
                "ContainersNotInitialized",
                f"containers with incomplete status: [{incomplete}]",
            )
        )
    watched = [r for r in init_runs if r.sidecar] + list(runs)
    unready = [r.name for r in watched if not (r.state == RUNNING and r.ready)]
    containers_ready: Condition
    if phase == "Succeeded":
        containers_ready = ("ContainersReady", "False", "PodCompleted", "")
    elif unready:
        message = f"containers with unready status: [{' '.join(unready)}]"
        containers_ready = ("ContainersReady", "False", "ContainersNotReady", message)
    else:
        containers_ready = ("ContainersReady", "True", "", "")
    conditions.append(containers_ready)
    if containers_ready[1] != "True":
        conditions.append(("Ready", *containers_ready[1:]))
    elif not readiness_gates_ok:
        conditions.append(
            ("Ready", "False", "ReadinessGatesNotReady", "the pod's readiness gates are not all True")
        )
    else:
        conditions.append(("Ready", "True", "", ""))
    return conditions


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], desired: Sequence[Condition], now: str
) -> list[dict[str, Any]]:
    """Conditions to patch: lastTransitionTime moves only when the status changes.

    reason/message are sent as null when empty: a strategic merge keyed by type would otherwise
    keep the old ones (e.g. "containers with unready status" on a Ready=True condition).
    """
    old = {str(c.get("type")): c for c in previous}
    merged = []
    for type_, status, reason, message in desired:
        before = old.get(type_)
        unchanged = before is not None and before.get("status") == status and before.get("lastTransitionTime")
        merged.append(
            {
                "type": type_,
                "status": status,
                "lastProbeTime": None,
                "lastTransitionTime": before["lastTransitionTime"] if unchanged and before else now,
                "reason": reason or None,
                "message": message or None,
            }
        )
    return merged


def build_pod_status(
    *,
    phase: str,
    init_runs: Sequence[ContainerRun],
    runs: Sequence[ContainerRun],
    conditions: Sequence[Mapping[str, Any]],
    start_time: str | None,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [dict(c) for c in conditions],
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
        "containerStatuses": [container_status(r) for r in runs],
    }
    if init_runs:
        status["initContainerStatuses"] = [container_status(r) for r in init_runs]
    if start_time:
        status["startTime"] = start_time
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status


def fail_running_statuses(
    statuses: Sequence[Mapping[str, Any]], reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """Container statuses of a pod abandoned while running: running containers become terminated."""
    out = []
    for status in statuses:
        copy = dict(status)
        running = (status.get("state") or {}).get("running")
        if running is not None:
            copy["state"] = {
                "terminated": {
                    "exitCode": 137,
                    "reason": reason,
                    "message": message,
                    "startedAt": running.get("startedAt"),
                    "finishedAt": now,
                    **({"containerID": status["containerID"]} if status.get("containerID") else {}),
                }
            }
        copy["ready"] = False
        copy["started"] = False
        out.append(copy)
    return out


def status_shows_started(pod: Mapping[str, Any]) -> bool:
    """Whether some kubelet already ran this pod's containers (phase Running or a running container)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Running":
        return True
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            if (container.get("state") or {}).get("running") is not None:
                return True
    return False


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def deletion_grace_seconds(pod: Mapping[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_SECONDS if grace is None else max(int(grace), 0)


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


def readiness_gates_ok(pod: Mapping[str, Any]) -> bool:
    gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
    if not gates:
        return True
    true = {
        c.get("type") for c in (pod.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
    }
    return all(gate in true for gate in gates)


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


def node_status(node_name: str, kubelet_version: str, ready_since: str, now: str) -> dict[str, Any]:
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
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": node_name}],
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


@dataclass(frozen=True)
class ClusterInfo:
    """How pods reach the API server: taken from the admin kubeconfig, minus its credentials."""

    server: str
    ca_pem: bytes | None
    insecure: bool = False
    tls_server_name: str | None = None


def cluster_info(kubeconfig: Mapping[str, Any], base_dir: Path) -> ClusterInfo:
    contexts = {c["name"]: c.get("context") or {} for c in kubeconfig.get("contexts") or []}
    clusters = {c["name"]: c.get("cluster") or {} for c in kubeconfig.get("clusters") or []}
    current = kubeconfig.get("current-context") or next(iter(contexts), None)
    cluster_name = contexts.get(current or "", {}).get("cluster") or next(iter(clusters), None)
    cluster = clusters.get(cluster_name or "")
    if not cluster or not cluster.get("server"):
        raise ValueError("admin kubeconfig has no cluster with a server for its current context")
    ca_pem: bytes | None = None
    if cluster.get("certificate-authority-data"):
        ca_pem = base64.b64decode(cluster["certificate-authority-data"])
    elif cluster.get("certificate-authority"):
        ca_pem = (base_dir / cluster["certificate-authority"]).read_bytes()
    return ClusterInfo(
        server=str(cluster["server"]),
        ca_pem=ca_pem,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
    )


def service_account_kubeconfig(info: ClusterInfo, token: str, namespace: str, user: str) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": info.server}
    if info.ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(info.ca_pem).decode()
    if info.insecure:
        cluster["insecure-skip-tls-verify"] = True
    if info.tls_server_name:
        cluster["tls-server-name"] = info.tls_server_name
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "local", "user": user, "namespace": namespace}}],
        "current-context": "pod",
    }


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container.get('name')!r} has no port named {port!r}")


# --------------------------------------------------------------------------------------------------
# Impure helpers: files, processes, probes, API calls.
# --------------------------------------------------------------------------------------------------


def _write_private(path: Path, data: bytes | str) -> None:
    """Atomic replace, so a process re-reading a refreshed token never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _proc_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot: tells our process apart from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_recorded_processes(pod_dir: Path) -> None:
    """SIGKILL the process groups an earlier kubelet recorded in `pod_dir`, if still the same processes."""
    for pid_file in (pod_dir / "pids").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid_text, _, ticks = pid_file.read_text().strip().partition(" ")
            pid = int(pid_text)
            if ticks and _proc_start_time(pid) == ticks:
                _signal_group(pid, signal.SIGKILL)
                log.info("killed leftover process group %d (%s)", pid, pid_file)
            pid_file.unlink()


def _raw(method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a client method and return the JSON body as a dict (no model (de)serialization quirks)."""
    kwargs.setdefault("_request_timeout", API_TIMEOUT)
    response = method(*args, _preload_content=False, **kwargs)
    try:
        data = response.data
        return json.loads(data) if data else {}
    finally:
        with contextlib.suppress(Exception):
            response.release_conn()


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (None, 0, 408, 429) or (exc.status or 0) >= 500
    return True


@dataclass
class ProbeTracker:
    probe: dict[str, Any]
    next_at: float
    successes: int = 0
    failures: int = 0
    ready: bool = False

    def record(self, ok: bool) -> None:
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.probe.get("successThreshold") or 1):
                self.ready = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.probe.get("failureThreshold") or 3):
                self.ready = False


def run_probe(
    probe: Mapping[str, Any], container: Mapping[str, Any], env: Mapping[str, str], cwd: str
) -> bool:
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = resolve_port(get.get("port", 80), container)
            host = get.get("host") or HOST_IP
            path = get.get("path") or "/"
            connection: http.client.HTTPConnection
            if str(get.get("scheme", "HTTP")).upper() == "HTTPS":
                # Like the kubelet: probes do not verify the serving certificate.
                context = ssl._create_unverified_context()
                connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                headers.setdefault("User-Agent", "kube-probe/process-kubelet")
                connection.request("GET", path, headers=headers)
                return 200 <= connection.getresponse().status < 400
            finally:
                connection.close()
        if "tcpSocket" in probe:
            tcp = probe["tcpSocket"]
            port = resolve_port(tcp.get("port", 0), container)
            with socket.create_connection((tcp.get("host") or HOST_IP, port), timeout=timeout):
                return True
        if "exec" in probe:
            command = list((probe["exec"] or {}).get("command") or [])
            result = subprocess.run(
                command, env=dict(env), cwd=cwd, timeout=timeout, capture_output=True, check=False
            )
            return result.returncode == 0
    except (OSError, ValueError, subprocess.SubprocessError, http.client.HTTPException):
        return False
    # grpc and unknown probe kinds: treat the container as ready rather than never.
    return True


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    started: float
    env: dict[str, str]
    cwd: str


# --------------------------------------------------------------------------------------------------
# One pod.
# --------------------------------------------------------------------------------------------------


class PodWorker:
    """Runs one pod from its first sight on this node until it is terminal (or gone); one thread each."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        self.kubelet = kubelet
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = False
        self._shutdown = False
        self._closed = False
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.init_specs: list[dict[str, Any]] = list(spec.get("initContainers") or [])
        self.specs: list[dict[str, Any]] = list(spec.get("containers") or [])
        self.init_runs = [
            ContainerRun(
                c["name"],
                c.get("image", ""),
                sidecar=c.get("restartPolicy") == "Always",
                waiting_reason="PodInitializing",
            )
            for c in self.init_specs
        ]
        first_reason = "PodInitializing" if self.init_specs else "ContainerCreating"
        self.runs = [
            ContainerRun(c["name"], c.get("image", ""), waiting_reason=first_reason) for c in self.specs
        ]
        self.procs: dict[str, _Process] = {}
        self.not_before: dict[str, float] = {}
        self.backoff_steps: dict[str, int] = {}
        self.probes: dict[str, ProbeTracker] = {}
        self.init_index = 0
        self.initialized = not self.init_specs
        self.start_time: str | None = None
        self.started_mono: float | None = None
        # A container's hostname: spec.hostname when set, else the pod name (as the kubelet does).
        self.injected: dict[str, str] = {"HOSTNAME": str(spec.get("hostname") or self.name)[:63]}
        self.last_status: dict[str, Any] | None = None
        self.conditions: list[dict[str, Any]] = list((pod.get("status") or {}).get("conditions") or [])
        self.pod_dir = kubelet.state_dir / "pods" / self.uid
        self.token_refresh_at: float | None = None
        self.service_account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        self.thread = threading.Thread(
            target=self._main, name=f"pod/{self.namespace}/{self.name}", daemon=True
        )

    # -- called from other threads --------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def update(self, pod: dict[str, Any]) -> bool:
        """Hand over a newer pod object; False when the worker is past looking at updates."""
        with self._lock:
            if self._closed:
                return False
            self._pod = pod
        self._wake.set()
        return True

    def gone(self, pod: dict[str, Any] | None = None) -> None:
        """The pod object was deleted from the API (force deletion or our own final delete)."""
        with self._lock:
            self._gone = True
            if pod is not None:
                self._pod = pod
        self._wake.set()

    def shutdown(self) -> None:
        self._shutdown = True
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    # -- the pod's life ---------------------------------------------------------------------------

    @property
    def pod(self) -> dict[str, Any]:
        with self._lock:
            return self._pod

    def _container_log(self, run: ContainerRun) -> Path:
        return pod_log_path(self.kubelet.state_dir, self.namespace, self.name, run.name)

    def _main(self) -> None:
        try:
            self._lifecycle()
        except Exception as exc:
            log.exception("pod %s/%s: unexpected error", self.namespace, self.name)
            # One bad pod must not take the node down: it fails loudly instead.
            with contextlib.suppress(Exception):
                self._terminate_all(0)
                self._publish_until_done(
                    phase="Failed",
                    stopping=True,
                    reason="KubeletError",
                    message=f"the process-kubelet failed to run this pod: {exc!r}",
                )
        finally:
            self._kill_everything()
            with self._lock:
                self._closed = True
                pod, gone = self._pod, self._gone
            if gone:
                shutil.rmtree(self.pod_dir, ignore_errors=True)
            elif is_deleting(pod) and not self._shutdown:
                # A deletion that arrived while we were finishing up: nobody else will see it.
                self.kubelet.final_delete(pod)

    def _lifecycle(self) -> None:
        pod = self.pod
        # Processes an earlier kubelet started (and was killed before reporting) are not ours either.
        kill_recorded_processes(self.pod_dir)
        if status_shows_started(pod):
            self._abandon(pod)
            return
        if is_deleting(pod) or self._gone:
            self.kubelet.final_delete(pod)
            return
        missing: dict[str, str] = {}
        for spec in [*self.init_specs, *self.specs]:
            try:
                build_argv(spec, {})
            except EntrypointUnsupported as exc:
                missing[spec["name"]] = str(exc)
        if missing:
            self._fail_entrypoint(missing)
            return
        self.start_time = rfc3339()
        self.started_mono = time.monotonic()
        self._publish()
        if not self._prepare_identity():
            return
        while True:
            if self._shutdown:
                self._terminate_all(min(deletion_grace_seconds(self.pod), SHUTDOWN_GRACE_CAP_SECONDS))
                return
            if self._gone:
                self._terminate_all(MIN_FORCED_GRACE_SECONDS)
                return
            pod = self.pod
            if is_deleting(pod):
                self._terminate_all(deletion_grace_seconds(pod))
                if not self._gone:
                    self._publish_until_done(stopping=True)
                    self.kubelet.final_delete(pod)
                return
            deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
            if deadline is not None and time.monotonic() - (self.started_mono or 0.0) > int(deadline):
                self._terminate_all(deletion_grace_seconds(pod))
                self._publish_until_done(
                    phase="Failed",
                    stopping=True,
                    reason="DeadlineExceeded",
                    message=f"Pod was active on the node longer than the specified deadline ({deadline}s)",
                )
                return
            self._step()
            phase = compute_phase(self.restart_policy, self.init_runs, self.runs)
            if phase in TERMINAL_PHASES:
                if any(r.sidecar and r.name in self.procs for r in self.init_runs):
                    self._terminate_all(deletion_grace_seconds(pod))
                self._publish_until_done()
                return
            self._publish()
            self._maybe_refresh_token()
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()

    def _abandon(self, pod: dict[str, Any]) -> None:
        """A pod some earlier kubelet ran: its processes (killed already) are not ours to adopt."""
        status = pod.get("status") or {}
        if status.get("phase") not in TERMINAL_PHASES:
            now = rfc3339()
            message = "the process-kubelet restarted while this pod was running; its processes were stopped"
            desired: list[Condition] = [
                ("ContainersReady", "False", "KubeletRestarted", message),
                ("Ready", "False", "KubeletRestarted", message),
            ]
            patch = {
                "phase": "Failed",
                "reason": "KubeletRestarted",
                "message": message,
                "conditions": merge_conditions(status.get("conditions") or [], desired, now),
            }
            for key in ("initContainerStatuses", "containerStatuses"):
                if status.get(key):
                    patch[key] = fail_running_statuses(status[key], "KubeletRestarted", message, now)
            delay = 0.5
            while not self._patch_status(patch) and not self._gone and not self._shutdown:
                self._wake.wait(delay)
                delay = min(delay * 2, 5.0)
            log.warning(
                "pod %s/%s: was running before this kubelet started; marked Failed", self.namespace, self.name
            )
        if is_deleting(self.pod):
            self.kubelet.final_delete(self.pod)

    def _fail_entrypoint(self, problems: dict[str, str]) -> None:
        finished = rfc3339()
        for run in [*self.init_runs, *self.runs]:
            if run.name in problems:
                run.state = TERMINATED
                run.terminated = terminated_state(
                    128, None, finished, None, message=problems[run.name], reason="ImageEntrypointUnsupported"
                )
        problem_text = "; ".join(problems.values())
        log.warning("pod %s/%s: %s", self.namespace, self.name, problem_text)
        self._publish_until_done(
            phase="Failed", reason="ImageEntrypointUnsupported", message=problem_text, stopping=True
        )
        if is_deleting(self.pod):
            self.kubelet.final_delete(self.pod)

    # -- identity -----------------------------------------------------------------------------------

    def _prepare_identity(self) -> bool:
        deadline = time.monotonic() + SERVICE_ACCOUNT_WAIT_SECONDS
        while True:
            if self._shutdown or self._gone:
                return False
            if is_deleting(self.pod):
                # Nothing ran yet: the pod just goes away.
                self.kubelet.final_delete(self.pod)
                return False
            try:
                self._setup_identity()
                return True
            except Exception as exc:
                problem = f"service account {self.namespace}/{self.service_account}: {_describe(exc)}"
                if not _transient(exc) or time.monotonic() > deadline:
                    log.warning("pod %s/%s: %s", self.namespace, self.name, problem)
                    for run in [*self.init_runs, *self.runs]:
                        run.waiting_reason, run.waiting_message = "ServiceAccountUnavailable", problem
                    self._publish_until_done(
                        phase="Failed", stopping=True, reason="ServiceAccountUnavailable", message=problem
                    )
                    return False
                for run in [*self.init_runs, *self.runs]:
                    run.waiting_message = f"waiting for {problem}"
                self._publish()
                self._wake.wait(1.0)
                self._wake.clear()

    def _setup_identity(self) -> None:
        spec = self.pod.get("spec") or {}
        automount = spec.get("automountServiceAccountToken")
        if automount is False:
            return
        try:
            account = _raw(
                self.kubelet.core.read_namespaced_service_account, self.service_account, self.namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                # Retried: the serviceaccount controller may not have created it yet.
                raise NotYet("not found") from exc
            raise
        if automount is None and account.get("automountServiceAccountToken") is False:
            return
        self._issue_token()
        for run in [*self.init_runs, *self.runs]:
            run.waiting_message = ""
        self.injected["KUBECONFIG"] = str(self.pod_dir / "kubeconfig")
        self.injected["SHARDOPS_SA_DIR"] = str(self.pod_dir / "serviceaccount")

    def _issue_token(self) -> None:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=TOKEN_EXPIRATION_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=self.name, uid=self.uid
                ),
            )
        )
        answer = _raw(
            self.kubelet.core.create_namespaced_service_account_token,
            self.service_account,
            self.namespace,
            request,
        )
        token = str((answer.get("status") or {}).get("token") or "")
        if not token:
            raise ApiException(status=500, reason="TokenRequest returned no token")
        lifetime = float(TOKEN_EXPIRATION_SECONDS)
        expires = (answer.get("status") or {}).get("expirationTimestamp")
        if expires:
            with contextlib.suppress(ValueError):
                lifetime = dt.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() - time.time()
        info = self.kubelet.cluster
        kubeconfig = service_account_kubeconfig(
            info, token, self.namespace, f"system:serviceaccount:{self.namespace}:{self.service_account}"
        )
        sa_dir = self.pod_dir / "serviceaccount"
        _write_private(sa_dir / "token", token)
        _write_private(sa_dir / "namespace", self.namespace)
        if info.ca_pem:
            _write_private(sa_dir / "ca.crt", info.ca_pem)
        _write_private(self.pod_dir / "kubeconfig", yaml.safe_dump(kubeconfig, sort_keys=False))
        self.token_refresh_at = time.monotonic() + max(lifetime, 60.0) * TOKEN_REFRESH_FRACTION

    def _maybe_refresh_token(self) -> None:
        if self.token_refresh_at is None or time.monotonic() < self.token_refresh_at:
            return
        try:
            self._issue_token()
            log.info("pod %s/%s: service account token refreshed", self.namespace, self.name)
        except Exception as exc:
            log.warning(
                "pod %s/%s: token refresh failed (%s); retrying", self.namespace, self.name, _describe(exc)
            )
            self.token_refresh_at = time.monotonic() + 30.0

    # -- containers ---------------------------------------------------------------------------------

    def _spec(self, name: str) -> dict[str, Any]:
        return next(s for s in [*self.init_specs, *self.specs] if s["name"] == name)

    def _lookup(self, kind: str, name: str) -> Mapping[str, str] | None:
        method = (
            self.kubelet.core.read_namespaced_config_map
            if kind == "ConfigMap"
            else self.kubelet.core.read_namespaced_secret
        )
        try:
            obj = _raw(method, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise EnvResolutionError(f"reading {kind.lower()} {name!r}: {_describe(exc)}") from exc
        if kind == "Secret":
            return {
                k: base64.b64decode(v).decode("utf-8", errors="replace")
                for k, v in (obj.get("data") or {}).items()
            }
        data = dict(obj.get("data") or {})
        for key, value in (obj.get("binaryData") or {}).items():
            data.setdefault(key, base64.b64decode(value).decode("utf-8", errors="replace"))
        return data

    def _container_config(self, spec: Mapping[str, Any]) -> tuple[list[str], dict[str, str], str]:
        declared = resolve_env(spec, self.pod, self._lookup, self.injected)
        argv = build_argv(spec, {**self.injected, **declared})
        env = process_env(self.kubelet.inherited_env, self.injected, declared, self.kubelet.python_bin_dir)
        working_dir = spec.get("workingDir")
        cwd = working_dir if working_dir and os.path.isdir(working_dir) else str(self.pod_dir)
        return argv, env, cwd

    def _start(self, run: ContainerRun) -> None:
        spec = self._spec(run.name)
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        try:
            argv, env, cwd = self._container_config(spec)
        except EnvResolutionError as exc:
            run.state = WAITING
            run.waiting_reason = "CreateContainerConfigError"
            run.waiting_message = str(exc)
            self.not_before[run.name] = time.monotonic() + CONFIG_ERROR_RETRY_SECONDS
            return
        log_path = self._container_log(run)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started_at = rfc3339()
        with log_path.open("ab") as log_file:
            offset = log_file.tell()
            try:
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    # Own process group: SIGTERM/SIGKILL reach the whole container, as in a cgroup.
                    start_new_session=True,
                )
            except OSError as exc:
                message = f"failed to start container {run.name!r}: {argv[0]}: {exc.strerror or exc}"
                log.warning("pod %s/%s: %s", self.namespace, self.name, message)
                self._after_exit(
                    run,
                    terminated_state(128, None, started_at, None, message=message, reason="StartError"),
                    0.0,
                )
                return
        if run.ever_started:
            run.restart_count += 1
        run.state = RUNNING
        run.pid = popen.pid
        run.started_at = started_at
        run.terminated = None
        run.waiting_reason, run.waiting_message = "", ""
        probe = spec.get("readinessProbe")
        run.ready = not probe
        if probe:
            delay = float(probe.get("initialDelaySeconds") or 0)
            self.probes[run.name] = ProbeTracker(probe=probe, next_at=time.monotonic() + delay)
        self.procs[run.name] = _Process(popen, log_path, offset, time.monotonic(), env, cwd)
        start_ticks = _proc_start_time(popen.pid) or ""
        _write_private(self.pod_dir / "pids" / f"{run.name}.pid", f"{popen.pid} {start_ticks}\n")
        log.info("pod %s/%s: started %s (pid %d): %s", self.namespace, self.name, run.name, popen.pid, argv)

    def _reap(self, run: ContainerRun, allow_restart: bool = True) -> None:
        proc = self.procs.pop(run.name)
        code = exit_code_from_returncode(proc.popen.returncode)
        # The container ends with its main process: strays left in its group go too.
        _signal_group(proc.popen.pid, signal.SIGKILL)
        finished = rfc3339()
        message = ""
        if code != 0:
            with contextlib.suppress(OSError), proc.log_path.open("rb") as handle:
                handle.seek(proc.log_offset)
                message = tail_text(handle.read())
        self.probes.pop(run.name, None)
        with contextlib.suppress(OSError):
            (self.pod_dir / "pids" / f"{run.name}.pid").unlink()
        log.info(
            "pod %s/%s: %s (pid %d) exited with %d", self.namespace, self.name, run.name, proc.popen.pid, code
        )
        term = terminated_state(code, run.started_at, finished, proc.popen.pid, message=message)
        self._after_exit(run, term, time.monotonic() - proc.started, allow_restart)

    def _after_exit(
        self, run: ContainerRun, term: dict[str, Any], ran_for: float, allow_restart: bool = True
    ) -> None:
        run.ready = False
        code = int(term["exitCode"])
        is_init = any(run is r for r in self.init_runs)
        if not allow_restart:
            restart = False
        elif run.sidecar:
            restart = True
        elif is_init:
            restart = code != 0 and self.restart_policy != "Never"
        else:
            restart = should_restart(self.restart_policy, code)
        if not restart:
            run.state = TERMINATED
            run.terminated = term
            return
        step = 0 if ran_for >= BACKOFF_RESET_AFTER_SECONDS else self.backoff_steps.get(run.name, 0)
        delay = backoff_seconds(step)
        self.backoff_steps[run.name] = step + 1
        run.last_terminated = term
        run.terminated = None
        run.state = WAITING
        run.waiting_reason = "CrashLoopBackOff"
        run.waiting_message = (
            f"back-off {delay:g}s restarting failed container={run.name} "
            f"pod={self.name}_{self.namespace}({self.uid})"
        )
        self.not_before[run.name] = time.monotonic() + delay

    def _due(self, run: ContainerRun, now: float) -> bool:
        return (
            run.state == WAITING and run.name not in self.procs and now >= self.not_before.get(run.name, 0.0)
        )

    def _step(self) -> None:
        for run in [*self.init_runs, *self.runs]:
            proc = self.procs.get(run.name)
            if proc is not None and proc.popen.poll() is not None:
                self._reap(run)
        now = time.monotonic()
        while not self.initialized:
            if self.init_index >= len(self.init_runs):
                self.initialized = True
                for run in self.runs:
                    if run.state == WAITING and not run.ever_started:
                        run.waiting_reason = "ContainerCreating"
                break
            run = self.init_runs[self.init_index]
            if run.sidecar and run.state == RUNNING:
                self.init_index += 1
                continue
            if not run.sidecar and run.state == TERMINATED and run.exit_code == 0:
                self.init_index += 1
                continue
            if self._due(run, now):
                self._start(run)
                if run.sidecar and run.state == RUNNING:
                    continue
            break
        for run in self.init_runs[: self.init_index]:
            if run.sidecar and self._due(run, now):
                self._start(run)
        if self.initialized:
            for run in self.runs:
                if self._due(run, now):
                    self._start(run)
        self._probe(now)

    def _probe(self, now: float) -> None:
        for name, tracker in list(self.probes.items()):
            proc = self.procs.get(name)
            if proc is None or now < tracker.next_at:
                continue
            ok = run_probe(tracker.probe, self._spec(name), proc.env, proc.cwd)
            tracker.record(ok)
            tracker.next_at = time.monotonic() + float(tracker.probe.get("periodSeconds") or 10)
            for run in [*self.init_runs, *self.runs]:
                if run.name == name:
                    run.ready = tracker.ready

    def _terminate_all(self, grace: float) -> None:
        """SIGTERM the containers (sidecars after the others), SIGKILL whatever outlives the grace period."""
        started = time.monotonic()
        deadline = started + max(grace, 0)
        granted = grace
        sidecars = {r.name for r in self.init_runs if r.sidecar}
        for name, running in self.procs.items():
            if name not in sidecars:
                _signal_group(running.popen.pid, signal.SIGTERM)
        sidecars_signalled = False
        killed = False
        while True:
            for run in [*self.init_runs, *self.runs]:
                proc = self.procs.get(run.name)
                if proc is not None and proc.popen.poll() is not None:
                    self._reap(run, allow_restart=False)
            if not sidecars_signalled and all(name in sidecars for name in self.procs):
                for name in sidecars & set(self.procs):
                    _signal_group(self.procs[name].popen.pid, signal.SIGTERM)
                sidecars_signalled = True
            if not self.procs:
                break
            pod = self.pod
            # A second, shorter deletion (e.g. --force --grace-period=0) cuts the wait short.
            if self._gone:
                deadline = min(deadline, started + MIN_FORCED_GRACE_SECONDS)
            elif is_deleting(pod) and deletion_grace_seconds(pod) < granted:
                granted = max(deletion_grace_seconds(pod), 0)
                deadline = min(deadline, time.monotonic() + granted)
            if time.monotonic() >= deadline and not killed:
                for proc in self.procs.values():
                    _signal_group(proc.popen.pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        # Containers that were waiting (to start or to restart) will not run any more.
        for run in [*self.init_runs, *self.runs]:
            if run.state == WAITING and run.last_terminated is not None:
                run.state = TERMINATED
                run.terminated = run.last_terminated
                run.last_terminated = None
        self.not_before.clear()

    def _kill_everything(self) -> None:
        for proc in list(self.procs.values()):
            _signal_group(proc.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)

    # -- status -------------------------------------------------------------------------------------

    def _publish(
        self, *, phase: str | None = None, stopping: bool = False, reason: str = "", message: str = ""
    ) -> bool:
        """Patch the pod status if it changed since the last successful write; True when up to date."""
        if phase is None:
            phase = compute_phase(self.restart_policy, self.init_runs, self.runs, stopping=stopping)
        desired = pod_conditions(
            phase,
            self.init_runs,
            self.runs,
            initialized=self.initialized,
            readiness_gates_ok=readiness_gates_ok(self.pod),
        )
        conditions = merge_conditions(self.conditions, desired, rfc3339())
        status = build_pod_status(
            phase=phase,
            init_runs=self.init_runs,
            runs=self.runs,
            conditions=conditions,
            start_time=self.start_time,
            reason=reason,
            message=message,
        )
        if status == self.last_status:
            return True
        if not self._patch_status(status):
            return False
        if self.last_status is None or self.last_status.get("phase") != phase:
            log.info("pod %s/%s: %s%s", self.namespace, self.name, phase, f" ({reason})" if reason else "")
        self.last_status = status
        self.conditions = conditions
        return True

    def _publish_until_done(self, **kwargs: Any) -> None:
        """A terminal status must land: the Job controller waits for it. Give up only if the pod is gone."""
        delay = 0.5
        while not self._gone and not self._shutdown:
            if self._publish(**kwargs):
                return
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, 5.0)

    def _patch_status(self, status: dict[str, Any]) -> bool:
        try:
            _raw(
                self.kubelet.core.patch_namespaced_pod_status,
                self.name,
                self.namespace,
                {"status": status},
                _content_type=STRATEGIC_MERGE,
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                self.gone()
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, _describe(exc))
        except Exception as exc:
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, _describe(exc))
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, NotYet):
        return str(exc)
    if isinstance(exc, ApiException):
        detail = ""
        with contextlib.suppress(Exception):
            detail = json.loads(exc.body or "{}").get("message", "")
        return f"{exc.status} {exc.reason}" + (f": {detail}" if detail else "")
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# The node.
# --------------------------------------------------------------------------------------------------


class Kubelet:
    def __init__(self, kubeconfig: Path, node_name: str, state_dir: Path, python: str) -> None:
        self.node_name = node_name
        self.state_dir = state_dir.resolve()
        # Not resolved: a venv's bin/python is a symlink, and it is the venv's bin we want on PATH.
        self.python_bin_dir = os.path.dirname(os.path.abspath(python))
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 64
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        kubeconfig_doc = yaml.safe_load(kubeconfig.read_text()) or {}
        self.cluster = cluster_info(kubeconfig_doc, kubeconfig.resolve().parent)
        self.inherited_env = dict(os.environ)
        self.labels = node_labels(node_name)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}
        self.binding: set[str] = set()
        self.finalizing: set[str] = set()
        self.unschedulable_reported: set[str] = set()
        self.aux = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-aux")
        self.ready_since = rfc3339()
        self.kubelet_version = "v0.0.0"
        self.node_uid: str | None = None
        self.cordoned = False

    # -- node -----------------------------------------------------------------------------------------

    def run(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        while not self.stop.is_set():
            try:
                self._register_node()
                break
            except Exception as exc:
                log.warning("node registration failed (%s); retrying", _describe(exc))
                self.stop.wait(2.0)
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True),
        ]
        for thread in threads:
            thread.start()
        while not self.stop.wait(0.5):
            pass
        self._shutdown()

    def _register_node(self) -> None:
        version = _raw(client.VersionApi(self.api).get_code)
        self.kubelet_version = str(version.get("gitVersion") or self.kubelet_version)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.labels},
            "spec": {},
            "status": node_status(self.node_name, self.kubelet_version, self.ready_since, rfc3339()),
        }
        try:
            node = _raw(self.core.create_node, body)
            log.info("registered node %s (kubelet %s)", self.node_name, self.kubelet_version)
        except ApiException as exc:
            if exc.status != 409:
                raise
            node = _raw(self.core.read_node, self.node_name)
            _raw(
                self.core.patch_node,
                self.node_name,
                {"metadata": {"labels": self.labels}},
                _content_type=STRATEGIC_MERGE,
            )
            log.info("node %s already registered; taking it over", self.node_name)
        self.node_uid = (node.get("metadata") or {}).get("uid")
        self._heartbeat()

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            try:
                self._heartbeat()
            except Exception as exc:
                log.warning("node heartbeat failed: %s", _describe(exc))

    def _heartbeat(self) -> None:
        self._renew_lease()
        status = node_status(self.node_name, self.kubelet_version, self.ready_since, rfc3339())
        try:
            node = _raw(
                self.core.patch_node_status, self.node_name, {"status": status}, _content_type=STRATEGIC_MERGE
            )
        except ApiException as exc:
            if exc.status == 404:
                log.warning("node %s disappeared; registering it again", self.node_name)
                self._register_node()
                return
            raise
        spec = node.get("spec") or {}
        self.cordoned = bool(spec.get("unschedulable"))
        taints = spec.get("taints") or []
        keep = [t for t in taints if t.get("key") not in REMOVABLE_TAINT_KEYS]
        if len(keep) != len(taints):
            # resourceVersion makes this a compare-and-swap: a concurrent taint change is not lost.
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": keep or None},
            }
            try:
                _raw(self.core.patch_node, self.node_name, patch, _content_type=MERGE_PATCH)
                log.info("removed taints %s", sorted({t["key"] for t in taints} - {t["key"] for t in keep}))
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def _renew_lease(self) -> None:
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro_time(),
        }
        try:
            _raw(
                self.coordination.patch_namespaced_lease,
                self.node_name,
                LEASE_NAMESPACE,
                {"spec": spec},
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            metadata: dict[str, Any] = {"name": self.node_name, "namespace": LEASE_NAMESPACE}
            if self.node_uid:
                # The node's lease goes away with the node, as the real kubelet arranges.
                metadata["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_uid}
                ]
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": metadata,
                "spec": spec,
            }
            _raw(self.coordination.create_namespaced_lease, LEASE_NAMESPACE, body)

    # -- pods -----------------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        resource_version: str | None = None
        while not self.stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._relist()
                resource_version = self._watch(resource_version)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("pod watch expired; listing again")
                    resource_version = None
                    continue
                log.warning("pod watch failed: %s", _describe(exc))
                self.stop.wait(1.0)
            except Exception as exc:
                log.warning("pod watch failed: %s", _describe(exc))
                self.stop.wait(1.0)

    def _relist(self) -> str:
        pods: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            page = _raw(self.core.list_pod_for_all_namespaces, **kwargs)
            pods.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        seen = {p["metadata"]["uid"] for p in pods}
        with self.lock:
            vanished = [(uid, w) for uid, w in self.workers.items() if uid not in seen]
        for uid, _worker in vanished:
            self._handle("DELETED", {"metadata": {"uid": uid}})
        # Pods deleted while no kubelet was watching: stop what is left of them and forget their files.
        # (Vanished pods with a worker are left to it: it stops their processes with a grace period.)
        handed_over = {uid for uid, _worker in vanished}
        for pod_dir in (self.state_dir / "pods").glob("*"):
            with self.lock:
                known = pod_dir.name in self.workers
            if pod_dir.name not in seen and not known and pod_dir.name not in handed_over:
                kill_recorded_processes(pod_dir)
                shutil.rmtree(pod_dir, ignore_errors=True)
        for pod in pods:
            self._handle("ADDED", pod)
        return str(page["metadata"]["resourceVersion"])

    def _watch(self, resource_version: str) -> str | None:
        """Follow the watch from `resource_version`; returns where to resume, None to list again."""
        response: Any = self.core.list_pod_for_all_namespaces(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            _preload_content=False,
            _request_timeout=(API_TIMEOUT[0], WATCH_TIMEOUT_SECONDS + 30),
        )
        try:
            for event in _json_lines(response):
                if self.stop.is_set():
                    break
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        log.info("pod watch expired; listing again")
                        return None
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                if kind == "BOOKMARK":
                    continue
                try:
                    self._handle(str(kind), obj)
                except Exception:
                    log.exception(
                        "handling %s of pod %s failed", kind, (obj.get("metadata") or {}).get("name")
                    )
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()
        return resource_version

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        if self.stop.is_set():
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        if kind == "DELETED":
            with self.lock:
                worker = self.workers.pop(uid, None)
                self.finalizing.discard(uid)
                self.unschedulable_reported.discard(uid)
            if worker is not None and worker.alive:
                worker.gone(pod if pod.get("spec") else None)
            else:
                shutil.rmtree(self.state_dir / "pods" / uid, ignore_errors=True)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            if wants_binding(pod):
                self._schedule(pod)
            return
        if node != self.node_name:
            return
        with self.lock:
            worker = self.workers.get(uid)
            if worker is None and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
                return
        if worker is not None and worker.update(pod):
            return
        if is_deleting(pod):
            self.final_delete(pod, background=True)

    def _schedule(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        problem = ""
        if self.cordoned:
            problem = "0/1 nodes are available: 1 node(s) were unschedulable."
        elif not node_selector_matches(pod, self.labels):
            problem = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        with self.lock:
            if problem:
                if uid in self.unschedulable_reported:
                    return
                self.unschedulable_reported.add(uid)
            elif uid in self.binding:
                return
            else:
                self.binding.add(uid)
        if problem:
            self.aux.submit(self._report_unschedulable, pod, problem)
        else:
            self.aux.submit(self._bind, pod)

    def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        try:
            for attempt in range(6):
                try:
                    _raw(self.core.create_namespaced_pod_binding, meta["name"], meta["namespace"], body)
                    log.info("bound pod %s/%s to %s", meta["namespace"], meta["name"], self.node_name)
                    return
                except Exception as exc:
                    if not _transient(exc):
                        # 409: already bound (by us, earlier); 404: deleted. Nothing to do either way.
                        log.info("binding %s/%s: %s", meta["namespace"], meta["name"], _describe(exc))
                        return
                    log.warning(
                        "binding %s/%s failed (%s); retrying", meta["namespace"], meta["name"], _describe(exc)
                    )
                    if self.stop.wait(backoff_seconds(attempt)):
                        return
        finally:
            with self.lock:
                self.binding.discard(meta["uid"])

    def _report_unschedulable(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": rfc3339(),
        }
        try:
            _raw(
                self.core.patch_namespaced_pod_status,
                meta["name"],
                meta["namespace"],
                {"status": {"conditions": [condition]}},
                _content_type=STRATEGIC_MERGE,
            )
            log.info("pod %s/%s left unscheduled: %s", meta["namespace"], meta["name"], message)
        except Exception as exc:
            log.warning(
                "reporting %s/%s unschedulable failed: %s", meta["namespace"], meta["name"], _describe(exc)
            )

    def final_delete(self, pod: Mapping[str, Any], background: bool = False) -> None:
        """Remove a terminated pod for good, as a kubelet does once its containers are gone."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        with self.lock:
            if uid in self.finalizing:
                return
            self.finalizing.add(uid)
        if background:
            self.aux.submit(self._final_delete, dict(meta))
        else:
            self._final_delete(dict(meta))

    def _final_delete(self, meta: dict[str, Any]) -> None:
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        for attempt in range(5):
            try:
                _raw(self.core.delete_namespaced_pod, meta["name"], meta["namespace"], body=options)
                log.info("pod %s/%s removed", meta["namespace"], meta["name"])
                return
            except Exception as exc:
                if not _transient(exc):
                    # 404: already gone; 409: the name now belongs to a new pod (uid precondition).
                    return
                log.warning("deleting pod %s/%s failed (%s)", meta["namespace"], meta["name"], _describe(exc))
                if self.stop.wait(backoff_seconds(attempt)):
                    return
        with self.lock:
            # Give a later event for this pod the chance to try again.
            self.finalizing.discard(meta["uid"])

    def _shutdown(self) -> None:
        with self.lock:
            workers = list(self.workers.values())
        log.info("stopping: terminating the processes of %d pod(s)", sum(w.alive for w in workers))
        for worker in workers:
            worker.shutdown()
        deadline = time.monotonic() + SHUTDOWN_GRACE_CAP_SECONDS + 3
        for worker in workers:
            worker.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for worker in workers:
            if worker.alive:
                worker._kill_everything()
        self.aux.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")


def _json_lines(response: Any) -> Iterator[dict[str, Any]]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster.kubelet", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig of the cluster")
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--state-dir", type=Path, required=True, help="pod logs, tokens, pid files")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter whose directory goes first on the pods' PATH"
    )
    parser.add_argument("--log-level", default=os.environ.get("SHARDOPS_KUBELET_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s [%(threadName)s] %(message)s",
    )
    kubelet = Kubelet(args.kubeconfig, args.node_name, args.state_dir, args.python)

    def request_stop(signum: int, _frame: object) -> None:
        log.info("received %s", signal.Signals(signum).name)
        kubelet.stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
