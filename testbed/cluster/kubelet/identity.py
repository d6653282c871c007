"""A pod's service-account identity: how pods reach the API server, and the pod-bound token they use.

The token comes from the TokenRequest API, bound to the pod, and is written as a kubeconfig
($KUBECONFIG, DIR/pods/<uid>/kube/config) and as the usual token / ca.crt / namespace files
($SHARDOPS_SA_DIR, DIR/pods/<uid>/serviceaccount/), refreshed at 80% of its lifetime, so RBAC
applies to pods exactly as in a real cluster. ClusterInfo and the kubeconfig document are pure;
PodCredentials does the API calls and files.

Test infrastructure can put the pods of one namespace behind another address of the API server: a
namespace annotated `e2e.shardops.dev/api-server: https://127.0.0.1:<port>` (the fault proxy of
testbed/faults/proxy.py) gets kubeconfigs naming that server, read when each pod starts; the CA stays
the cluster's, so whatever listens there must serve a certificate the cluster CA signed.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.cluster.kubelet.api import NotYet, call_json, describe_error
from testbed.cluster.kubelet.processes import write_private

log = logging.getLogger(__name__)

TOKEN_EXPIRATION_SECONDS = 3600
TOKEN_REFRESH_FRACTION = 0.8
# A namespace annotation: the API server address its pods' kubeconfigs name (module docstring).
API_SERVER_ANNOTATION = "e2e.shardops.dev/api-server"


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


def server_for(namespace: Mapping[str, Any], cluster: ClusterInfo) -> ClusterInfo:
    """`cluster`, with the server the namespace's API_SERVER_ANNOTATION names, if it names an
    https URL (anything else is ignored: the pods reach the API server directly)."""
    annotations = (namespace.get("metadata") or {}).get("annotations") or {}
    server = str(annotations.get(API_SERVER_ANNOTATION) or "")
    if not server.startswith("https://"):
        return cluster
    return dataclasses.replace(cluster, server=server)


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


class PodCredentials:
    """One pod's service-account token and the files that carry it, renewed before it expires."""

    def __init__(
        self,
        core: client.CoreV1Api,
        cluster: ClusterInfo,
        pod_dir: Path,
        namespace: str,
        pod_name: str,
        pod_uid: str,
        service_account: str,
        file_mode: int = 0o600,
    ) -> None:
        # 0o600 for process pods (they run as the kubelet's user); runc containers run as their
        # own user and read them as a kubelet's projected token, mode 0644.
        self.file_mode = file_mode
        self.core = core
        # The admin kubeconfig's server; `cluster` may name another one (API_SERVER_ANNOTATION).
        self.default_cluster = cluster
        self.cluster = cluster
        self.pod_dir = pod_dir
        self.namespace = namespace
        self.pod_name = pod_name
        self.pod_uid = pod_uid
        self.service_account = service_account
        self.refresh_at: float | None = None

    def mount(self, spec: Mapping[str, Any]) -> dict[str, str]:
        """Issue the token unless the pod opts out; the variables pointing its containers at it ({} if not).

        Raises NotYet while the service account does not exist.
        """
        automount = spec.get("automountServiceAccountToken")
        if automount is False:
            return {}
        try:
            account = call_json(
                self.core.read_namespaced_service_account, self.service_account, self.namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                # Retried: the serviceaccount controller may not have created it yet.
                raise NotYet("not found") from exc
            raise
        if automount is None and account.get("automountServiceAccountToken") is False:
            return {}
        namespace = call_json(self.core.read_namespace, self.namespace)
        self.cluster = server_for(namespace, self.default_cluster)
        if self.cluster.server != self.default_cluster.server:
            log.info(
                "pod %s/%s: API server %s (annotation %s of its namespace)",
                self.namespace,
                self.pod_name,
                self.cluster.server,
                API_SERVER_ANNOTATION,
            )
        self.issue()
        return {
            "KUBECONFIG": str(self.kube_dir / "config"),
            "SHARDOPS_SA_DIR": str(self.service_account_dir),
        }

    @property
    def service_account_dir(self) -> Path:
        return self.pod_dir / "serviceaccount"

    @property
    def kube_dir(self) -> Path:
        """Holds the kubeconfig alone: a directory, so a container can mount it and see refreshes."""
        return self.pod_dir / "kube"

    def issue(self) -> None:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=TOKEN_EXPIRATION_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=self.pod_name, uid=self.pod_uid
                ),
            )
        )
        answer = call_json(
            self.core.create_namespaced_service_account_token,
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
        info = self.cluster
        kubeconfig = service_account_kubeconfig(
            info, token, self.namespace, f"system:serviceaccount:{self.namespace}:{self.service_account}"
        )
        sa_dir = self.service_account_dir
        mode = self.file_mode
        write_private(sa_dir / "token", token, mode)
        write_private(sa_dir / "namespace", self.namespace, mode)
        if info.ca_pem:
            write_private(sa_dir / "ca.crt", info.ca_pem, mode)
        write_private(self.kube_dir / "config", yaml.safe_dump(kubeconfig, sort_keys=False), mode)
        self.refresh_at = time.monotonic() + max(lifetime, 60.0) * TOKEN_REFRESH_FRACTION

    def refresh_if_due(self) -> None:
        if self.refresh_at is None or time.monotonic() < self.refresh_at:
            return
        try:
            self.issue()
            log.info("pod %s/%s: service account token refreshed", self.namespace, self.pod_name)
        except Exception as exc:
            log.warning(
                "pod %s/%s: token refresh failed (%s); retrying",
                self.namespace,
                self.pod_name,
                describe_error(exc),
            )
            self.refresh_at = time.monotonic() + 30.0
