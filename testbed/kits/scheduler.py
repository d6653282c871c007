"""Shared machinery of the operator e2e tests (no tests here).

The operator runs as it would in a cluster: a Deployment of `shardops operator` under the
ServiceAccounts and RBAC of the Helm chart (rendered by testbed/kits/chart.py), watching the test's
namespace; its worker Jobs run `shardops worker` under the worker ServiceAccount, with the example
agent as the user's command.
The process-kubelet runs both as local processes, which is what lets a test SIGKILL one.

What the tests assert on is recorded, not sampled: a watch records every version of every Shard
(and Job, and the Campaign) from the moment the recorder starts, and the shards' own
status.history is the durable record of each transition.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, watch

from shardops.api.common import JSON
from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_KIND
from shardops.api.store import DEFAULT_STORE_SECRET
from shardops.k8s import events
from shardops.k8s.api import CAMPAIGNS, EVENTS, LEASES, SHARDS, Kube, NotFound
from shardops.logic.idempotency import key_label
from shardops.logic.timefmt import parse_rfc3339 as parse_time
from shardops.store.configmap import ITEMS_PREFIX, RESULT_PREFIX, ConfigMapStore, attempts_prefix
from shardops.store.records import StoredResult
from testbed import tenants
from testbed.cluster import lifecycle
from testbed.cluster.lifecycle import WRITE_VERBS, free_port
from testbed.harness import Cluster, wait_for
from testbed.kits import chart as chartkit

GROUP, VERSION = API_GROUP_VERSION.split("/")
OPERATOR_NAME = "shardops-operator"
LEADER_LEASE = "shardops-operator"
TERMINAL = {"Done", "Failed", "Blocked"}
# Short, so tests spend their time on behaviour rather than on waiting; still in line with the CRD
# rule heartbeat < lease/2.
LEASE_SECONDS = 10
HEARTBEAT_SECONDS = 2
# A worker reads the campaign (spent, limit, breakers, suspend), then claims: a claim may act on a
# status this old. Claims inside the grace after a gate was published are printed, not held against it.
STALE_READ_GRACE = dt.timedelta(seconds=2)
# How long "nothing starts" is watched for: three operator ticks and several worker polls.
HOLD_WINDOW = 6.0


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def kube_for(cluster: Cluster) -> Kube:
    return Kube.from_environment("e2e-operator-tests", kubeconfig=str(cluster.kubeconfig))


# --- installing the operator ---------------------------------------------------------------------


def operator_deployment(namespace: str, replicas: int, env: Mapping[str, str]) -> JSON:
    labels = {"app": OPERATOR_NAME}
    variables: list[JSON] = [
        {"name": "SHARDOPS_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "SHARDOPS_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {
            "name": "SHARDOPS_LEADER_ELECTION_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "SHARDOPS_NAMESPACES", "value": namespace},
        *({"name": k, "value": v} for k, v in env.items()),
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_NAME, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": OPERATOR_NAME,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": "operator",
                            "image": "shardops:e2e",
                            "command": ["shardops", "operator"],
                            "env": variables,
                        }
                    ],
                },
            },
        },
    }


@dataclass
class Operator:
    cluster: Cluster
    namespace: str
    metrics_port: int | None
    core: client.CoreV1Api = field(init=False)
    kube: Kube = field(init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.cluster.api)
        self.kube = kube_for(self.cluster)

    def pods(self) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={OPERATOR_NAME}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def running_pids(self) -> dict[str, int]:
        """Pod name -> pid of the running operator process (the process-kubelet's containerID)."""
        found: dict[str, int] = {}
        for pod in self.pods():
            for status in pod.status.container_statuses or []:
                if status.state and status.state.running and status.container_id:
                    found[pod.metadata.name] = int(status.container_id.removeprefix("process://"))
        return found

    def restarts(self) -> int:
        return sum(s.restart_count for p in self.pods() for s in (p.status.container_statuses or []))

    def lease(self) -> JSON | None:
        try:
            return self.kube.get(LEASES, self.namespace, LEADER_LEASE)
        except NotFound:
            return None

    def leader(self) -> str | None:
        lease = self.lease()
        return ((lease or {}).get("spec") or {}).get("holderIdentity") or None

    def log(self, pod: str) -> str:
        return self.cluster.pod_log(self.namespace, pod, "operator")

    def http(self, path: str) -> tuple[int, str]:
        assert self.metrics_port, "this operator was started without a fixed metrics port"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()


def kill_group(pid: int) -> None:
    """SIGKILL a container's process group, as when a node or the OOM killer takes it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop_group(pid: int) -> None:
    """SIGSTOP a container's process group: a hung or cut-off node. The process neither runs nor
    exits, so its container is not restarted (the process-kubelet has no liveness probes)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)


