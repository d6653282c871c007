"""Tenants kept apart by the chart and the operator, through the real API server (docs/security.md).

The chart's ServiceAccounts, RBAC and admission policies are rendered by helm for a release in
namespace `ops` watching one team namespace, and applied as they are (no operator Deployment, so
nothing else writes the objects these tests write). Identities are real:

* a Campaign author is a user the admin impersonates (`kubectl --as`), which is what the
  authorizer in the campaign-references policy is asked about;
* a worker is the worker ServiceAccount with a token bound to a pod of the name the Job controller
  gives a campaign's worker (`<campaign>-worker-<n>-<5 characters>`), from the TokenRequest API as
  the kubelet gets it: the API server puts the pod's name in the request's user info. The pods are
  bound to a node that does not exist, so no kubelet runs them.

Every refusal is paired with an allowed request of the same identity, so a refusal cannot come
from a broken identity or from a policy that refuses everything. The last test runs the operator
itself and sees it refuse a Campaign of its own namespace.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from testbed.harness import Cluster, dump_json, wait_for
from testbed.kits import chart as chartkit
from testbed.kits import scheduler as schedulerkit

AUTHOR = "e2e-campaign-author"
WORKER_SA = chartkit.worker_service_account()
NOWHERE = "e2e-no-such-node"
# The leader Lease of a release named chartkit.RELEASE with default values.
LEADER_LEASE = f"{chartkit.fullname()}-operator"


def campaign_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": [{"n": 1}],
            "suspend": True,
            "worker": {"image": "shardops:e2e", "command": ["true"]},
            **spec,
        },
    }


def llm(**settings: Any) -> dict[str, Any]:
    return {
        "image": "shardops:e2e",
        "command": ["shardops", "llm"],
        "llm": {
            "baseUrl": "https://llm.example.com/v1",
            "model": "m",
            "messages": [{"role": "user", "content": "{{ item.n }}"}],
            **settings,
        },
    }


@dataclass
class Tenancy:
    """One release in `ops` watching `team`; tests share it and use names of their own."""

    cluster: Cluster
    ops: str
    team: str
    tmp: Path
    pods: list[str] = field(default_factory=list)

    def as_author(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("--as", AUTHOR, *args, stdin=stdin, check=False)

    def create_as_author(
        self, body: dict[str, Any], *, dry_run: bool = False
    ) -> subprocess.CompletedProcess[str]:
        args = ["create", "-n", self.team, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        return self.as_author(*args, stdin=dump_json(body))

    def admin(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, stdin=stdin)

    def worker_of(self, campaign: str) -> Path:
        """A kubeconfig of the worker ServiceAccount, its token bound to a pod of `campaign`'s first Job."""
        pod = f"{campaign}-worker-1-{uuid.uuid4().hex[:5]}"
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": self.team},
            "spec": {
                "serviceAccountName": WORKER_SA,
                "automountServiceAccountToken": False,
                "nodeName": NOWHERE,
                "containers": [{"name": "worker", "image": "shardops:e2e"}],
            },
        }
        created = json.loads(self.admin("create", "-f", "-", "-o", "json", stdin=dump_json(body)).stdout)
        self.pods.append(pod)
        token = self.admin(
            "create", "token", WORKER_SA, "-n", self.team, "--duration=10m",
            "--bound-object-kind=Pod", f"--bound-object-name={pod}",
            f"--bound-object-uid={created['metadata']['uid']}",
        ).stdout.strip()  # fmt: skip
        return kubeconfig_with(self.cluster, token, self.team, self.tmp / f"{pod}.kubeconfig")


def kubeconfig_with(cluster: Cluster, token: str, namespace: str, path: Path) -> Path:
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin.get("current-context"))["context"]
    entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "target", "cluster": entry["cluster"]}],
        "users": [{"name": "worker", "user": {"token": token}}],
        "contexts": [
            {"name": "w", "context": {"cluster": "target", "user": "worker", "namespace": namespace}}
        ],
        "current-context": "w",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def as_worker(
    t: Tenancy, worker: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return chartkit.kubectl_as(t.cluster, worker, *args, stdin=stdin)


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 30},
    }


