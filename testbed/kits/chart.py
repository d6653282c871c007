"""The shardops Helm chart, for tests: render it, install it, act as its service accounts.

The chart (charts/shardops) is the single home of the shardops RBAC rules and admission policies.
Tests that need the operator's or the workers' permissions take them from here instead of keeping
their own copy:

    objects = render_rbac(namespace)              # ServiceAccounts, (Cluster)Roles, bindings
    apply_objects(cluster, objects)               # kubectl apply --server-side
    ...
    delete_cluster_scoped(cluster, objects)       # the ClusterRoles and ClusterRoleBindings

or install the whole chart (the operator Deployment included) with `install_chart`.

`local_values(namespace)` are the values every e2e install starts from: the operator watches only
`namespace` (so RBAC, the admission policies and the operator of one test never touch another
test's objects) and runs its Campaigns there too (workers.allowReleaseNamespace), runs one
replica and serves /metrics and /healthz on a free port. One replica
because the process-kubelet runs every pod on the host's network: two replicas of one Deployment
would both try to listen on the same port.
"""

from __future__ import annotations

import copy
import json
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from shardops import API_GROUP, API_VERSION
from testbed import tenants
from testbed.cluster import lifecycle

if TYPE_CHECKING:
    from testbed.harness import Cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "shardops"
RELEASE = "shardops"
# The installation's S3 keys, in the release namespace (chart value resultStore.s3.credentialsSecret).
OPERATOR_STORE_SECRET = "shardops-s3"

SERVICE_ACCOUNTS = "templates/serviceaccounts.yaml"
RBAC_OPERATOR = "templates/rbac-operator.yaml"
RBAC_WORKER = "templates/rbac-worker.yaml"
ADMISSION = "templates/admission-policies.yaml"
DEPLOYMENT = "templates/deployment.yaml"

CLUSTER_SCOPED_KINDS = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "CustomResourceDefinition",
    }
)