def continue_group(pid: int) -> None:
    """SIGCONT a process group `stop_group` froze: the node is back."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGCONT)


@contextlib.contextmanager
def operator_running(
    cluster: Cluster,
    namespace: str,
    *,
    replicas: int = 1,
    lease_seconds: int = 10,
    env: Mapping[str, str] | None = None,
) -> Iterator[Operator]:
    """The chart's RBAC and an operator Deployment in `namespace`, leading before this yields."""
    port = free_port() if replicas == 1 else None
    settings = {
        "SHARDOPS_TICK_SECONDS": "2",
        "SHARDOPS_METRICS_PORT": str(port or 0),
        "SHARDOPS_LEADER_ELECTION_LEASE_SECONDS": str(lease_seconds),
        "SHARDOPS_LEADER_ELECTION_RENEW_SECONDS": str(max(1, lease_seconds // 4)),
        "SHARDOPS_LEADER_ELECTION_RETRY_SECONDS": "1",
        # The operator and its Campaigns share the test's namespace (chartkit.render_rbac allows it).
        "SHARDOPS_ALLOW_CAMPAIGNS_IN_OPERATOR_NAMESPACE": "true",
        **(env or {}),
    }
    objects = [*chartkit.render_rbac(namespace), operator_deployment(namespace, replicas, settings)]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    operator = Operator(cluster, namespace, port)
    try:
        wait_for("an operator replica to lead", operator.leader, timeout=90)
        yield operator
    finally:
        for pod in operator.pods():
            log = operator.log(pod.metadata.name)
            errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
            if errors:
                print(f"\n--- operator {pod.metadata.name}: {len(errors)} error line(s), last ones:")
                print("\n".join(errors[-10:]))
        chartkit.delete_cluster_scoped(cluster, objects)


STORE_SECRET = DEFAULT_STORE_SECRET


def s3_store_env(
    cluster: Cluster, namespace: str, store: lifecycle.ObjectStore, prefix: str
) -> dict[str, str]:
    """An installation whose default result store is S3 (as the chart's resultStore values render
    it): the namespace's store Secret with keys that reach only its area (provision_namespace, as an
    admin adds a namespace), and the operator settings, with the installation's keys for the operator
    alone. An external cluster's store cannot be given scoped identities here: its namespace Secret
    then holds the keys SHARDOPS_S3_* named."""
    if cluster.local is not None:
        tenants.provision_namespace(
            cluster.api, namespace, directory=cluster.local.directory, store=store, prefix=prefix
        )
    else:
        tenants.put_store_secret(cluster.api, namespace, STORE_SECRET, store)
    return {
        "SHARDOPS_RESULT_STORE": "S3",
        "SHARDOPS_S3_ENDPOINT": store.endpoint,
        "SHARDOPS_S3_REGION": store.region,
        "SHARDOPS_S3_BUCKET": store.bucket,
        "SHARDOPS_S3_PREFIX": prefix,
        "SHARDOPS_STORE_SECRET": STORE_SECRET,
        "AWS_ACCESS_KEY_ID": store.access_key_id,
        "AWS_SECRET_ACCESS_KEY": store.secret_access_key,
    }


def campaign_shards(kube: Kube, namespace: str, name: str, store: lifecycle.ObjectStore | None) -> list[JSON]:
    """Every shard of the campaign as a Shard body: the live ones as listed, and those folded into
    the ledger (their Shard objects deleted) rebuilt from their ledger records, with their history."""
    from shardops.api.campaign import Campaign
    from shardops.state import ledger
    from shardops.store.s3 import S3Store

    live = kube.list(SHARDS, namespace, label_selector=f"shardops.dev/campaign={name}")
    campaign = Campaign.parse(kube.get(CAMPAIGNS, namespace, name))
    status = campaign.current_status
    if not status.folded.total or store is None or status.result_store is None:
        return live
    s3 = S3Store(status.result_store, namespace, client=store.client())
    records = ledger.first_records(s3.read_ledger(name, campaign.metadata.uid or ""), status.folded)
    assert len(records) == status.folded.total, "every folded shard (every phase) is in the ledger"
    folded_names = {r["shard"] for r in records.values()}
    rebuilt = [ledger.shard_body(r, namespace, name) for r in records.values()]
    return [*(s for s in live if s["metadata"]["name"] not in folded_names), *rebuilt]


# --- campaigns --------------------------------------------------------------------------------------


def agent_env(**variables: object) -> list[JSON]:
    """Worker env: the example agent's knobs (SHARDOPS_AGENT_*) and the worker's (SHARDOPS_*)."""
    base: dict[str, object] = {"SHARDOPS_POLL_SECONDS": "0.5"}
    base.update(variables)
    return [{"name": name, "value": str(value)} for name, value in base.items()]


def campaign_body(name: str, items: Sequence[JSON], **spec: Any) -> JSON:
    worker_env = spec.pop("worker_env", {})
    body_spec: JSON = {
        "items": list(items),
        "leaseSeconds": LEASE_SECONDS,
        "heartbeatSeconds": HEARTBEAT_SECONDS,
        "idleSeconds": 4,
        "worker": {
            "image": "shardops:e2e",
            "command": ["shardops-example-agent"],
            "env": agent_env(**worker_env),
        },
    }
    body_spec.update(spec)
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": body_spec,
    }


def create_campaign(kube: Kube, namespace: str, body: JSON) -> JSON:
    return kube.create(CAMPAIGNS, namespace, body)


def get_campaign(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(CAMPAIGNS, namespace, name)


def patch_spec(kube: Kube, namespace: str, name: str, spec: JSON) -> JSON:
    return kube.patch(CAMPAIGNS, namespace, name, {"spec": spec})


def shards_of(kube: Kube, namespace: str) -> list[JSON]:
    return kube.list(SHARDS, namespace)


def phase_of(obj: JSON) -> str:
    return str((obj.get("status") or {}).get("phase") or "Queued")


def shard_phase(kube: Kube, namespace: str, name: str) -> str | None:
    """The shard's phase, or None while it does not exist yet (a probe for `wait_for`)."""
    try:
        return phase_of(kube.get(SHARDS, namespace, name))
    except NotFound:
        return None


def campaign_phase(kube: Kube, namespace: str, name: str) -> str | None:
    return (get_campaign(kube, namespace, name).get("status") or {}).get("phase")


def condition(obj: JSON, type_: str) -> JSON | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def wait_phase(kube: Kube, namespace: str, name: str, phases: set[str], timeout: float = 180) -> JSON:
    def reached() -> JSON | None:
        body = get_campaign(kube, namespace, name)
        return body if (body.get("status") or {}).get("phase") in phases else None

    result: JSON = wait_for(f"campaign {name} to reach {sorted(phases)}", reached, timeout=timeout)
    return result


# --- recording ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One watch event, with the local time it arrived (monotonic `at`, and wall clock `wall`)."""

    at: float
    type: str
    obj: JSON
    wall: dt.datetime = field(default_factory=now)

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


class Recorder:
    """Every version of every object of one resource in a namespace, in the API server's order.

    A list first (its resourceVersion is the starting point), then a watch that resumes from the
    last version seen whenever the server ends it. Nothing between two versions can be missed.
    """

    def __init__(self, cluster: Cluster, namespace: str, kind: str) -> None:
        self.namespace = namespace
        self.kind = kind
        self.events: list[Seen] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._lister = self._lister_for(cluster, kind)
        self._thread = threading.Thread(target=self._run, name=f"recorder-{kind}", daemon=True)
        self._ready = threading.Event()

    def _lister_for(self, cluster: Cluster, kind: str) -> Callable[..., Any]:
        if kind in ("shards", "campaigns"):
            api = client.CustomObjectsApi(cluster.api)

            def custom(**kwargs: Any) -> Any:
                return api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, kind, **kwargs)

            return custom
        if kind == "workloads":
            # Kueue's Workloads of every namespace ("" as the namespace): one stream, so the
            # admissions of several namespaces' Jobs are seen in the API server's one order.
            api = client.CustomObjectsApi(cluster.api)

            def workloads(**kwargs: Any) -> Any:
                return api.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "workloads", **kwargs)

            return workloads
        if kind == "jobs":
            batch = client.BatchV1Api(cluster.api)

            def jobs(**kwargs: Any) -> Any:
                return batch.list_namespaced_job(self.namespace, **kwargs)

            return jobs
        raise ValueError(kind)

    def _as_json(self, obj: Any) -> JSON:
        if isinstance(obj, dict):
            return obj
        return dict(client.ApiClient().sanitize_for_serialization(obj))

    def start(self) -> Recorder:
        self._thread.start()
        assert self._ready.wait(30), f"the {self.kind} recorder did not start"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        try:
            listed = self._as_json(self._lister())
            version = str(listed["metadata"]["resourceVersion"])
            stamp = time.monotonic()
            for item in listed.get("items") or []:
                self.events.append(Seen(stamp, "LISTED", self._as_json(item)))
            self._ready.set()
            while not self._stop.is_set():
                stream = watch.Watch()
                for event in stream.stream(self._lister, resource_version=version, timeout_seconds=5):
                    obj = self._as_json(event["object"])
                    version = str(obj["metadata"]["resourceVersion"])
                    if event["type"] != "BOOKMARK":
                        self.events.append(Seen(time.monotonic(), str(event["type"]), obj))
                    if self._stop.is_set():
                        stream.stop()
                        break
        except BaseException as error:  # surfaced by the test through `check`
            self.failure = error
            self._ready.set()

    def check(self) -> None:
        assert self.failure is None, f"the {self.kind} recorder failed: {self.failure!r}"

    def states(self) -> Iterator[tuple[Seen, dict[str, JSON]]]:
        """After each event: every live object by name."""
        current: dict[str, JSON] = {}
        for seen in list(self.events):
            if seen.type == "DELETED":
                current.pop(seen.name, None)
            else:
                current[seen.name] = seen.obj
            yield seen, current


