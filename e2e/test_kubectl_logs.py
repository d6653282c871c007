"""`kubectl logs` on the local control plane: kube-apiserver proxies pods/log to the process-kubelet's
API (TLS on loopback, at the Node's InternalIP), which serves each container run's part of its log.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from kubernetes import client
from testbed.harness import Cluster, wait_for

# Prints, then waits for a file the test creates (pods share this machine's filesystem), prints again.
SCRIPT = textwrap.dedent(
    """
    import os, pathlib, sys, time
    print("first line from", os.environ["HOSTNAME"], flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    go = pathlib.Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.05)
    print("after the go file", flush=True)
    """
)


def _pod(name: str, go_file: Path) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=2,
            containers=[
                client.V1Container(
                    name="main",
                    image="python:3.11-slim",
                    command=[sys.executable, "-c", SCRIPT, str(go_file)],
                )
            ],
        ),
    )


def _phase(core: client.CoreV1Api, namespace: str, name: str) -> str:
    return str(core.read_namespaced_pod_status(name, namespace).status.phase)


def test_kubectl_logs_and_follow(local_cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(local_cluster.api)
    node = core.read_node("local-node")
    assert {"type": "InternalIP", "address": "127.0.0.1"} in [a.to_dict() for a in node.status.addresses]
    assert node.status.daemon_endpoints.kubelet_endpoint.port > 0
    go = tmp_path / "go"
    core.create_namespaced_pod(namespace, _pod("talker", go))

    def logs_so_far() -> str:
        result = local_cluster.kubectl("logs", "-n", namespace, "talker", check=False)
        return result.stdout if result.returncode == 0 else ""

    shown = wait_for("the first line in kubectl logs", lambda: "first line from talker" in logs_so_far())
    assert shown
    assert "to stderr" in logs_so_far(), "stdout and stderr both reach the log"
    assert "after the go file" not in logs_so_far()
    assert local_cluster.kubectl("logs", "-n", namespace, "talker", "--tail=1").stdout == "to stderr\n"

    follow = subprocess.Popen(
        [str(local_cluster.bin_dir / "kubectl"), "logs", "-f", "-n", namespace, "talker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=local_cluster.env(),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(follow.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for("kubectl logs -f to print what was already written", lambda: "to stderr\n" in lines)
        assert follow.poll() is None, "kubectl logs -f follows a running container"
        go.touch()
        wait_for("the line written after -f started", lambda: "after the go file\n" in lines, timeout=30)
        # The container exits after that line: the follow ends with it, on its own.
        assert follow.wait(timeout=30) == 0, follow.stderr.read()  # type: ignore[union-attr]
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    reader.join(timeout=5)
    assert lines == ["first line from talker\n", "to stderr\n", "after the go file\n"]
    wait_for("the pod to succeed", lambda: _phase(core, namespace, "talker") == "Succeeded")
    assert "after the go file" in local_cluster.kubectl("logs", "-n", namespace, "talker").stdout


def test_kubectl_logs_of_an_unknown_container_says_so(local_cluster: Cluster, namespace: str) -> None:
    result = local_cluster.kubectl("logs", "-n", namespace, "no-such-pod", check=False)
    assert result.returncode != 0
    assert 'pods "no-such-pod" not found' in result.stderr
