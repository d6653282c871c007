"""The e2e harness: what tests and their helper modules use of the cluster under test.

`e2e/conftest.py` builds the fixtures from this; the kits (testbed/kits/) import from here, never
from conftest.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from shardops.api.crdgen import generate_crds
from testbed.cluster import lifecycle
from testbed.cluster.kubelet.processes import pod_log_path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cluster:
    """What a test may use of the cluster under test."""

    kubeconfig: Path
    bin_dir: Path
    api: client.ApiClient
    local: lifecycle.LocalCluster | None
    # The S3 store tests may use: the local SeaweedFS, or the one SHARDOPS_S3_* names for an
    # external cluster (None when they name none).
    object_store: lifecycle.ObjectStore | None = None

    @property
    def audit_log(self) -> Path | None:
        return self.local.audit_log if self.local else None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        if self.local:
            env[lifecycle.MARKER_ENV] = str(self.local.directory)
        return env

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=stdin,
            check=False,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def etcd_bytes(self) -> int | None:
        """etcd's database size as the API server reports it (apiserver_storage_size_bytes)."""
        result = self.kubectl("get", "--raw", "/metrics", check=False)
        if result.returncode != 0:
            return None
        sizes = [
            float(line.rsplit(" ", 1)[1])
            for line in result.stdout.splitlines()
            if line.startswith("apiserver_storage_size_bytes")
        ]
        return int(sum(sizes)) if sizes else None

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        assert self.local, "pod logs from files need the local process-kubelet"
        path = pod_log_path(self.local.kubelet_state, namespace, pod, container)
        return path.read_text(errors="replace") if path.exists() else ""


def external_kubeconfig() -> Path | None:
    """The cluster KUBECONFIG names, unless SHARDOPS_E2E_LOCAL asks for the local control plane."""
    if os.environ.get("SHARDOPS_E2E_LOCAL") or not os.environ.get("KUBECONFIG"):
        return None
    return Path(os.environ["KUBECONFIG"])


def install_crds(cluster: Cluster) -> None:
    """The generated CRDs of crds/, applied and Established."""
    cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
    for crd in generate_crds():
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
        )


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def create_namespace(cluster: Cluster, prefix: str = "e2e", name: str | None = None) -> str:
    """A new namespace `<prefix>-<random>` (or exactly `name`), returned once its default
    ServiceAccount exists (pods and tokens need it). Deleting it is the caller's."""
    name = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        f"default service account in {name}",
        lambda: core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
    )
    return name


def objects_in(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