@contextlib.contextmanager
def recording(cluster: Cluster, namespace: str, *kinds: str) -> Iterator[dict[str, Recorder]]:
    recorders = {kind: Recorder(cluster, namespace, kind).start() for kind in kinds}
    try:
        yield recorders
    finally:
        for recorder in recorders.values():
            recorder.stop()


def phase_counts(objects: Mapping[str, JSON], campaign: str | None = None) -> Counter[str]:
    return Counter(
        phase_of(o) for o in objects.values() if campaign is None or o["spec"].get("campaign") == campaign
    )


# --- shard history ---------------------------------------------------------------------------------------


def history(shard: JSON) -> list[JSON]:
    return list((shard.get("status") or {}).get("history") or [])


def running_intervals(shards: Sequence[JSON]) -> list[tuple[dt.datetime, dt.datetime, str]]:
    """[claim, end) of every attempt, from each shard's own history: a Claimed entry up to the next
    entry (whatever ended the attempt), or up to now if the shard is still running."""
    intervals = []
    for shard in shards:
        entries = history(shard)
        for index, entry in enumerate(entries):
            if entry["reason"] != "Claimed":
                continue
            end = parse_time(entries[index + 1]["at"]) if index + 1 < len(entries) else now()
            intervals.append((parse_time(entry["at"]), end, str(shard["metadata"]["name"])))
    return intervals


