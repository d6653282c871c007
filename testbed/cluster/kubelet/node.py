"""The node: registration, its lease and heartbeats, taints, and the pod watch that binds pods,
hands the node's pods to pod workers (pod.py), removes finished pods, and stops everything on exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.cluster.kubelet.api import (
    API_TIMEOUT,
    MERGE_PATCH,
    STRATEGIC_MERGE,
    call_json,
    describe_error,
    is_transient,
    json_lines,
    micro_time,
    rfc3339,
)
from testbed.cluster.kubelet.host import node_labels, node_status
from testbed.cluster.kubelet.identity import cluster_info
from testbed.cluster.kubelet.pod import SHUTDOWN_GRACE_CAP_SECONDS, PodWorker
from testbed.cluster.kubelet.pod_status import TERMINAL_PHASES, backoff_seconds, is_deleting
from testbed.cluster.kubelet.processes import kill_recorded_processes
from testbed.cluster.kubelet.runc import RuncRuntime
from testbed.cluster.kubelet.scheduling import node_selector_matches, wants_binding
from testbed.cluster.kubelet.server import KubeletServer, LogSegment

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
HEARTBEAT_SECONDS = 10.0
# What a real kubelet uses: four missed renewals before the lease counts as expired.
LEASE_DURATION_SECONDS = 40
WATCH_TIMEOUT_SECONDS = 240
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


@dataclass(frozen=True)
class ServingConfig:
    """The kubelet API's TLS listener: loopback port, serving certificate, CA of accepted clients."""

    port: int
    cert: Path
    key: Path
    client_ca: Path


class Kubelet:
    def __init__(
        self,
        kubeconfig: Path,
        node_name: str,
        state_dir: Path,
        python: str,
        serving: ServingConfig | None = None,
        image_archives: Sequence[Path] = (),
        rootfs_cache: Path | None = None,
    ) -> None:
        self.node_name = node_name
        self.serving = serving
        self.server: KubeletServer | None = None
        self.state_dir = state_dir.resolve()
        self.runtime = RuncRuntime.detect(
            self.state_dir, list(image_archives), rootfs_cache or self.state_dir / "rootfs"
        )
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
        self.runtime.remove_leftovers()
        log.info(
            "images built locally: %s; runc: %s",
            ", ".join(str(a) for a in self.runtime.archives) or "none",
            self.runtime.unavailable() or self.runtime.runc,
        )
        if self.serving is not None:
            serving = self.serving
            self.server = KubeletServer(
                serving.port, serving.cert, serving.key, serving.client_ca, self.log_segment, self.stop
            )
            self.server.start()
        while not self.stop.is_set():
            try:
                self._register_node()
                break
            except Exception as exc:
                log.warning("node registration failed (%s); retrying", describe_error(exc))
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
        version = call_json(client.VersionApi(self.api).get_code)
        self.kubelet_version = str(version.get("gitVersion") or self.kubelet_version)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.labels},
            "spec": {},
            "status": self._node_status(),
        }
        try:
            node = call_json(self.core.create_node, body)
            log.info("registered node %s (kubelet %s)", self.node_name, self.kubelet_version)
        except ApiException as exc:
            if exc.status != 409:
                raise
            node = call_json(self.core.read_node, self.node_name)
            call_json(
                self.core.patch_node,
                self.node_name,
                {"metadata": {"labels": self.labels}},
                _content_type=STRATEGIC_MERGE,
            )
            log.info("node %s already registered; taking it over", self.node_name)
        self.node_uid = (node.get("metadata") or {}).get("uid")
        self._heartbeat()

    def _node_status(self) -> dict[str, Any]:
        port = self.server.port if self.server is not None else None
        return node_status(self.node_name, self.kubelet_version, self.ready_since, rfc3339(), port)

    def record_event(self, pod: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """A pod event from this kubelet (in the background; a lost note is only logged)."""
        meta = pod.get("metadata") or {}
        now = rfc3339()
        body = {
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

        def create() -> None:
            try:
                call_json(self.core.create_namespaced_event, meta.get("namespace"), body)
            except Exception as exc:
                log.warning("event %s for pod %s failed: %s", reason, meta.get("name"), describe_error(exc))

        self.aux.submit(create)

    def log_segment(self, namespace: str, pod: str, container: str, previous: bool) -> LogSegment | None:
        """What `kubectl logs` of a container of a pod on this node shows (the kubelet API's lookup)."""
        with self.lock:
            # Bounded by the pods on this node (110 at most).
            workers = [w for w in self.workers.values() if (w.namespace, w.name) == (namespace, pod)]
        for worker in workers:
            segment = worker.log_segment(container, previous)
            if segment is not None:
                return segment
        return None

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            try:
                self._heartbeat()
            except Exception as exc:
                log.warning("node heartbeat failed: %s", describe_error(exc))

    def _heartbeat(self) -> None:
        self._renew_lease()
        status = self._node_status()
        try:
            node = call_json(
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
                call_json(self.core.patch_node, self.node_name, patch, _content_type=MERGE_PATCH)
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
            call_json(
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
            call_json(self.coordination.create_namespaced_lease, LEASE_NAMESPACE, body)

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
                log.warning("pod watch failed: %s", describe_error(exc))
                self.stop.wait(1.0)
            except Exception as exc:
                log.warning("pod watch failed: %s", describe_error(exc))
                self.stop.wait(1.0)

    def _relist(self) -> str:
        pods: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            page = call_json(self.core.list_pod_for_all_namespaces, **kwargs)
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
            for event in json_lines(response):
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
                    call_json(self.core.create_namespaced_pod_binding, meta["name"], meta["namespace"], body)
                    log.info("bound pod %s/%s to %s", meta["namespace"], meta["name"], self.node_name)
                    return
                except Exception as exc:
                    if not is_transient(exc):
                        # 409: already bound (by us, earlier); 404: deleted. Nothing to do either way.
                        log.info("binding %s/%s: %s", meta["namespace"], meta["name"], describe_error(exc))
                        return
                    log.warning(
                        "binding %s/%s failed (%s); retrying",
                        meta["namespace"],
                        meta["name"],
                        describe_error(exc),
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
            call_json(
                self.core.patch_namespaced_pod_status,
                meta["name"],
                meta["namespace"],
                {"status": {"conditions": [condition]}},
                _content_type=STRATEGIC_MERGE,
            )
            log.info("pod %s/%s left unscheduled: %s", meta["namespace"], meta["name"], message)
        except Exception as exc:
            log.warning(
                "reporting %s/%s unschedulable failed: %s",
                meta["namespace"],
                meta["name"],
                describe_error(exc),
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
                call_json(self.core.delete_namespaced_pod, meta["name"], meta["namespace"], body=options)
                log.info("pod %s/%s removed", meta["namespace"], meta["name"])
                return
            except Exception as exc:
                if not is_transient(exc):
                    # 404: already gone; 409: the name now belongs to a new pod (uid precondition).
                    return
                log.warning(
                    "deleting pod %s/%s failed (%s)", meta["namespace"], meta["name"], describe_error(exc)
                )
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
        if self.server is not None:
            self.server.close()
        # Overlay roots of containers that were killed rather than reaped.
        self.runtime.remove_leftovers()
        log.info("stopped")
