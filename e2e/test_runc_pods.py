"""Pods in real containers: the process-kubelet runs a pod whose image `make image` built inside runc.

The image's read-only root, its user and the pod's securityContext are real here: a write outside
the /tmp emptyDir fails, the container runs as UID 65532 without capabilities, it sees its
service-account token where Kubernetes puts it and reaches the API server with it. Pods whose image
was not built locally still run as processes, with a note in their events. The chart's operator
and a campaign's workers run from the image.

Skipped, with the missing piece named, where runc or root or the image archive is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from typing import Any

import pytest
from kubernetes import client
from testbed.cluster.images import SHARDOPS_ARCHIVE, read_archive
from testbed.harness import Cluster, dump_json, wait_for
from testbed.kits import chart as chartkit

IMAGE = "ghcr.io/shardops/shardops:0.1.0"


def _missing() -> str | None:
    if shutil.which("runc") is None:
        return "runc is not installed (make tools installs it with apt-get)"
    if os.geteuid() != 0:
        return "runc containers need the process-kubelet to run as root"
    if not SHARDOPS_ARCHIVE.is_file():
        return f"no image archive at {SHARDOPS_ARCHIVE}: run `make image`"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

# Runs inside the container; prints one JSON line of what it found.
PROBE = textwrap.dedent(
    """
    import json, os, pathlib
    found = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd()}
    for path in ("/tmp/written", "/var/tmp/written", "/opt/shardops/written", "/written"):
        try:
            pathlib.Path(path).write_text("x")
            found[path] = "ok"
        except OSError as exc:
            found[path] = exc.strerror
    status = pathlib.Path("/proc/self/status").read_text()
    found["CapEff"] = [l.split()[1] for l in status.splitlines() if l.startswith("CapEff")][0]
    found["NoNewPrivs"] = [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")][0]
    sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
    found["namespace"] = (sa / "namespace").read_text()
    found["token"] = bool((sa / "token").read_text())
    found["host_repository_visible"] = pathlib.Path(os.environ["REPO"]).exists()
    found["hostname"] = os.uname().nodename
    import getpass
    found["user"] = getpass.getuser()
    from kubernetes import client, config
    config.load_kube_config()
    found["api_version"] = client.VersionApi().get_code().git_version
    print(json.dumps(found), flush=True)
    """
)


def _pod(name: str, command: list[str], **security: Any) -> dict[str, Any]:
    context = {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        **security,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": command,
                    "env": [{"name": "REPO", "value": str(SHARDOPS_ARCHIVE.parent.parent)}],
                    "securityContext": context,
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    pod = client.CoreV1Api(cluster.api).read_namespaced_pod(name, namespace)
    return dict(cluster.api.sanitize_for_serialization(pod.status))


def _finished(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = _status(cluster, namespace, name)
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def _events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = cluster.kubectl(
        "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={name}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return items


def test_pod_runs_in_runc_with_a_read_only_root_as_its_user(local_cluster: Cluster, namespace: str) -> None:
    cluster = local_cluster
    cluster.kubectl(
        "create", "-n", namespace, "-f", "-", stdin=dump_json(_pod("probe", ["python3", "-c", PROBE]))
    )
    status = wait_for("the probe pod to finish", lambda: _finished(cluster, namespace, "probe"), timeout=180)
    logs = cluster.kubectl("logs", "-n", namespace, "probe").stdout
    assert status["phase"] == "Succeeded", f"{status}\n{logs}"
    found = json.loads(logs.strip().splitlines()[-1])
    assert found["uid"] == 65532 and found["gid"] == 65532, "the image's USER"
    assert found["cwd"] == "/tmp", "the image's WORKDIR"
    assert found["/tmp/written"] == "ok", "the /tmp emptyDir is writable"
    # /var/tmp is writable by every user (mode 1777): only the read-only root stops this write.
    assert found["/var/tmp/written"] == "Read-only file system"
    assert found["/opt/shardops/written"] == "Read-only file system"
    assert found["/written"] == "Read-only file system"
    assert int(found["CapEff"], 16) == 0, "capabilities: drop ALL"
    assert found["NoNewPrivs"] == "1", "allowPrivilegeEscalation: false"
    assert found["namespace"] == namespace and found["token"]
    assert found["api_version"].startswith("v1."), "the service-account kubeconfig reaches the API server"
    assert found["host_repository_visible"] is False, "the container sees the image, not the host"
    assert found["hostname"] == "probe"
    assert found["user"] == "shardops", "UID 65532 has a name (kopf's getpass.getuser())"
    (container,) = status["containerStatuses"]
    assert container["containerID"].startswith("runc://")
    (image,) = read_archive(SHARDOPS_ARCHIVE)
    assert container["imageID"] == image.digest
    assert not [e for e in _events(cluster, namespace, "probe") if e["reason"] == "RunAsProcess"]


def test_writable_root_when_the_security_context_allows_it(local_cluster: Cluster, namespace: str) -> None:
    cluster = local_cluster
    script = "import pathlib; pathlib.Path('/var/tmp/written').write_text('x'); print('wrote')"
    pod = _pod("writer", ["python3", "-c", script], readOnlyRootFilesystem=False)
    cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=dump_json(pod))
    status = wait_for(
        "the writer pod to finish", lambda: _finished(cluster, namespace, "writer"), timeout=180
    )
    assert status["phase"] == "Succeeded", status
    assert cluster.kubectl("logs", "-n", namespace, "writer").stdout == "wrote\n"
    # The write went to the container's own layer, not to the rootfs other containers share.
    (image,) = read_archive(SHARDOPS_ARCHIVE)
    from testbed.cluster.images import rootfs_cache

    shared = rootfs_cache() / image.digest.replace(":", "-") / "rootfs"
    assert (shared / "opt" / "shardops" / "bin" / "shardops").exists()
    assert (shared / "var" / "tmp").is_dir()
    assert not (shared / "var" / "tmp" / "written").exists()


def test_run_as_non_root_refuses_uid_0(local_cluster: Cluster, namespace: str) -> None:
    cluster = local_cluster
    pod = _pod("as-root", ["python3", "-c", "print('ran')"], runAsUser=0)
    cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=dump_json(pod))

    def refused() -> dict[str, Any] | None:
        statuses = _status(cluster, namespace, "as-root").get("containerStatuses") or []
        waiting = (statuses[0]["state"].get("waiting") or {}) if statuses else {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = wait_for("runAsNonRoot to refuse UID 0", refused, timeout=120)
    assert waiting["message"] == "container has runAsNonRoot and image will run as root"


def test_a_missing_entrypoint_fails_the_pod_with_the_reason(local_cluster: Cluster, namespace: str) -> None:
    cluster = local_cluster
    cluster.kubectl(
        "create", "-n", namespace, "-f", "-", stdin=dump_json(_pod("nothing", ["no-such-command"]))
    )
    status = wait_for("the pod to fail", lambda: _finished(cluster, namespace, "nothing"), timeout=120)
    assert status["phase"] == "Failed"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "StartError", terminated
    assert "no-such-command" in terminated["message"]


def test_a_write_to_the_read_only_root_fails_the_pod_with_the_reason(
    local_cluster: Cluster, namespace: str
) -> None:
    cluster = local_cluster
    script = "open('/var/tmp/state', 'w')"
    cluster.kubectl(
        "create", "-n", namespace, "-f", "-", stdin=dump_json(_pod("ro-write", ["python3", "-c", script]))
    )
    status = wait_for("the pod to fail", lambda: _finished(cluster, namespace, "ro-write"), timeout=120)
    assert status["phase"] == "Failed"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (1, "Error")
    assert "OSError: [Errno 30] Read-only file system: '/var/tmp/state'" in terminated["message"]


def test_an_image_not_built_here_runs_as_a_process_with_a_note(
    local_cluster: Cluster, namespace: str
) -> None:
    cluster = local_cluster
    pod = _pod("elsewhere", ["python", "-c", "import os; print(os.path.exists(os.environ['REPO']))"])
    pod["spec"]["containers"][0]["image"] = "registry.example.com/not-built-here:1"
    cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=dump_json(pod))
    status = wait_for("the pod to finish", lambda: _finished(cluster, namespace, "elsewhere"), timeout=120)
    assert status["phase"] == "Succeeded", status
    assert cluster.kubectl("logs", "-n", namespace, "elsewhere").stdout == "True\n", "a host process"
    notes = wait_for(
        "the RunAsProcess event",
        lambda: [e for e in _events(cluster, namespace, "elsewhere") if e["reason"] == "RunAsProcess"],
    )
    assert [n["message"] for n in notes] == [
        "image 'registry.example.com/not-built-here:1' is not built locally: "
        "container main runs as a process on the node"
    ]


# --- the chart's operator and a campaign's workers, from the image ------------------------------------


def _campaign(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": [{"lang": "en", "text": "hello"}, {"lang": "fr", "text": "bonjour"}],
            "shardSize": 1,
            "maxConcurrency": 2,
            "leaseSeconds": 30,
            "idleSeconds": 2,
            "worker": {"image": IMAGE, "command": ["shardops-example-agent"]},
        },
    }


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    return items


def _operator_running_in_runc(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    for pod in _pods(cluster, namespace, "app.kubernetes.io/component=operator"):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("ready") and str(status.get("containerID", "")).startswith("runc://"):
                return pod
    return None


@pytest.mark.usefixtures("crds_installed")
def test_charts_operator_and_campaign_workers_run_from_the_image(
    local_cluster: Cluster, namespace: str
) -> None:
    cluster = local_cluster
    chartkit.install_chart(cluster, namespace)
    try:
        pod = wait_for(
            "the chart's operator to be ready in runc",
            lambda: _operator_running_in_runc(cluster, namespace),
            timeout=180,
            interval=1.0,
        )
        context = pod["spec"]["containers"][0]["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
        cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=dump_json(_campaign("greetings")))

        def phase() -> str | None:
            campaign = json.loads(
                cluster.kubectl("get", "campaign", "greetings", "-n", namespace, "-o", "json").stdout
            )
            return (campaign.get("status") or {}).get("phase")

        try:
            wait_for(
                "campaign greetings to succeed", lambda: phase() == "Succeeded", timeout=240, interval=1.0
            )
        except AssertionError as error:
            state = cluster.kubectl("get", "campaigns,shards,jobs,pods", "-n", namespace, check=False).stdout
            operator_log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False)
            raise AssertionError(f"{error}\n{state}\n{operator_log.stdout[-3000:]}") from None
        workers = _pods(cluster, namespace, "shardops.dev/campaign=greetings")
        assert workers, "worker pods are kept until their Job goes"
        in_runc = [
            s["containerID"]
            for w in workers
            for s in (w.get("status") or {}).get("containerStatuses") or []
            if str(s.get("containerID", "")).startswith("runc://")
        ]
        assert len(in_runc) == len(workers), "every worker ran from the image in runc"
        operator_log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
        assert "shardops.scheduler" in operator_log, operator_log[-2000:]
        worker_log = cluster.kubectl("logs", "-n", namespace, workers[0]["metadata"]["name"]).stdout
        assert "shardops.worker" in worker_log, worker_log[-2000:]
    finally:
        chartkit.uninstall_chart(cluster, namespace, check=False)