def configmap(name: str, campaign: str | None) -> dict[str, Any]:
    labels = {"shardops.dev/campaign": campaign} if campaign else {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {}}


def shard(name: str, campaign: str) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Shard",
        "metadata": {"name": name, "labels": {"shardops.dev/campaign": campaign}},
        "spec": {"campaign": campaign, "index": 0, "items": [{"n": 1}], "idempotencyKey": "sha256-e2e"},
    }


def refused_by(result: subprocess.CompletedProcess[str], policy: str, *words: str) -> None:
    assert result.returncode != 0, f"expected the {policy} policy to refuse, got:\n{result.stdout}"
    assert f"-{policy}' with binding" in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def refused_by_rbac(result: subprocess.CompletedProcess[str], verb: str, resource: str) -> None:
    assert result.returncode != 0, f"expected RBAC to refuse {verb} {resource}, got:\n{result.stdout}"
    assert "(Forbidden)" in result.stderr and f'cannot {verb} resource "{resource}"' in result.stderr, (
        result.stderr
    )


def wait_for_worker_writes_policy(t: Tenancy, worker: Path, probe: dict[str, Any]) -> None:
    """Until the worker-writes policy refuses `probe` (an object it forbids the worker) in a dry run
    as the worker: a new policy reaches the API server's admission cache a moment after it is made."""
    wait_for(
        "the worker-writes policy to be enforced",
        lambda: (
            "-worker-writes'"
            in as_worker(t, worker, "create", "--dry-run=server", "-f", "-", stdin=dump_json(probe)).stderr
        ),
        timeout=30,
    )


def _create_namespace(core: client.CoreV1Api, name: str) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The serviceaccount controller makes "default"; the chart's accounts are applied by the test.
    wait_for(f"namespace {name} active", lambda: core.read_namespace(name).status.phase == "Active")


@pytest.fixture(scope="module")
def tenancy(
    cluster: Cluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tenancy]:
    suffix = uuid.uuid4().hex[:8]
    ops, team = f"e2e-ops-{suffix}", f"e2e-team-{suffix}"
    core = client.CoreV1Api(cluster.api)
    templates = [chartkit.SERVICE_ACCOUNTS, chartkit.RBAC_OPERATOR, chartkit.RBAC_WORKER, chartkit.ADMISSION]
    # The production shape: the release in a namespace of its own, Campaigns in the team's.
    values = {"watch": {"namespaces": [team]}, "operator": {"replicas": 1}}
    objects = chartkit.render(ops, values, show_only=templates, bin_dir=cluster.bin_dir)
    state = Tenancy(cluster, ops, team, tmp_path_factory.mktemp("tenancy"))
    try:
        for name in (ops, team):
            _create_namespace(core, name)
        chartkit.apply_objects(cluster, objects)
        author_role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "campaign-author", "namespace": team},
            "rules": [
                {
                    "apiGroups": ["shardops.dev"],
                    "resources": ["campaigns"],
                    "verbs": ["get", "list", "create", "update", "patch"],
                },
                # Reads this one Secret and this one ConfigMap, nothing else of the namespace.
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": ["readable"],
                    "verbs": ["get"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["readable"],
                    "verbs": ["get"],
                },
                # May name this one Source in a Campaign.
                {
                    "apiGroups": ["shardops.dev"],
                    "resources": ["sources"],
                    "resourceNames": ["readable"],
                    "verbs": ["use"],
                },
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "campaign-author", "namespace": team},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "campaign-author"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AUTHOR}],
        }
        for obj in (author_role, binding):
            state.admin("apply", "-f", "-", stdin=dump_json(obj))
        for name in ("readable", "team-key"):
            state.admin("create", "secret", "generic", name, "-n", team, "--from-literal=api-key=s3cr3t")
        state.admin("create", "configmap", "readable", "-n", team, "--from-literal=items.jsonl={}")
        state.admin("create", "configmap", "private", "-n", team, "--from-literal=items.jsonl={}")
        state.admin("create", "-n", ops, "-f", "-", stdin=dump_json(lease(LEADER_LEASE)))
        # New policies reach the API server's admission cache a moment after they are created.
        probe = campaign_body("probe", worker=llm(apiKeySecret={"name": "team-key"}))
        wait_for(
            "the campaign-references policy to be enforced",
            lambda: "-campaign-references'" in state.create_as_author(probe, dry_run=True).stderr,
            timeout=30,
        )
        worker = state.worker_of("probe")
        wait_for_worker_writes_policy(state, worker, configmap("app", "probe"))
        yield state
    finally:
        for pod in state.pods:
            cluster.kubectl("delete", "pod", pod, "-n", team, "--grace-period=0", "--force", check=False)
        chartkit.delete_cluster_scoped(cluster, objects)
        for name in (ops, team):
            core.delete_namespace(name, propagation_policy="Background")


