"""No orphans: stopping the local control plane, even by SIGKILL of its supervisor, ends every process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config
from testbed.cluster import lifecycle
from testbed.harness import REPO_ROOT, wait_for


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_no_process_outlives_the_supervisor(tmp_path: Path, stop_signal: signal.Signals) -> None:
    if os.environ.get("KUBECONFIG") and not os.environ.get("SHARDOPS_E2E_LOCAL"):
        pytest.skip("about the local control plane only")
    directory = tmp_path / "cluster"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "testbed.cluster.lifecycle", "run", f"--dir={directory}"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = directory / "ready.json"
        wait_for("the supervised cluster to be ready", ready.exists, timeout=180)
        kubeconfig = json.loads(ready.read_text())["kubeconfig"]
        api = config.new_client_from_config(kubeconfig)
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            "default",
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="sleeper"),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[
                        client.V1Container(
                            name="main",
                            image="none",
                            command=["python", "-c", "import time; time.sleep(600)"],
                        )
                    ],
                ),
            ),
        )
        wait_for(
            "the pod to run",
            lambda: core.read_namespaced_pod_status("sleeper", "default").status.phase == "Running",
        )
        api.close()
        running = lifecycle.leftovers(directory)
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in running}
        # etcd, kube-apiserver, kube-controller-manager, the kubelet, SeaweedFS and the pod's process.
        assert {"etcd", "kube-apiserver", "weed"} <= names, names
        assert len(running) >= 6, running
        seaweedfs_ports = json.loads(ready.read_text())["seaweedfsPorts"]

        supervisor.send_signal(stop_signal)
        supervisor.wait(timeout=60)
        wait_for("every cluster process to end", lambda: not lifecycle.leftovers(directory), timeout=60)
        # SeaweedFS keeps its gRPC sockets in /tmp; even when its supervisor is killed, it removes them.
        left = [p for p in lifecycle.seaweedfs_socket_paths(seaweedfs_ports) if p.exists()]
        assert not left, left
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for pid in lifecycle.leftovers(directory):
            os.kill(pid, signal.SIGKILL)
