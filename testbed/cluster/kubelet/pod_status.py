"""What the pod status says (pure): container states, restart and back-off decisions, the phase,
conditions, the status document, and the questions asked of a pod object (deleting? started?).

Pods and statuses are the API's JSON (camelCase dicts); `ContainerRun` is the kubelet's own record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.cluster.kubelet.host import HOST_IP, POD_IP

DEFAULT_GRACE_SECONDS = 30
# Much shorter than the real 10 s .. 5 min: tests should see restarts, not wait for them.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0
BACKOFF_RESET_AFTER_SECONDS = 60.0
MESSAGE_TAIL_LINES = 20
MESSAGE_TAIL_BYTES = 2048

WAITING = "waiting"
RUNNING = "running"
TERMINATED = "terminated"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


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
    # Containers in runc: "runc://<id>" and the image's manifest digest (processes: None).
    container_id: str | None = None
    image_id: str | None = None

    @property
    def ever_started(self) -> bool:
        return self.pid is not None or self.terminated is not None or self.last_terminated is not None

    @property
    def exit_code(self) -> int | None:
        return None if self.terminated is None else int(self.terminated["exitCode"])


def initial_runs(
    init_specs: Sequence[Mapping[str, Any]], specs: Sequence[Mapping[str, Any]]
) -> tuple[list[ContainerRun], list[ContainerRun]]:
    """The init containers and containers of a pod as first seen, all waiting; sidecars marked."""
    init_runs = [
        ContainerRun(
            c["name"],
            c.get("image", ""),
            sidecar=c.get("restartPolicy") == "Always",
            waiting_reason="PodInitializing",
        )
        for c in init_specs
    ]
    first_reason = "PodInitializing" if init_specs else "ContainerCreating"
    runs = [ContainerRun(c["name"], c.get("image", ""), waiting_reason=first_reason) for c in specs]
    return init_runs, runs


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
        "imageID": run.image_id or f"process://{run.image}",
        "ready": run.state == RUNNING and run.ready,
        "started": run.state == RUNNING,
        "restartCount": run.restart_count,
        "state": state,
        "lastState": {"terminated": dict(run.last_terminated)} if run.last_terminated else {},
    }
    if run.container_id is not None:
        status["containerID"] = run.container_id
    elif run.pid is not None:
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


def abandoned_status(status: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status patch for a pod an earlier kubelet was running: Failed, its running containers ended."""
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
    return patch


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


def readiness_gates_ok(pod: Mapping[str, Any]) -> bool:
    gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
    if not gates:
        return True
    true = {
        c.get("type") for c in (pod.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
    }
    return all(gate in true for gate in gates)