Values = Mapping[str, Any]


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` deep-merged into a copy of `base` (maps merge, everything else is replaced)."""
    result = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def local_values(namespace: str, **overrides: Any) -> dict[str, Any]:
    """Chart values for a test in `namespace` (see the module docstring); keyword args deep-merge."""
    values: dict[str, Any] = {
        "watch": {"namespaces": [namespace]},
        # One namespace per test, the operator's too: a sandbox (docs/security.md).
        "workers": {"allowReleaseNamespace": True},
        "operator": {"replicas": 1},
        "metrics": {"port": lifecycle.free_port()},
    }
    return merge(values, overrides)


def s3_store_values(
    cluster: Cluster, namespace: str, store: lifecycle.ObjectStore, prefix: str
) -> dict[str, Any]:
    """Chart values for an S3 store, with the installation's keys in a Secret of the release
    namespace `namespace` only (the operator's, never a worker's). Each campaign namespace needs its
    own keys: testbed.tenants.provision_namespace, the administrator's step when adding one."""
    tenants.put_store_secret(cluster.api, namespace, OPERATOR_STORE_SECRET, store)
    return {
        "resultStore": {
            "type": "S3",
            "s3": {
                "endpoint": store.endpoint,
                "region": store.region,
                "bucket": store.bucket,
                "prefix": prefix,
                "credentialsSecret": OPERATOR_STORE_SECRET,
            },
        }
    }


def built_image() -> str:
    """The image the build produces (`make image`, the Dockerfile), as the chart runs it by default:
    values.yaml's image.repository at Chart.yaml's appVersion (kept equal to pyproject's version).
    Examples and samples name exactly this, so they run wherever the chart does."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return f"{values['image']['repository']}:{app_version}"


def operator_service_account(release: str = RELEASE) -> str:
    """The operator's ServiceAccount name with default values (`<fullname>-operator`)."""
    return f"{fullname(release)}-operator"


def worker_service_account() -> str:
    """The worker ServiceAccount name with default values."""
    return "shardops-worker"


def fullname(release: str = RELEASE) -> str:
    return release if "shardops" in release else f"{release}-shardops"


def helm(
    *args: str,
    bin_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """Run the cached helm binary (testbed/cluster/build.sh installs it next to kubectl)."""
    binary = (bin_dir or lifecycle.bin_dir()) / "helm"
    result = subprocess.run(
        [str(binary), *args],
        check=False,
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def _values_file(values: Values | None, directory: Path) -> list[str]:
    if not values:
        return []
    path = directory / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
    return ["--values", str(path)]


def render(
    namespace: str,
    values: Values | None = None,
    *,
    release: str = RELEASE,
    show_only: Sequence[str] = (),
    include_crds: bool = False,
    api_versions: Sequence[str] = (),
    bin_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the rendered objects (NOTES and empty documents left out)."""
    with tempfile.TemporaryDirectory(prefix="shardops-chart-") as tmp:
        args = ["template", release, str(CHART), "--namespace", namespace, *_values_file(values, Path(tmp))]
        for template in show_only:
            args += ["--show-only", template]
        for version in api_versions:
            args += ["--api-versions", version]
        if include_crds:
            args.append("--include-crds")
        out = helm(*args, bin_dir=bin_dir).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_rbac(
    namespace: str,
    values: Values | None = None,
    *,
    release: str = RELEASE,
    service_accounts: bool = True,
    bin_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """The operator's and workers' ServiceAccounts and RBAC as the chart creates them.

    The release (operator) namespace is `namespace`; unless `values` say otherwise the operator
    watches only `namespace` and the workers run there too. Mind that the ServiceAccounts turn
    token automounting off: a pod using them must set `automountServiceAccountToken: true`, as the
    chart's Deployment and the operator's worker Jobs do.
    """
    templates = [RBAC_OPERATOR, RBAC_WORKER]
    if service_accounts:
        templates.insert(0, SERVICE_ACCOUNTS)
    merged = merge(
        {"watch": {"namespaces": [namespace]}, "workers": {"allowReleaseNamespace": True}}, values or {}
    )
    return render(namespace, merged, release=release, show_only=templates, bin_dir=bin_dir)


def install_chart(
    cluster: Cluster,
    namespace: str,
    values: Values | None = None,
    *,
    release: str = RELEASE,
    crds: bool = False,
    extra_args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm install` into `namespace` with `local_values(namespace)` deep-merged with `values`.

    By default the chart's CRDs are skipped: the session's
    `crds_installed` fixture owns them. With crds=True Helm applies them too (taking over the
    fields kubectl applied, which are identical: --force-conflicts; Helm 4 applies CRDs server-side).
    Does not wait: the caller waits for what it needs, with diagnostics.
    """
    return _install_or_upgrade(
        cluster, "install", namespace, values, release=release, crds=crds, extra_args=extra_args
    )


def upgrade_chart(
    cluster: Cluster,
    namespace: str,
    values: Values | None = None,
    *,
    release: str = RELEASE,
    extra_args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm upgrade` with these values (not reusing the previous ones: pass everything)."""
    return _install_or_upgrade(
        cluster, "upgrade", namespace, values, release=release, crds=False, extra_args=extra_args
    )


def _install_or_upgrade(
    cluster: Cluster,
    verb: str,
    namespace: str,
    values: Values | None,
    *,
    release: str,
    crds: bool,
    extra_args: Sequence[str],
) -> subprocess.CompletedProcess[str]:
    merged = merge(local_values(namespace), values or {}) if verb == "install" else dict(values or {})
    with tempfile.TemporaryDirectory(prefix="shardops-chart-") as tmp:
        args = [verb, release, str(CHART), "--namespace", namespace, *_values_file(merged, Path(tmp))]
        if verb == "install":
            args += ["--force-conflicts"] if crds else ["--skip-crds"]
        return helm(*args, *extra_args, bin_dir=cluster.bin_dir, env=cluster.env())


