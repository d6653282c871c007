"""Helpers for worker e2e tests: campaigns and shards made the way the operator makes them, worker
processes with the worker service account's identity, and recorders of what happened.

The operator is not needed: `materialize` creates each Shard (name `<campaign>-<index:05d>`, labels,
spec with the idempotency key, owned by the Campaign) and moves it to Pending through
`apply_transition(Action.MATERIALIZE)`, exactly as the operator's dispatch does.

Workers run with the chart's worker RBAC (templates/rbac-worker.yaml rendered by `helm template`),
so a permission the runtime needs but the chart does not grant fails these tests.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_KIND, CAMPAIGN_LABEL
from shardops.api.shard import Shard
from shardops.api.store import ResultStoreStatus
from shardops.k8s import campaigns
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, LEASES, SHARDS, Kube, NotFound
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.idempotency import idempotency_key
from shardops.logic.transitions import Action
from shardops.scheduler import builders
from shardops.store import ResultStore
from shardops.store.configmap import (
    ATTEMPT_PREFIX,
    ITEMS_PREFIX,
    OWNER_ANNOTATION,
    RESULT_PREFIX,
    ConfigMapStore,
    items_name,
)
from shardops.store.records import StoredResult
from shardops.store.s3 import S3Store
from testbed.cluster.kubelet.identity import cluster_info, service_account_kubeconfig
from testbed.harness import REPO_ROOT, Cluster, wait_for

WORKER_SA = "shardops-worker"
AGENT = "shardops-example-agent"
OPERATOR_STANDIN = Actor("shardops.dev/operator", "e2e-workerkit")
VENV_BIN = Path(sys.executable).parent


def admin_kube(cluster: Cluster) -> Kube:
    return Kube.from_environment("e2e-workerkit", kubeconfig=str(cluster.kubeconfig))


# --- RBAC: the chart's worker role ---------------------------------------------------------------


def _chart_worker_rbac(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [
            str(cluster.bin_dir / "helm"),
            "template",
            "e2e",
            str(REPO_ROOT / "charts" / "shardops"),
            "--namespace",
            namespace,
            # One namespace per test, the release's too: a sandbox, as the chart kit's (docs/security.md).
            "--set",
            f"watch.namespaces={{{namespace}}}",
            "--set",
            "workers.allowReleaseNamespace=true",
            "--show-only",
            "templates/rbac-worker.yaml",
            "--show-only",
            "templates/serviceaccounts.yaml",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if rendered.returncode != 0:
        raise AssertionError(f"helm template of the worker RBAC failed:\n{rendered.stderr}")
    wanted = []
    for doc in yaml.safe_load_all(rendered.stdout):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "ServiceAccount" and name != WORKER_SA:
            continue
        if kind == "ServiceAccount":
            # The chart leaves token mounting to the worker pod spec; the Jobs here set it there.
            doc.pop("automountServiceAccountToken", None)
        wanted.append(doc)
    kinds = sorted(d["kind"] for d in wanted)
    assert kinds == ["ClusterRole", "RoleBinding", "ServiceAccount"], kinds
    return wanted


@dataclass
class WorkerIdentity:
    """The worker service account of one namespace and a kubeconfig carrying its token."""

    namespace: str
    kubeconfig: Path
    cluster_role: str


def worker_identity(cluster: Cluster, namespace: str, directory: Path) -> WorkerIdentity:
    docs = _chart_worker_rbac(cluster, namespace)
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    core = client.CoreV1Api(cluster.api)
    answer = core.create_namespaced_service_account_token(
        WORKER_SA,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    info = cluster_info(admin, cluster.kubeconfig.parent)
    user = f"system:serviceaccount:{namespace}:{WORKER_SA}"
    path = directory / f"worker-{namespace}.kubeconfig"
    path.write_text(yaml.safe_dump(service_account_kubeconfig(info, answer.status.token, namespace, user)))
    role = next(d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole")
    return WorkerIdentity(namespace, path, role)


def drop_cluster_role(cluster: Cluster, identity: WorkerIdentity) -> None:
    cluster.kubectl("delete", "clusterrole", identity.cluster_role, "--ignore-not-found", check=False)


# --- campaigns and shards, as the operator makes them --------------------------------------------


def campaign_body(
    name: str,
    items: Sequence[Mapping[str, Any]],
    *,
    shard_size: int = 1,
    command: Sequence[str] = (AGENT,),
    env: Mapping[str, str] | None = None,
    lease_seconds: int = 10,
    heartbeat_seconds: int = 2,
    max_concurrency: int = 10,
    idle_seconds: int = 5,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": CAMPAIGN_KIND,
        "metadata": {"name": name},
        "spec": {
            "items": [dict(item) for item in items],
            "shardSize": shard_size,
            "leaseSeconds": lease_seconds,
            "heartbeatSeconds": heartbeat_seconds,
            "maxConcurrency": max_concurrency,
            "idleSeconds": idle_seconds,
            "worker": {
                "image": "shardops:dev",
                "command": list(command),
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
            },
            **spec,
        },
    }


def shard_key(body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> str:
    """The idempotency key the operator gives a shard holding `items` of this Campaign body."""
    campaign = Campaign.parse(body)
    return idempotency_key(campaign.name, list(items), campaign.spec.worker.identity())


def materialize(kube: Kube, namespace: str, body: Mapping[str, Any], threads: int = 4) -> list[Shard]:
    """Create the Campaign and all its shards in Pending, with the operator's own shard builder."""
    campaign = Campaign.parse(kube.create(CAMPAIGNS, namespace, dict(body)))
    items = campaign.spec.items or []

    def make(index: int) -> Shard:
        created = kube.create(SHARDS, namespace, builders.shard_body(campaign, index, items))
        shard = Shard.parse(created)
        return apply_transition(
            kube,
            shard,
            TransitionRequest(Action.MATERIALIZE, "materialized by the e2e workerkit (operator stand-in)"),
            OPERATOR_STANDIN,
            dt.datetime.now(dt.UTC),
        )

    count = campaign.spec.expected_shards(len(items))
    with ThreadPoolExecutor(threads) as pool:
        shards = list(pool.map(make, range(count)))
    # As the operator records it: workers list only unfinished shards and read this for the rest.
    campaigns.patch_status(kube, namespace, campaign.name, {"cutShards": count}, None)
    return shards