# --- references checked against their author ----------------------------------------------------


SOURCES = [{"name": "big"}]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"worker": llm(apiKeySecret={"name": "team-key"})},
            "names Secret team-key in spec.worker.llm.apiKeySecret, which {author} may not read "
            "(permission get secrets/team-key in namespace {team})",
        ),
        (
            {
                "sources": SOURCES,
                "worker": llm(
                    apiKeySecret={"name": "readable"},
                    sources=[{"name": "big", "apiKeySecret": {"name": "team-key"}}],
                ),
            },
            "names Secrets team-key in spec.worker.llm.sources[].apiKeySecret; {author} may not read "
            "every one of them (permission get secrets/NAME for each, in namespace {team})",
        ),
        (
            {"resultStore": {"type": "S3", "s3": {"bucket": "results", "credentialsSecret": "team-key"}}},
            "names Secret team-key in spec.resultStore.s3.credentialsSecret, which {author} may not read",
        ),
        (
            {"finalize": llm(apiKeySecret={"name": "team-key"})},
            "names Secret team-key in spec.finalize.llm.apiKeySecret, which {author} may not read",
        ),
        (
            {
                "sources": SOURCES,
                "finalize": llm(sources=[{"name": "big", "apiKeySecret": {"name": "team-key"}}]),
            },
            "names Secrets team-key in spec.finalize.llm.sources[].apiKeySecret",
        ),
    ],
    ids=[
        "worker.llm.apiKeySecret",
        "worker.llm.sources[].apiKeySecret",
        "resultStore.s3.credentialsSecret",
        "finalize.llm.apiKeySecret",
        "finalize.llm.sources[].apiKeySecret",
    ],
)
def test_a_campaign_cannot_name_a_secret_its_author_cannot_read(
    tenancy: Tenancy, spec: dict[str, Any], words: str
) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    result = tenancy.create_as_author(campaign_body(name, **spec))
    refused_by(
        result, "campaign-references", f"Campaign {name} " + words.format(author=AUTHOR, team=tenancy.team)
    )
    assert tenancy.cluster.kubectl("get", "campaign", name, "-n", tenancy.team, check=False).returncode != 0
    # The same author, the same fields, a Secret it may read: admitted.
    readable = json.loads(json.dumps(spec).replace('"team-key"', '"readable"'))
    allowed = tenancy.create_as_author(campaign_body(name, **readable))
    assert allowed.returncode == 0, allowed.stderr


def test_a_campaign_cannot_run_as_an_account_its_author_cannot_act_as(tenancy: Tenancy) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    worker = {"image": "shardops:e2e", "command": ["true"], "serviceAccountName": "deployer"}
    refused_by(
        tenancy.create_as_author(campaign_body(name, worker=worker)),
        "campaign-references",
        f"Campaign {name} names ServiceAccount deployer in spec.worker.serviceAccountName, which {AUTHOR} "
        "may not act as",
        f"(permission impersonate serviceaccounts/deployer in namespace {tenancy.team})",
    )
    # Naming the chart's worker account is what leaving it unset does: no permission asked.
    allowed = tenancy.create_as_author(
        campaign_body(name, worker={**worker, "serviceAccountName": WORKER_SA})
    )
    assert allowed.returncode == 0, allowed.stderr