def uninstall_chart(
    cluster: Cluster, namespace: str, *, release: str = RELEASE, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return helm(
        "uninstall",
        release,
        "--namespace",
        namespace,
        bin_dir=cluster.bin_dir,
        env=cluster.env(),
        check=check,
    )


def dump_objects(objects: Iterable[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


def apply_objects(cluster: Cluster, objects: Iterable[Mapping[str, Any]], *, dry_run: bool = False) -> str:
    """kubectl apply (server-side) of rendered objects; returns kubectl's output."""
    args = ["apply", "--server-side", "--field-manager=shardops-e2e", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    result: str = cluster.kubectl(*args, stdin=dump_objects(objects)).stdout
    return result


def delete_cluster_scoped(cluster: Cluster, objects: Iterable[Mapping[str, Any]]) -> None:
    """Delete the cluster-scoped objects among `objects` (namespaced ones go with their namespace).

    CRDs are never deleted here: other tests of the session use them.
    """
    for obj in objects:
        kind = obj["kind"]
        if kind in CLUSTER_SCOPED_KINDS and kind != "CustomResourceDefinition":
            cluster.kubectl("delete", kind, obj["metadata"]["name"], "--ignore-not-found", "--wait=false")


def token_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig at `path` that authenticates as that ServiceAccount (a short-lived token).

    The real identity, groups included (system:serviceaccounts, system:serviceaccounts:<ns>), as a
    pod of that ServiceAccount would have it; impersonation would only approximate it.
    """
    token = cluster.kubectl(
        "create", "token", service_account, "--namespace", namespace, "--duration=10m"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    current = admin.get("current-context")
    context = next(c for c in admin["contexts"] if c["name"] == current)["context"]
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"system:serviceaccount:{namespace}:{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "target", "cluster": cluster_entry["cluster"]}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "target", "user": user, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def kubectl_as(
    cluster: Cluster, kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with another identity's kubeconfig; never raises on failure (tests look at it)."""
    env = cluster.env()
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(Path(cluster.bin_dir) / "kubectl"), *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def patch_as(
    kubeconfig: Path,
    namespace: str,
    plural: str,
    name: str,
    patch: Mapping[str, Any],
    *,
    status: bool = False,
) -> tuple[int, str]:
    """One merge PATCH of a shardops object (or its status) with that identity: (HTTP code, message).

    kubectl patch reads the object first, so a refused read would hide whether the patch itself is
    allowed; this sends only the PATCH.
    """
    api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        objects = client.CustomObjectsApi(api)
        call = (
            objects.patch_namespaced_custom_object_status
            if status
            else objects.patch_namespaced_custom_object
        )
        call(API_GROUP, API_VERSION, namespace, plural, name, dict(patch))
    except ApiException as error:
        body = error.body.decode() if isinstance(error.body, bytes) else str(error.body or "")
        try:
            message = str(json.loads(body).get("message", body))
        except ValueError:
            message = body
        return int(error.status), message
    finally:
        api.close()
    return 200, ""


def restricted_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """Why a pod spec would not meet shardops' hardening: the "restricted" Pod Security Standard
    (non-root, no privilege escalation, every capability dropped, RuntimeDefault/Localhost seccomp)
    plus a read-only root filesystem. Empty when it does. The API server checks the standard itself
    in a namespace labelled pod-security.kubernetes.io/enforce=restricted; this is the same rule for
    specs that are not created as pods (a Job template, a builder's output)."""
    problems = []
    pod_context = pod_spec.get("securityContext") or {}
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        name = container.get("name", "?")
        context = container.get("securityContext") or {}

        def effective(key: str, context: Mapping[str, Any] = context) -> Any:
            return context.get(key, pod_context.get(key))

        if effective("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if effective("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{name}: capabilities.drop does not contain ALL")
        if (context.get("capabilities") or {}).get("add"):
            problems.append(f"{name}: capabilities.add is not empty")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if (effective("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile.type is not RuntimeDefault or Localhost")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem is not true")
    return problems


def worker_job_violations() -> list[str]:
    """`restricted_violations` of the worker Job the operator builds (operator/builders.py)."""
    from shardops.api.campaign import Campaign
    from shardops.scheduler.builders import worker_job_body

    campaign = Campaign.parse(
        {
            "apiVersion": "shardops.dev/v1alpha1",
            "kind": "Campaign",
            "metadata": {"name": "probe", "namespace": "probe", "uid": "probe"},
            "spec": {"items": [{"n": 1}], "worker": {"image": "probe", "command": ["probe"]}},
        }
    )
    job = worker_job_body(campaign, campaign.spec.worker)
    return restricted_violations(job["spec"]["template"]["spec"])