# --- the result store a test's campaigns use ---------------------------------------------------------

STORES = ("configmap", "s3")


@dataclass(frozen=True)
class StoreUnderTest:
    """The result store of a test's campaigns, as the operator would record it in
    status.resultStore: the ConfigMap store, or the S3 server under a prefix of the test's own (the
    workers get its credentials from their environment: the client's default chain)."""

    kind: str
    namespace: str
    object_store: Any = None  # testbed.cluster.lifecycle.ObjectStore for "s3"
    prefix: str = ""
    # The keys the namespace's workers get (testbed.tenants.provision_namespace: only the namespace's
    # area); the installation's (`object_store`) stay with the test's own reads.
    namespace_store: Any = None

    @property
    def location(self) -> ResultStoreStatus:
        if self.kind == "configmap":
            return ResultStoreStatus(type=StoreType.CONFIG_MAP)
        store = self.object_store
        return ResultStoreStatus(
            type=StoreType.S3,
            endpoint=store.endpoint,
            region=store.region,
            bucket=store.bucket,
            prefix=self.prefix,
        )

    def worker_env(self) -> dict[str, str]:
        if self.kind == "configmap":
            return {}
        keys = self.namespace_store or self.object_store
        return {"AWS_ACCESS_KEY_ID": keys.access_key_id, "AWS_SECRET_ACCESS_KEY": keys.secret_access_key}

    def attach(self, kube: Kube, campaign: str) -> None:
        """Record the store in the campaign's status, as the operator does before its first shard."""
        campaigns.patch_status(kube, self.namespace, campaign, {"resultStore": self.location.to_dict()}, None)

    def reader(self, kube: Kube) -> ResultStore:
        if self.kind == "configmap":
            return ConfigMapStore(kube, self.namespace)
        return S3Store(self.location, self.namespace, client=self.object_store.client())

    def committed(self, kube: Kube, key: str) -> StoredResult | None:
        """The key's result (verified), as a re-applied campaign would find it."""
        return self.reader(kube).read_result(key)

    def committed_count(self, kube: Kube) -> int:
        """How many keys have a committed result in the test's namespace."""
        if self.kind == "configmap":
            return len(result_configmaps(kube, self.namespace))
        store = self.reader(kube)
        assert isinstance(store, S3Store)
        return len(list(store.names(store.pointers_prefix())))

    @staticmethod
    def owner(stored: StoredResult) -> str | None:
        return stored.annotations.get(OWNER_ANNOTATION) or stored.annotations.get("owner")