def test_a_campaign_cannot_take_its_items_from_a_configmap_its_author_cannot_read(tenancy: Tenancy) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    body = campaign_body(name)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "private", "key": "items.jsonl"}
    refused_by(
        tenancy.create_as_author(body),
        "campaign-references",
        f"(permission get configmaps/private in namespace {tenancy.team})",
    )
    body["spec"]["itemsFrom"]["configMapName"] = "readable"
    allowed = tenancy.create_as_author(body)
    assert allowed.returncode == 0, allowed.stderr


def test_a_campaign_cannot_name_a_source_its_author_may_not_use(tenancy: Tenancy) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    for ref, permission in (
        ({"name": "team-openai"}, f"(permission use sources/NAME in namespace {tenancy.team}"),
        ({"kind": "ClusterSource", "name": "readable"}, "or use clustersources/NAME"),
    ):
        body = campaign_body(name, sources=[{"name": "llm", "sourceRef": ref}])
        refused_by(
            tenancy.create_as_author(body),
            "campaign-references",
            f"Campaign {name} names {ref.get('kind', 'Source')} {ref['name']} in spec.sources[].sourceRef",
            permission,
        )
    allowed = tenancy.create_as_author(
        campaign_body(name, sources=[{"name": "llm", "sourceRef": {"name": "readable"}}])
    )
    assert allowed.returncode == 0, allowed.stderr


