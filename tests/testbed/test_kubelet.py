"""The process-kubelet's pure parts: argv/env building, status documents, restart and phase decisions."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from testbed.cluster.kubelet.container_config import (
    EntrypointUnsupported,
    EnvResolutionError,
    SourceLookup,
    build_argv,
    expand,
    field_ref_value,
    missing_entrypoints,
    parse_quantity,
    process_env,
    resolve_env,
    resource_field_value,
)
from testbed.cluster.kubelet.host import node_labels
from testbed.cluster.kubelet.identity import (
    API_SERVER_ANNOTATION,
    ClusterInfo,
    cluster_info,
    server_for,
    service_account_kubeconfig,
)
from testbed.cluster.kubelet.node import Kubelet
from testbed.cluster.kubelet.pod_status import (
    RUNNING,
    TERMINATED,
    Condition,
    ContainerRun,
    abandoned_status,
    backoff_seconds,
    build_pod_status,
    compute_phase,
    container_status,
    deletion_grace_seconds,
    exit_code_from_returncode,
    fail_running_statuses,
    initial_runs,
    merge_conditions,
    pod_conditions,
    readiness_gates_ok,
    should_restart,
    status_shows_started,
    tail_text,
    terminated_state,
)
from testbed.cluster.kubelet.probes import ProbeTracker, resolve_port
from testbed.cluster.kubelet.processes import pod_log_path
from testbed.cluster.kubelet.scheduling import node_selector_matches, wants_binding

POD: dict[str, Any] = {
    "metadata": {
        "name": "worker-0",
        "namespace": "team-a",
        "uid": "1234-uid",
        "labels": {"app": "shardops", "shard": "7"},
        "annotations": {"shardops.dev/campaign": "c1"},
    },
    "spec": {"nodeName": "local-node", "serviceAccountName": "shardops-worker", "containers": []},
}


def lookup_from(objects: Mapping[tuple[str, str], Mapping[str, str]]) -> SourceLookup:
    def lookup(kind: str, name: str) -> Mapping[str, str] | None:
        return objects.get((kind, name))

    return lookup


NO_OBJECTS = lookup_from({})


# -- $(VAR) expansion and argv --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$(A)$(B)", "12"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$$", "$"),
        ("cost: 5$", "cost: 5$"),
        ("$x and $A", "$x and $A"),
        ("$(A", "$(A"),
        ("$(A $(B)", "$(A $(B)"),
        ("$()", "$()"),
        ("$(EMPTY)", ""),
        ("$(A)$", "1$"),
    ],
)
def test_expand_follows_kubernetes_semantics(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2", "EMPTY": ""}) == expected


def test_argv_is_command_plus_args_expanded() -> None:
    container = {
        "name": "main",
        "command": ["python", "-m", "shardops.worker"],
        "args": ["--shard=$(SHARD)", "--literal=$$(SHARD)", "--missing=$(NOPE)"],
    }
    assert build_argv(container, {"SHARD": "7"}) == [
        "python",
        "-m",
        "shardops.worker",
        "--shard=7",
        "--literal=$(SHARD)",
        "--missing=$(NOPE)",
    ]


def test_argv_expands_in_command_too() -> None:
    assert build_argv({"name": "c", "command": ["$(BIN)/tool"]}, {"BIN": "/opt/bin"}) == ["/opt/bin/tool"]


@pytest.mark.parametrize(
    "container", [{"name": "main", "image": "nginx"}, {"name": "main", "image": "nginx", "args": ["-g"]}]
)
def test_argv_without_command_is_unsupported(container: dict[str, Any]) -> None:
    with pytest.raises(EntrypointUnsupported, match=r"'main' has no command.*'nginx'"):
        build_argv(container, {})


def test_missing_entrypoints_names_each_container_without_command() -> None:
    containers = [
        {"name": "init", "image": "busybox"},
        {"name": "main", "image": "app", "command": ["python", "-m", "app"]},
        {"name": "side", "image": "nginx"},
    ]
    missing = missing_entrypoints(containers)
    assert sorted(missing) == ["init", "side"]
    assert "'nginx'" in missing["side"]
    assert missing_entrypoints(containers[1:2]) == {}


# -- environment ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "worker-0"),
        ("metadata.namespace", "team-a"),
        ("metadata.uid", "1234-uid"),
        ("spec.nodeName", "local-node"),
        ("spec.serviceAccountName", "shardops-worker"),
        ("status.podIP", "127.0.0.1"),
        ("status.podIPs", "127.0.0.1"),
        ("status.hostIP", "127.0.0.1"),
        ("metadata.labels['shard']", "7"),
        ('metadata.labels["app"]', "shardops"),
        ("metadata.labels['absent']", ""),
        ("metadata.annotations['shardops.dev/campaign']", "c1"),
    ],
)
def test_field_ref_values(path: str, expected: str) -> None:
    assert field_ref_value(POD, path) == expected


@pytest.mark.parametrize("path", ["metadata.labels", "spec.containers", "status.phase", ""])
def test_unsupported_field_refs_raise(path: str) -> None:
    with pytest.raises(EnvResolutionError):
        field_ref_value(POD, path)


def test_resolve_env_literal_values_expand_from_earlier_vars_and_context() -> None:
    container = {
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-b-$(LATER)-$(HOSTNAME)"},
            {"name": "LATER", "value": "late"},
            {"name": "ESC", "value": "$$(A)"},
        ]
    }
    env = resolve_env(container, POD, NO_OBJECTS, {"HOSTNAME": "worker-0"})
    # A variable declared later is not visible yet, exactly as in Kubernetes.
    assert env == {"A": "a", "B": "a-b-$(LATER)-worker-0", "LATER": "late", "ESC": "$(A)"}


def test_resolve_env_value_from_sources() -> None:
    lookup = lookup_from(
        {("ConfigMap", "settings"): {"level": "debug"}, ("Secret", "creds"): {"token": "t0k"}}
    )
    container = {
        "name": "main",
        "resources": {"limits": {"cpu": "1500m", "memory": "256Mi"}},
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": True}}},
            {
                "name": "NOKEY",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "x", "optional": True}},
            },
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "MEM_MI",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {"name": "REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
        ],
    }
    env = resolve_env(container, POD, lookup)
    assert env == {
        "POD": "worker-0",
        "LEVEL": "debug",
        "TOKEN": "t0k",
        "CPUS": "2",
        "MEM_MI": "256",
        "REQ": "0",
    }


def test_resource_field_limits_default_to_node_allocatable() -> None:
    assert resource_field_value({}, "limits.cpu", None) == "2"
    assert resource_field_value({}, "limits.memory", "1Gi") == "24"


def test_value_from_is_not_expanded() -> None:
    lookup = lookup_from({("ConfigMap", "cm"): {"k": "$(A)"}})
    container = {
        "env": [
            {"name": "A", "value": "a"},
            {"name": "RAW", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        ]
    }
    assert resolve_env(container, POD, lookup)["RAW"] == "$(A)"


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"configMapKeyRef": {"name": "absent", "key": "k"}}, 'configmap "absent" not found'),
        ({"secretKeyRef": {"name": "creds", "key": "missing"}}, "couldn't find key missing in Secret creds"),
    ],
)
def test_required_references_raise(ref: dict[str, Any], message: str) -> None:
    lookup = lookup_from({("Secret", "creds"): {"token": "x"}})
    with pytest.raises(EnvResolutionError, match=message):
        resolve_env({"env": [{"name": "X", "valueFrom": ref}]}, POD, lookup)


def test_env_from_with_prefix_and_env_overrides() -> None:
    lookup = lookup_from(
        {
            ("ConfigMap", "settings"): {"LEVEL": "debug", "bad=key": "x", "SHARED": "from-cm"},
            ("Secret", "creds"): {"TOKEN": "t"},
        }
    )
    container = {
        "envFrom": [
            {"configMapRef": {"name": "settings"}},
            {"secretRef": {"name": "creds"}, "prefix": "S_"},
            {"configMapRef": {"name": "absent", "optional": True}},
        ],
        "env": [{"name": "SHARED", "value": "from-env:$(LEVEL)"}],
    }
    env = resolve_env(container, POD, lookup)
    assert env == {"LEVEL": "debug", "SHARED": "from-env:debug", "S_TOKEN": "t"}


def test_env_from_missing_required_source_raises() -> None:
    with pytest.raises(EnvResolutionError, match='secret "creds" not found'):
        resolve_env({"envFrom": [{"secretRef": {"name": "creds"}}]}, POD, NO_OBJECTS)


def test_process_env_layers_host_kubelet_and_pod() -> None:
    inherited = {
        "PATH": "/usr/bin",
        "KUBECONFIG": "/admin/kubeconfig",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOME": "/root",
        "SHARED": "host",
    }
    injected = {"KUBECONFIG": "/state/pods/u/kubeconfig", "HOSTNAME": "worker-0", "SHARED": "kubelet"}
    env = process_env(inherited, injected, {"SHARED": "pod"}, "/venv/bin")
    assert env["PATH"] == "/venv/bin:/usr/bin"
    assert env["KUBECONFIG"] == "/state/pods/u/kubeconfig"
    assert "KUBERNETES_SERVICE_HOST" not in env
    assert env["HOME"] == "/root"
    assert env["SHARED"] == "pod"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_process_env_without_service_account_drops_the_admin_kubeconfig() -> None:
    env = process_env({"KUBECONFIG": "/admin", "PATH": "/bin"}, {"HOSTNAME": "p"}, {}, "/venv/bin")
    assert "KUBECONFIG" not in env


def test_pod_can_set_its_own_path() -> None:
    env = process_env({"PATH": "/bin"}, {}, {"PATH": "/custom"}, "/venv/bin")
    assert env["PATH"] == "/custom"


# -- restarts and exits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "exit_code", "restart"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 2, True),
        ("OnFailure", 137, True),
        ("Never", 0, False),
        ("Never", 1, False),
    ],
)
def test_should_restart(policy: str, exit_code: int, restart: bool) -> None:
    assert should_restart(policy, exit_code) is restart


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_seconds(step) for step in range(7)] == [1, 2, 4, 8, 16, 30, 30]


@pytest.mark.parametrize(("returncode", "exit_code"), [(0, 0), (3, 3), (-15, 143), (-9, 137)])
def test_exit_codes_of_signalled_processes(returncode: int, exit_code: int) -> None:
    assert exit_code_from_returncode(returncode) == exit_code


def test_tail_text_keeps_last_lines_within_bounds() -> None:
    data = "".join(f"line {i}\n" for i in range(100)).encode()
    assert tail_text(data, max_lines=3) == "line 97\nline 98\nline 99"
    assert len(tail_text(b"x" * 10_000, max_bytes=100)) == 100


# -- status documents ----------------------------------------------------------------------------------


def running(name: str = "main", *, ready: bool = True, pid: int = 42) -> ContainerRun:
    return ContainerRun(name, "img:1", state=RUNNING, pid=pid, started_at="2030-01-01T00:00:00Z", ready=ready)


def exited(name: str = "main", code: int = 0, pid: int = 42) -> ContainerRun:
    term = terminated_state(
        code, "2030-01-01T00:00:00Z", "2030-01-01T00:01:00Z", pid, message="" if code == 0 else "boom"
    )
    return ContainerRun(
        name, "img:1", state=TERMINATED, pid=pid, started_at="2030-01-01T00:00:00Z", terminated=term
    )


def test_initial_runs_wait_behind_init_containers_and_mark_sidecars() -> None:
    init_runs, runs = initial_runs(
        [{"name": "setup", "image": "a"}, {"name": "proxy", "image": "b", "restartPolicy": "Always"}],
        [{"name": "main", "image": "c"}],
    )
    assert [(r.name, r.sidecar, r.waiting_reason) for r in init_runs] == [
        ("setup", False, "PodInitializing"),
        ("proxy", True, "PodInitializing"),
    ]
    assert [(r.name, r.state, r.waiting_reason) for r in runs] == [("main", "waiting", "PodInitializing")]
    _, alone = initial_runs([], [{"name": "main", "image": "c"}])
    assert alone[0].waiting_reason == "ContainerCreating"


def test_running_container_status() -> None:
    assert container_status(running()) == {
        "name": "main",
        "image": "img:1",
        "imageID": "process://img:1",
        "containerID": "process://42",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2030-01-01T00:00:00Z"}},
        "lastState": {},
    }


def test_terminated_container_status() -> None:
    status = container_status(exited(code=3))
    assert status["state"] == {
        "terminated": {
            "exitCode": 3,
            "reason": "Error",
            "startedAt": "2030-01-01T00:00:00Z",
            "finishedAt": "2030-01-01T00:01:00Z",
            "containerID": "process://42",
            "message": "boom",
        }
    }
    assert status["ready"] is False and status["started"] is False
    assert container_status(exited(code=0))["state"]["terminated"]["reason"] == "Completed"


def test_waiting_container_status_with_last_state() -> None:
    run = ContainerRun(
        "main",
        "img:1",
        waiting_reason="CrashLoopBackOff",
        waiting_message="back-off 2s",
        restart_count=2,
        last_terminated=terminated_state(1, None, "2030-01-01T00:01:00Z", None),
    )
    status = container_status(run)
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2s"}}
    assert status["lastState"] == {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2030-01-01T00:01:00Z"}
    }
    assert status["restartCount"] == 2
    assert "containerID" not in status


def test_failed_start_has_no_start_time() -> None:
    state = terminated_state(
        128, None, "2030-01-01T00:00:00Z", None, message="no such file", reason="StartError"
    )
    assert state == {
        "exitCode": 128,
        "reason": "StartError",
        "finishedAt": "2030-01-01T00:00:00Z",
        "message": "no such file",
    }


@pytest.mark.parametrize(
    ("policy", "init", "runs", "stopping", "phase"),
    [
        ("Never", [], [ContainerRun("main", "i")], False, "Pending"),
        ("Never", [], [running()], False, "Running"),
        ("Never", [], [exited(code=0)], False, "Succeeded"),
        ("Never", [], [exited(code=1)], False, "Failed"),
        ("Never", [], [exited("a", 0), running("b")], False, "Running"),
        ("Never", [], [exited("a", 0), exited("b", 2)], False, "Failed"),
        ("OnFailure", [], [exited(code=0)], False, "Succeeded"),
        # The worker never leaves a container it will restart in `terminated`; still, decide safely.
        ("OnFailure", [], [exited(code=1)], False, "Running"),
        ("Always", [], [exited(code=0)], False, "Running"),
        ("Always", [], [exited(code=143)], True, "Failed"),
        ("Always", [], [exited(code=0)], True, "Succeeded"),
        ("Never", [], [running()], True, "Failed"),
        ("Never", [exited("init", 1)], [ContainerRun("main", "i")], False, "Failed"),
        ("Never", [running("init")], [ContainerRun("main", "i")], False, "Pending"),
        ("Never", [exited("init", 0)], [running()], False, "Running"),
    ],
)
def test_compute_phase(
    policy: str, init: list[ContainerRun], runs: list[ContainerRun], stopping: bool, phase: str
) -> None:
    assert compute_phase(policy, init, runs, stopping=stopping) == phase


def test_crash_looping_container_keeps_the_pod_running() -> None:
    looping = ContainerRun(
        "main",
        "i",
        waiting_reason="CrashLoopBackOff",
        last_terminated=terminated_state(1, None, "t", 9),
        restart_count=1,
    )
    assert compute_phase("Always", [], [looping]) == "Running"


def test_sidecar_exit_codes_do_not_decide_the_phase() -> None:
    sidecar = exited("side", 143)
    sidecar.sidecar = True
    assert compute_phase("Never", [sidecar], [exited("main", 0)]) == "Succeeded"


def conditions_by_type(conditions: list[Condition]) -> dict[str, tuple[str, str, str]]:
    return {c[0]: c[1:] for c in conditions}


def test_conditions_of_a_ready_pod() -> None:
    conditions = conditions_by_type(pod_conditions("Running", [], [running()], initialized=True))
    assert {name: value[0] for name, value in conditions.items()} == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }


def test_conditions_while_initializing_and_unready() -> None:
    init = [exited("first", 0), running("second")]
    conditions = conditions_by_type(
        pod_conditions("Pending", init, [ContainerRun("main", "i")], initialized=False)
    )
    assert conditions["Initialized"] == (
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [second]",
    )
    assert conditions["Ready"] == ("False", "ContainersNotReady", "containers with unready status: [main]")


def test_readiness_probe_failure_and_gates_make_the_pod_unready() -> None:
    unready = conditions_by_type(pod_conditions("Running", [], [running(ready=False)], initialized=True))
    assert unready["ContainersReady"][0] == "False" and unready["Ready"][0] == "False"
    gated = conditions_by_type(
        pod_conditions("Running", [], [running()], initialized=True, readiness_gates_ok=False)
    )
    assert gated["ContainersReady"][0] == "True"
    assert gated["Ready"][:2] == ("False", "ReadinessGatesNotReady")


def test_completed_pod_is_not_ready() -> None:
    conditions = conditions_by_type(pod_conditions("Succeeded", [], [exited()], initialized=True))
    assert conditions["Ready"] == ("False", "PodCompleted", "")


def test_merge_conditions_moves_transition_time_only_on_change() -> None:
    previous = [
        {"type": "Ready", "status": "False", "lastTransitionTime": "T0", "reason": "ContainersNotReady"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "T0"},
    ]
    merged = merge_conditions(previous, [("PodScheduled", "True", "", ""), ("Ready", "True", "", "")], "T1")
    by_type = {c["type"]: c for c in merged}
    assert by_type["PodScheduled"]["lastTransitionTime"] == "T0"
    assert by_type["Ready"]["lastTransitionTime"] == "T1"
    # null clears the stale reason in a strategic merge patch.
    assert by_type["Ready"]["reason"] is None and by_type["Ready"]["message"] is None


def test_build_pod_status() -> None:
    conditions = merge_conditions([], pod_conditions("Running", [], [running()], initialized=True), "T")
    status = build_pod_status(
        phase="Running", init_runs=[], runs=[running()], conditions=conditions, start_time="T"
    )
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.1" and status["podIPs"] == [{"ip": "127.0.0.1"}]
    assert status["hostIP"] == "127.0.0.1" and status["hostIPs"] == [{"ip": "127.0.0.1"}]
    assert status["startTime"] == "T"
    assert [c["name"] for c in status["containerStatuses"]] == ["main"]
    assert "initContainerStatuses" not in status and "reason" not in status


def test_build_failed_pod_status_with_reason_and_init_statuses() -> None:
    status = build_pod_status(
        phase="Failed",
        init_runs=[exited("init", 0)],
        runs=[exited(code=1)],
        conditions=[],
        start_time=None,
        reason="DeadlineExceeded",
        message="too long",
    )
    assert status["reason"] == "DeadlineExceeded" and status["message"] == "too long"
    assert [c["name"] for c in status["initContainerStatuses"]] == ["init"]
    assert "startTime" not in status


def test_fail_running_statuses_after_a_kubelet_restart() -> None:
    statuses = [
        container_status(running("a")),
        container_status(exited("b", 0)),
    ]
    failed = fail_running_statuses(statuses, "KubeletRestarted", "gone", "T9")
    assert failed[0]["state"]["terminated"]["reason"] == "KubeletRestarted"
    assert failed[0]["state"]["terminated"]["startedAt"] == "2030-01-01T00:00:00Z"
    assert failed[0]["state"]["terminated"]["exitCode"] == 137
    assert failed[1]["state"] == statuses[1]["state"]
    assert not any(s["ready"] for s in failed)


def test_abandoned_status_fails_the_pod_and_ends_its_running_containers() -> None:
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "T1"}],
        "containerStatuses": [container_status(running("a"))],
    }
    patch = abandoned_status(status, "T9")
    assert (patch["phase"], patch["reason"]) == ("Failed", "KubeletRestarted")
    assert "initContainerStatuses" not in patch
    assert patch["containerStatuses"][0]["state"]["terminated"]["reason"] == "KubeletRestarted"
    ready = {c["type"]: c for c in patch["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == (
        "False",
        "KubeletRestarted",
        "T9",
    )


def test_status_shows_started() -> None:
    assert not status_shows_started({"status": {"phase": "Pending"}})
    assert status_shows_started({"status": {"phase": "Running"}})
    init_running = {"status": {"phase": "Pending", "initContainerStatuses": [{"state": {"running": {}}}]}}
    assert status_shows_started(init_running)


# -- scheduling, deletion, kubeconfig ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "extra", "wanted"),
    [
        ({}, {}, True),
        ({"schedulerName": "default-scheduler"}, {}, True),
        ({"schedulerName": "other"}, {}, False),
        ({"nodeName": "local-node"}, {}, False),
        ({"schedulingGates": [{"name": "wait"}]}, {}, False),
        ({}, {"metadata": {"deletionTimestamp": "T"}}, False),
        ({}, {"status": {"phase": "Failed"}}, False),
    ],
)
def test_wants_binding(spec: dict[str, Any], extra: dict[str, Any], wanted: bool) -> None:
    assert wants_binding({"spec": spec, **extra}) is wanted


def test_node_selector() -> None:
    labels = node_labels("local-node")
    assert node_selector_matches({"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}}}, labels)
    assert node_selector_matches({"spec": {}}, labels)
    assert not node_selector_matches({"spec": {"nodeSelector": {"disk": "ssd"}}}, labels)


def test_deletion_grace_period() -> None:
    assert deletion_grace_seconds({"metadata": {"deletionGracePeriodSeconds": 5}}) == 5
    assert deletion_grace_seconds({"metadata": {}, "spec": {"terminationGracePeriodSeconds": 7}}) == 7
    assert deletion_grace_seconds({"metadata": {}, "spec": {}}) == 30
    assert (
        deletion_grace_seconds(
            {"metadata": {"deletionGracePeriodSeconds": 0}, "spec": {"terminationGracePeriodSeconds": 7}}
        )
        == 0
    )


def test_readiness_gates() -> None:
    pod: dict[str, Any] = {
        "spec": {"readinessGates": [{"conditionType": "example.com/ok"}]},
        "status": {"conditions": []},
    }
    assert not readiness_gates_ok(pod)
    pod["status"]["conditions"] = [{"type": "example.com/ok", "status": "True"}]
    assert readiness_gates_ok(pod)


def test_log_path_layout(tmp_path: Path) -> None:
    assert pod_log_path(tmp_path, "ns", "pod", "main") == tmp_path / "logs" / "ns" / "pod" / "main.log"


def test_service_account_kubeconfig_from_admin_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"PEM")
    admin = {
        "clusters": [
            {"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"}}
        ],
        "users": [{"name": "admin", "user": {"client-certificate": "admin.crt", "client-key": "admin.key"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "admin"}}],
        "current-context": "ctx",
    }
    info = cluster_info(admin, tmp_path)
    assert info == ClusterInfo(server="https://127.0.0.1:6443", ca_pem=b"PEM")
    kubeconfig = service_account_kubeconfig(info, "tok", "team-a", "system:serviceaccount:team-a:default")
    assert kubeconfig["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority-data": base64.b64encode(b"PEM").decode(),
    }
    assert kubeconfig["users"][0]["user"] == {"token": "tok"}
    context = kubeconfig["contexts"][0]
    assert kubeconfig["current-context"] == context["name"]
    assert context["context"]["namespace"] == "team-a"
    assert "client-key" not in str(kubeconfig)


def test_a_namespace_annotation_points_its_pods_at_another_api_server() -> None:
    info = ClusterInfo(server="https://127.0.0.1:6443", ca_pem=b"PEM", tls_server_name="kubernetes")

    def namespace(annotations: dict[str, str] | None) -> dict[str, object]:
        return {"metadata": {"name": "ns", **({"annotations": annotations} if annotations else {})}}

    proxied = server_for(namespace({API_SERVER_ANNOTATION: "https://127.0.0.1:7000"}), info)
    # Only the address changes: the pods still verify it with the cluster CA.
    assert proxied == ClusterInfo(
        server="https://127.0.0.1:7000", ca_pem=b"PEM", tls_server_name="kubernetes"
    )
    assert service_account_kubeconfig(proxied, "t", "ns", "u")["clusters"][0]["cluster"]["server"] == (
        "https://127.0.0.1:7000"
    )
    assert server_for(namespace(None), info) == info
    assert server_for(namespace({"other": "x"}), info) == info
    # Not an https URL: ignored, the pods reach the API server directly.
    assert server_for(namespace({API_SERVER_ANNOTATION: "127.0.0.1:7000"}), info) == info


def test_cluster_info_with_inline_ca() -> None:
    admin = {
        "clusters": [{"name": "c", "cluster": {"server": "https://h", "certificate-authority-data": "UEVN"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c"}}],
        "current-context": "ctx",
    }
    assert cluster_info(admin, Path("/nonexistent")).ca_pem == b"PEM"


def test_resolve_port() -> None:
    container = {"name": "web", "ports": [{"name": "http", "containerPort": 8080}]}
    assert resolve_port(9090, container) == 9090
    assert resolve_port("9090", container) == 9090
    assert resolve_port("http", container) == 8080
    with pytest.raises(ValueError, match="no port named 'grpc'"):
        resolve_port("grpc", container)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1Gi", Decimal(2**30)),
        ("1e3", Decimal(1000)),
        ("1k", Decimal(1000)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_probe_tracker_thresholds() -> None:
    tracker = ProbeTracker(probe={"successThreshold": 2, "failureThreshold": 2}, next_at=0)
    tracker.record(True)
    assert not tracker.ready
    tracker.record(True)
    assert tracker.ready
    tracker.record(False)
    assert tracker.ready
    tracker.record(False)
    assert not tracker.ready


# -- the watch stream (no cluster: a canned response) --------------------------------------------------


class CannedResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks

    def release_conn(self) -> None:
        pass


class CannedCore:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.calls: list[dict[str, Any]] = []

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> CannedResponse:
        self.calls.append(kwargs)
        return CannedResponse(self.chunks)


class RecordingKubelet(Kubelet):
    """Just enough of a Kubelet to follow a watch; records what it would handle."""

    def __init__(self, chunks: list[bytes]) -> None:  # no API client, on purpose
        self.core = CannedCore(chunks)  # type: ignore[assignment]
        self.stop = threading.Event()
        self.handled: list[tuple[str, str]] = []

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        self.handled.append((kind, pod["metadata"]["name"]))


def event(kind: str, name: str, rv: str) -> bytes:
    return (
        json.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}).encode()
        + b"\n"
    )


def test_watch_follows_events_and_bookmarks_across_chunk_boundaries() -> None:
    stream = event("ADDED", "a", "5") + event("BOOKMARK", "", "9") + event("MODIFIED", "a", "11")
    kubelet = RecordingKubelet([stream[:30], stream[30:100], stream[100:]])
    assert kubelet._watch("3") == "11"
    assert kubelet.handled == [("ADDED", "a"), ("MODIFIED", "a")]
    call = kubelet.core.calls[0]  # type: ignore[attr-defined]
    assert call["watch"] is True and call["resource_version"] == "3" and call["allow_watch_bookmarks"] is True


def test_watch_resumes_from_a_bookmark() -> None:
    kubelet = RecordingKubelet([event("ADDED", "a", "5"), event("BOOKMARK", "", "42")])
    assert kubelet._watch("3") == "42"


def test_watch_asks_for_a_relist_when_the_version_is_gone() -> None:
    gone = json.dumps(
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    ).encode()
    kubelet = RecordingKubelet([event("ADDED", "a", "5"), gone + b"\n"])
    assert kubelet._watch("3") is None
    assert kubelet.handled == [("ADDED", "a")]


def test_watch_raises_other_errors() -> None:
    error = json.dumps(
        {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}
    ).encode()
    with pytest.raises(ApiException):
        RecordingKubelet([error])._watch("3")