def shards_of(kube: Kube, namespace: str, campaign: str) -> list[Shard]:
    found = kube.list(SHARDS, namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}")
    return sorted((Shard.parse(s) for s in found), key=lambda s: s.spec.index)


def get_shard(kube: Kube, namespace: str, name: str) -> Shard:
    return Shard.parse(kube.get(SHARDS, namespace, name))


def delete_campaign(kube: Kube, namespace: str, campaign: str, timeout: float = 60) -> None:
    """Delete the Campaign and wait for the garbage collector to remove its shards. Their Leases may
    outlive them a moment: a claimer of a re-applied campaign's Shard takes over a Lease held for an
    earlier Shard of the name (k8s.leases.owned_by_an_earlier)."""
    kube.delete(CAMPAIGNS, namespace, campaign)
    wait_for(
        f"shards of {campaign} to be garbage-collected",
        lambda: not shards_of(kube, namespace, campaign),
        timeout=timeout,
    )


def result_configmaps(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The keys' committed results (pointers to attempt ConfigMaps): one per key with a result."""
    return [c for c in kube.list(CONFIGMAPS, namespace) if c["metadata"]["name"].startswith(RESULT_PREFIX)]


def attempt_configmaps(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The results claims stored, one per claim that got that far; a Done shard's ref names one."""
    return [c for c in kube.list(CONFIGMAPS, namespace) if c["metadata"]["name"].startswith(ATTEMPT_PREFIX)]


def items_configmaps(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return [c for c in kube.list(CONFIGMAPS, namespace) if c["metadata"]["name"].startswith(ITEMS_PREFIX)]


def stored_result(kube: Kube, namespace: str, key: str) -> StoredResult | None:
    """The key's committed result in the ConfigMap store, verified."""
    return ConfigMapStore(kube, namespace).read_result(key)


def stored_items(kube: Kube, namespace: str, key: str) -> dict[str, str]:
    with contextlib.suppress(NotFound):
        return dict(kube.get(CONFIGMAPS, namespace, items_name(key)).get("data") or {})
    return {}


def lease(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    with contextlib.suppress(NotFound):
        return kube.get(LEASES, namespace, name)
    return None


# --- worker processes ----------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    """`shardops worker` as a local process with the worker service account's kubeconfig."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_entries(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(line)
                if isinstance(value, dict):
                    entries.append(value)
        return entries

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.log_entries() if e.get("event") == kind]

    @property
    def holder(self) -> str | None:
        started = self.events("started")
        return str(started[0]["holder"]) if started else None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self) -> None:
        """Teardown: a graceful stop, then SIGKILL if it does not exit in time."""
        if self.popen.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=10)


# --- the worker's /metrics ------------------------------------------------------------------------


# A worker started with these serves /metrics on a free loopback port (logged as metrics-serving)
# and, when its loop ends, waits up to `linger` seconds for one scrape of its final figures.
def metrics_env(linger: float = 120) -> dict[str, str]:
    return {
        "SHARDOPS_METRICS_PORT": "0",
        "SHARDOPS_METRICS_HOST": "127.0.0.1",
        "SHARDOPS_METRICS_LINGER_SECONDS": f"{linger:g}",
    }


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_port(worker: WorkerProcess) -> int:
    serving = poll(f"{worker.name} to serve /metrics", lambda: worker.events("metrics-serving"), 30)
    return int(serving[0]["port"])


def scrape(worker: WorkerProcess) -> Samples:
    """One scrape of the worker's /metrics over HTTP, as Prometheus makes it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port(worker)}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The value of one series (0 when absent), matched on the labels given (campaign among them)."""
    wanted = set(labels.items())
    found = [value for (n, have), value in samples.items() if n == name and wanted <= have]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return found[0] if found else 0.0


@dataclass
class WorkerPool:
    cluster: Cluster
    identity: WorkerIdentity
    directory: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    def start(self, campaign: str, name: str, **env: str) -> WorkerProcess:
        environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
        environment.update(
            {
                "KUBECONFIG": str(self.identity.kubeconfig),
                "SHARDOPS_NAMESPACE": self.identity.namespace,
                "POD_NAME": name,
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "SHARDOPS_WORK_DIR": str(self.directory),
                **env,
            }
        )
        log_path = self.directory / f"{name}.log"
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                [str(VENV_BIN / "shardops"), "worker", "--campaign", campaign],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(name, popen, log_path)
        self.workers.append(worker)
        wait_for(f"worker {name} to start", lambda: worker.holder or worker.popen.poll() is not None, 30)
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


@contextlib.contextmanager
def worker_pool(cluster: Cluster, namespace: str, directory: Path) -> Iterator[WorkerPool]:
    identity = worker_identity(cluster, namespace, directory)
    pool = WorkerPool(cluster, identity, directory)
    try:
        yield pool
    finally:
        pool.stop_all()
        drop_cluster_role(cluster, identity)


def wait_exit(workers: Sequence[WorkerProcess], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for worker in workers:
        codes.append(worker.wait(max(deadline - time.monotonic(), 0.1)))
    return codes


# --- what happened: the agent's ledger and watches on the API server ------------------------------


def ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class WatchEvent:
    type: str
    name: str
    resource_version: int
    obj: dict[str, Any]
    seen_at: float


class Recorder:
    """Every change of Leases or Shards in a namespace, in the API server's order, from a watch.

    Started before the objects exist, it sees each object's whole history: the evidence for
    "at most one holder at any instant" is the recorded sequence, not a sample of it.
    """

    def __init__(self, api: client.ApiClient, path: str) -> None:
        self.api = api
        self.path = path
        self.events: list[WatchEvent] = []
        self._stop = threading.Event()
        self._response: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Recorder:
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError(f"watch on {self.path} did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._response.response.shutdown()
        self._thread.join(timeout=15)

    def _request(self, query: list[tuple[str, str]]) -> Any:
        _, url, headers, _, _ = self.api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        return self.api.call_api("GET", url, header_params=headers, _request_timeout=(10, 60))

    def _run(self) -> None:
        try:
            listed = json.loads(self._request([]).read())
            version = listed["metadata"]["resourceVersion"]
            self._ready.set()
            while not self._stop.is_set():
                self._response = self._request(
                    [("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "30")]
                )
                buffer = b""
                for chunk in self._response.response.stream(4096, decode_content=True):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            version = self._record(json.loads(line)) or version
        except Exception as error:  # pragma: no cover - surfaced by check()
            if not self._stop.is_set():
                self.error = error
            self._ready.set()

    def _record(self, event: dict[str, Any]) -> str | None:
        obj = event.get("object") or {}
        metadata = obj.get("metadata") or {}
        if event.get("type") == "ERROR":
            raise RuntimeError(f"watch error: {obj}")
        if event.get("type") == "BOOKMARK":
            return str(metadata.get("resourceVersion"))
        self.events.append(
            WatchEvent(
                str(event.get("type")),
                str(metadata.get("name")),
                int(metadata.get("resourceVersion") or 0),
                obj,
                time.time(),
            )
        )
        return str(metadata.get("resourceVersion"))

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"recorder on {self.path} failed: {self.error!r}")

    def by_name(self) -> dict[str, list[WatchEvent]]:
        grouped: dict[str, list[WatchEvent]] = {}
        for event in self.events:
            grouped.setdefault(event.name, []).append(event)
        for events in grouped.values():
            events.sort(key=lambda e: e.resource_version)
        return grouped


@contextlib.contextmanager
def recording(cluster: Cluster, path: str) -> Iterator[Recorder]:
    recorder = Recorder(cluster.api, path).start()
    try:
        yield recorder
    finally:
        recorder.stop()


def audit_entries(cluster: Cluster, namespace: str, since: float = 0.0) -> list[dict[str, Any]]:
    """Audit log entries (writes to leases, shards, configmaps, events...) in `namespace`."""
    path = cluster.audit_log
    if path is None or not path.exists():
        return []
    found = []
    with path.open(errors="replace") as handle:
        for line in handle:
            if f'"namespace":"{namespace}"' not in line:
                continue
            entry = json.loads(line)
            if (entry.get("objectRef") or {}).get("namespace") == namespace:
                found.append(entry)
    return found


def holder_of(lease_obj: Mapping[str, Any]) -> str | None:
    return ((lease_obj.get("spec") or {}).get("holderIdentity")) or None


def phase_of(shard_obj: Mapping[str, Any]) -> str | None:
    return (shard_obj.get("status") or {}).get("phase")


def poll(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    return wait_for(what, probe, timeout=timeout, interval=0.1)