def max_overlap(intervals: Sequence[tuple[dt.datetime, dt.datetime, str]]) -> int:
    """Most intervals open at one instant. An end and a start at the same instant do not overlap."""
    points = sorted([(start, 1) for start, _, _ in intervals] + [(end, -1) for _, end, _ in intervals])
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def reasons(shard: JSON) -> list[str]:
    return [entry["reason"] for entry in history(shard)]


# --- events ---------------------------------------------------------------------------------------------


def campaign_events(kube: Kube, namespace: str, campaign: str, reason: str) -> list[JSON]:
    """The Events with `reason` regarding the Campaign `campaign`. For what happens to its shards
    there is one, whose series counts the shards or attempts (`k8s.events.EventSeries`)."""
    return [
        e
        for e in kube.list(EVENTS, namespace)
        if e.get("reason") == reason
        and (e.get("regarding") or {}).get("kind") == CAMPAIGN_KIND
        and (e.get("regarding") or {}).get("name") == campaign
    ]


def wait_campaign_events(
    kube: Kube, namespace: str, campaign: str, reason: str, count: int, timeout: float = 30
) -> list[JSON]:
    """`campaign_events` once one of them counts at least `count` occurrences. The operator raises
    a series after the status write of the pass that folded the shards' history entries, so the
    Event may trail the shard or campaign status a test waited for."""

    def counted() -> list[JSON] | None:
        found = campaign_events(kube, namespace, campaign, reason)
        return found if any(events.occurrences(e) >= count for e in found) else None

    result: list[JSON] = wait_for(
        f"campaign {campaign}'s {reason} Event to count {count}", counted, timeout=timeout
    )
    return result