def test_an_update_is_judged_on_the_references_it_changes(tenancy: Tenancy) -> None:
    """A Campaign the admin made with a Secret the author may not read: the author may still change
    other settings, but not point it at another unreadable Secret."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    spec = {"worker": llm(apiKeySecret={"name": "readable"})}
    tenancy.admin("create", "-n", tenancy.team, "-f", "-", stdin=dump_json(campaign_body(name, **spec)))
    kept = tenancy.as_author(
        "patch", "campaign", name, "-n", tenancy.team, "--type=merge", "-p", '{"spec":{"maxConcurrency":2}}'
    )
    assert kept.returncode == 0, kept.stderr
    moved = {"spec": {"worker": {"llm": {"apiKeySecret": {"name": "team-key"}}}}}
    result = tenancy.as_author(
        "patch", "campaign", name, "-n", tenancy.team, "--type=merge", "-p", json.dumps(moved)
    )
    refused_by(result, "campaign-references", f"permission get secrets/team-key in namespace {tenancy.team}")
    got = json.loads(tenancy.admin("get", "campaign", name, "-n", tenancy.team, "-o", "json").stdout)
    assert got["spec"]["worker"]["llm"]["apiKeySecret"]["name"] == "readable"


# --- worker writes: only its own campaign's -----------------------------------------------------


def test_a_worker_writes_only_its_own_campaigns_claim_leases(tenancy: Tenancy) -> None:
    worker = tenancy.worker_of("alpha")
    own = as_worker(tenancy, worker, "create", "-f", "-", stdin=dump_json(lease("alpha-00000")))
    assert own.returncode == 0, own.stderr
    renewed = as_worker(
        tenancy,
        worker,
        "patch",
        "lease",
        "alpha-00000",
        "--type=merge",
        "-p",
        '{"spec":{"leaseDurationSeconds":31}}',
    )
    assert renewed.returncode == 0, renewed.stderr
    for name in ("beta-00000", "alpha-lock", "team-lock"):
        result = as_worker(tenancy, worker, "create", "-f", "-", stdin=dump_json(lease(name)))
        refused_by(
            result,
            "worker-writes",
            "may write only the claim Leases of its own campaign's shards",
            f"not Lease {name}",
        )
    tenancy.admin("create", "-n", tenancy.team, "-f", "-", stdin=dump_json(lease("beta-00001")))
    takeover = as_worker(
        tenancy,
        worker,
        "patch",
        "lease",
        "beta-00001",
        "--type=merge",
        "-p",
        '{"spec":{"holderIdentity":"alpha"}}',
    )
    refused_by(takeover, "worker-writes", "not Lease beta-00001")


def test_a_worker_writes_only_its_own_campaigns_result_configmaps(tenancy: Tenancy) -> None:
    worker = tenancy.worker_of("alpha")
    own = as_worker(
        tenancy, worker, "create", "-f", "-", stdin=dump_json(configmap("shardops-items-alpha1", "alpha"))
    )
    assert own.returncode == 0, own.stderr
    added = as_worker(
        tenancy,
        worker,
        "patch",
        "configmap",
        "shardops-items-alpha1",
        "--type=merge",
        "-p",
        '{"data":{"k":"v"}}',
    )
    assert added.returncode == 0, added.stderr
    refused_by(
        as_worker(tenancy, worker, "create", "-f", "-", stdin=dump_json(configmap("app-config", "alpha"))),
        "worker-writes",
        "may write only the result store's ConfigMaps",
        "not ConfigMap app-config",
    )
    refused_by(
        as_worker(
            tenancy, worker, "create", "-f", "-", stdin=dump_json(configmap("shardops-items-beta1", "beta"))
        ),
        "worker-writes",
        "ConfigMap shardops-items-beta1 is labelled campaign 'beta'",
    )
    tenancy.admin(
        "create", "-n", tenancy.team, "-f", "-", stdin=dump_json(configmap("shardops-result-beta2", "beta"))
    )
    poisoned = as_worker(
        tenancy,
        worker,
        "patch",
        "configmap",
        "shardops-result-beta2",
        "--type=merge",
        "-p",
        '{"data":{"result.json":"{}"}}',
    )
    refused_by(poisoned, "worker-writes", "is labelled campaign 'beta'")
    relabelled = as_worker(
        tenancy, worker, "patch", "configmap", "shardops-items-alpha1", "--type=merge",
        "-p", '{"metadata":{"labels":{"shardops.dev/campaign":"beta"}}}',
    )  # fmt: skip
    refused_by(relabelled, "worker-writes", "kept on every change")


def test_a_worker_writes_only_its_own_campaigns_shard_status(tenancy: Tenancy) -> None:
    worker = tenancy.worker_of("alpha")
    for name, campaign in (("alpha-00000", "alpha"), ("beta-00000", "beta")):
        tenancy.admin("create", "-n", tenancy.team, "-f", "-", stdin=dump_json(shard(name, campaign)))
    status = {"status": {"phase": "Running", "attempt": 1}}
    own = chartkit.patch_as(worker, tenancy.team, "shards", "alpha-00000", status, status=True)
    assert own == (200, ""), own
    code, message = chartkit.patch_as(worker, tenancy.team, "shards", "beta-00000", status, status=True)
    assert code == 403 and "-worker-writes' with binding" in message, message
    assert "may write only the status of its own campaign's shards, not of shard beta-00000" in message
    got = json.loads(tenancy.admin("get", "shard", "beta-00000", "-n", tenancy.team, "-o", "json").stdout)
    assert "status" not in got or not got["status"].get("phase")


# --- workers never beside the operator ----------------------------------------------------------


def lease_call(
    kubeconfig: Path, verb: str, namespace: str, name: str, body: dict[str, Any]
) -> tuple[int, str]:
    """One PATCH or PUT of a Lease with that identity, without the read kubectl sends first:
    (HTTP code, message)."""
    api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        leases = client.CoordinationV1Api(api)
        call = leases.patch_namespaced_lease if verb == "patch" else leases.replace_namespaced_lease
        call(name, namespace, body)
    except ApiException as error:
        text = error.body.decode() if isinstance(error.body, bytes) else str(error.body or "")
        try:
            return int(error.status), str(json.loads(text).get("message", text))
        except ValueError:
            return int(error.status), text
    finally:
        api.close()
    return 200, ""


def test_a_worker_cannot_reach_the_operator_leader_lease(tenancy: Tenancy) -> None:
    worker = tenancy.worker_of("alpha")
    tenancy.admin("create", "-n", tenancy.team, "-f", "-", stdin=dump_json(lease("alpha-00009")))
    own = as_worker(tenancy, worker, "get", "lease", "alpha-00009")
    assert own.returncode == 0, own.stderr
    ops = tenancy.ops
    refused_by_rbac(as_worker(tenancy, worker, "get", "lease", LEADER_LEASE, "-n", ops), "get", "leases")
    for verb, body in (("patch", {"spec": {"holderIdentity": "alpha"}}), ("update", lease(LEADER_LEASE))):
        code, message = lease_call(worker, verb, ops, LEADER_LEASE, body)
        assert code == 403 and f'cannot {verb} resource "leases"' in message, (verb, code, message)
    held = json.loads(tenancy.admin("get", "lease", LEADER_LEASE, "-n", ops, "-o", "json").stdout)
    assert held["spec"]["holderIdentity"] == "e2e"


@pytest.mark.usefixtures("crds_installed")
def test_the_operator_refuses_a_campaign_in_its_own_namespace(cluster: Cluster, namespace: str) -> None:
    settings = {"SHARDOPS_ALLOW_CAMPAIGNS_IN_OPERATOR_NAMESPACE": "false"}
    with schedulerkit.operator_running(cluster, namespace, env=settings):
        cluster.kubectl(
            "create", "-n", namespace, "-f", "-", stdin=dump_json(campaign_body("beside", suspend=False))
        )

        def ready() -> dict[str, Any] | None:
            got = json.loads(
                cluster.kubectl("get", "campaign", "beside", "-n", namespace, "-o", "json").stdout
            )
            found = [c for c in (got.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
            return found[0] if found and found[0]["reason"] == "InOperatorNamespace" else None

        condition = wait_for("the InOperatorNamespace condition", ready, timeout=60)
        assert condition["status"] == "False"
        assert (
            f"Campaign beside is in namespace {namespace}, where the shardops operator runs"
            in condition["message"]
        )
        assert "workers.namespaces" in condition["message"]
        shards = cluster.kubectl("get", "shards", "-n", namespace, "-o", "name").stdout
        jobs = cluster.kubectl("get", "jobs", "-n", namespace, "-o", "name").stdout
        assert shards.strip() == "" and jobs.strip() == ""


def test_in_a_sandbox_the_worker_writes_policy_still_keeps_the_leader_lease(
    cluster: Cluster, crds_installed: None, tmp_path: Path
) -> None:
    """workers.allowReleaseNamespace: workers share the operator's namespace and RBAC grants them its
    Leases; the worker-writes policy still refuses the leader Lease (it is no shard's claim)."""
    sandbox = f"e2e-sandbox-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api)
    templates = [chartkit.SERVICE_ACCOUNTS, chartkit.RBAC_OPERATOR, chartkit.RBAC_WORKER, chartkit.ADMISSION]
    objects = chartkit.render(
        sandbox, chartkit.local_values(sandbox), show_only=templates, bin_dir=cluster.bin_dir
    )
    state = Tenancy(cluster, sandbox, sandbox, tmp_path)
    try:
        _create_namespace(core, sandbox)
        chartkit.apply_objects(cluster, objects)
        state.admin("create", "-n", sandbox, "-f", "-", stdin=dump_json(lease(LEADER_LEASE)))
        worker = state.worker_of("alpha")
        wait_for_worker_writes_policy(state, worker, lease("probe-lock"))
        # RBAC allows it here: only the policy stands between the command and the leadership.
        code, message = lease_call(
            worker, "patch", sandbox, LEADER_LEASE, {"spec": {"holderIdentity": "alpha"}}
        )
        assert code == 403, (code, message)
        assert "-worker-writes' with binding" in message, message
        assert "may write only the claim Leases of its own campaign's shards" in message
        current = json.loads(state.admin("get", "lease", LEADER_LEASE, "-n", sandbox, "-o", "json").stdout)
        replacement = lease(LEADER_LEASE)
        replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        code, message = lease_call(worker, "update", sandbox, LEADER_LEASE, replacement)
        assert code == 403 and f"not Lease {LEADER_LEASE}" in message, (code, message)
        own = as_worker(state, worker, "create", "-f", "-", stdin=dump_json(lease("alpha-00000")))
        assert own.returncode == 0, own.stderr
        held = json.loads(state.admin("get", "lease", LEADER_LEASE, "-n", sandbox, "-o", "json").stdout)
        assert held["spec"]["holderIdentity"] == "e2e"
    finally:
        for pod in state.pods:
            cluster.kubectl("delete", "pod", pod, "-n", sandbox, "--grace-period=0", "--force", check=False)
        chartkit.delete_cluster_scoped(cluster, objects)
        core.delete_namespace(sandbox, propagation_policy="Background")