# --- audit log ------------------------------------------------------------------------------------------


def audit_entries(cluster: Cluster, namespace: str) -> list[JSON]:
    path = cluster.audit_log
    assert path is not None and path.exists(), "the local control plane writes an audit log"
    found = []
    with path.open() as handle:
        for line in handle:
            entry = json.loads(line)
            if (entry.get("objectRef") or {}).get("namespace") == namespace and entry.get(
                "stage"
            ) == "ResponseComplete":
                found.append(entry)
    return found


def result_names(shard: JSON) -> dict[str, str]:
    """The result ConfigMaps of a shard's idempotency key -> the shard's name (its claims' own
    results are named by fencing token too: `attempts_prefix`)."""
    label = key_label(shard["spec"]["idempotencyKey"])
    name = str(shard["metadata"]["name"])
    return {f"{RESULT_PREFIX}{label}": name, f"{ITEMS_PREFIX}{label}": name}


def committed_result(kube: Kube, namespace: str, shard: JSON) -> StoredResult:
    """The committed result of the shard's key (ConfigMap store), verified. The worker commits it
    right after its Done write, so it may trail the Done shard by a moment: waited for."""
    store = ConfigMapStore(kube, namespace)
    key = str(shard["spec"]["idempotencyKey"])
    found: StoredResult = wait_for(
        f"the result of {shard['metadata']['name']} to be committed",
        lambda: store.read_result(key),
        timeout=30,
    )
    return found


def writes_by_shard(entries: Sequence[JSON], shards: Sequence[JSON]) -> dict[str, Counter[str]]:
    """Successful writes per shard, keyed `<who> <verb> <resource>[/<subresource>]`.

    A write belongs to a shard when it is on the Shard or its status, on its claim Lease (same
    name), or stores or commits its result (ConfigMaps named after its idempotency key). No Event is
    a shard's: what happens to shards is counted in the campaign's Events (`<campaign>.<reason>`,
    `k8s.events.EventSeries`), writes of the campaign."""
    names = {str(s["metadata"]["name"]) for s in shards}
    stores: dict[str, str] = {}
    attempts: dict[str, str] = {}
    for shard in shards:
        stores.update(result_names(shard))
        attempts[attempts_prefix(shard["spec"]["idempotencyKey"])] = str(shard["metadata"]["name"])
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for entry in entries:
        if entry.get("verb") not in WRITE_VERBS:
            continue
        code = (entry.get("responseStatus") or {}).get("code", 0)
        if not 200 <= code < 300:
            continue
        ref = entry["objectRef"]
        resource = ref.get("resource", "")
        name = ref.get("name") or ""
        if resource in ("shards", "leases"):
            owner = name
        elif resource == "configmaps" and name in stores:
            owner = stores[name]
        elif resource == "configmaps" and name.startswith(tuple(attempts)):
            owner = next(shard for prefix, shard in attempts.items() if name.startswith(prefix))
        else:
            continue
        if owner not in names:
            continue
        user = entry["user"]["username"].rsplit(":", 1)[-1]
        what = resource + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        per[owner][f"{user} {entry['verb']} {what}"] += 1
    return per


@dataclass(frozen=True)
class LifecycleWrites:
    """API writes of one shard's life, split into heartbeats and everything else."""

    total: float
    heartbeats: float
    breakdown: Counter[str]
    # How many heartbeats those are (each one status patch, plus the Lease renewal beside it).
    beats: float = 0

    @property
    def without_heartbeats(self) -> int:
        return self.total - self.heartbeats


# The transitions a worker writes (its other status patches are heartbeats); the operator's are
# Materialized, Paused, Resumed, Retried, Revoked and the sweep's LeaseExpired.
WORKER_TRANSITIONS = frozenset({"Claimed", "Completed", "AttemptFailed", "Failed", "Blocked", "Released"})


def worker_transitions(shard: JSON) -> int:
    """How many of the shard's recorded transitions its workers wrote (from its status.history)."""
    history = (shard.get("status") or {}).get("history") or []
    return sum(1 for entry in history if entry.get("reason") in WORKER_TRANSITIONS)


def lifecycle_writes(writes: Counter[str], transitions: int) -> LifecycleWrites:
    """`transitions`: the worker's transitions of this shard (`worker_transitions`). Each is one
    status patch; the worker's other status patches are heartbeats, and each heartbeat also renews
    the Lease (one Lease patch). Routine transitions post no Event, so Events cannot tell them
    apart; the history can. Only the worker's writes are paired: heartbeats are the worker's."""
    worker = chartkit.worker_service_account()

    def by_worker(suffix: str) -> int:
        return sum(n for key, n in writes.items() if key.startswith(f"{worker} ") and key.endswith(suffix))

    status_patches = by_worker(" patch shards/status")
    heartbeat_status = max(0, status_patches - transitions)
    lease_patches = by_worker(" patch leases")
    heartbeat_lease = min(heartbeat_status, lease_patches)
    return LifecycleWrites(sum(writes.values()), heartbeat_status + heartbeat_lease, writes, heartbeat_status)


def print_writes_table(
    title: str, per_shard: Mapping[str, Counter[str]], transitions: Mapping[str, int]
) -> LifecycleWrites:
    """Print the average writes of a shard lifecycle by writer and kind; returns the averages (rounded)."""
    shards = len(per_shard) or 1
    combined: Counter[str] = Counter()
    for writes in per_shard.values():
        combined.update(writes)
    mean = mean_lifecycle_writes(per_shard, transitions)
    total, beats = mean.total, mean.heartbeats
    print(f"\n{title}: {len(per_shard)} shard(s); API writes per shard lifecycle (audit log):")
    for key, count in sorted(combined.items()):
        print(f"  {count / shards:6.2f}  {key}")
    print(f"  total {total:.2f}, heartbeats {beats:.2f}: {total - beats:.2f} per shard without heartbeats")
    return LifecycleWrites(round(total), round(beats), combined, round(mean.beats))


def mean_lifecycle_writes(
    per_shard: Mapping[str, Counter[str]], transitions: Mapping[str, int]
) -> LifecycleWrites:
    """The mean `lifecycle_writes` of the shards in `per_shard` (breakdown: mean count per key);
    `transitions`: each shard's worker transitions by name (`worker_transitions`)."""
    shards = len(per_shard) or 1
    figures = [lifecycle_writes(w, transitions.get(name, 0)) for name, w in per_shard.items()]
    combined: Counter[str] = Counter()
    for writes in per_shard.values():
        combined.update(writes)
    return LifecycleWrites(
        sum(f.total for f in figures) / shards,
        sum(f.heartbeats for f in figures) / shards,
        Counter({key: count / shards for key, count in combined.items()}),  # type: ignore[misc]
        sum(f.beats for f in figures) / shards,
    )
