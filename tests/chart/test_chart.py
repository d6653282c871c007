"""The Helm chart without a cluster: values and schema in step, CRDs in sync, what the templates render.

Static checks run everywhere. Rendering uses the helm binary that `make tools` (testbed/cluster/build.sh)
caches, found without building (`testbed.cluster.lifecycle.bin_dir(build=False)`); before `make tools`
those tests skip and say why. The e2e
suite (e2e/test_chart_*.py) sends the same renderings to a real API server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardops.api import rules
from shardops.api.campaign import Campaign
from shardops.api.crdgen import drift, render_files

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "shardops"
TEMPLATES = CHART / "templates"
VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES: dict[str, Any] = yaml.safe_load(VALUES_TEXT)
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
CHART_META: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
# Helm passes a parent chart's `global` values to its subcharts; the schema must accept them.
HELM_OWN_VALUES = {"global"}


# --- helm ------------------------------------------------------------------------------------


def helm(helm_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # No KUBECONFIG: rendering must not depend on (or touch) a cluster.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".shardops" / "helm-home")}
    result = subprocess.run(
        [str(helm_bin), *args], capture_output=True, text=True, check=False, env=env, timeout=60
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(
    helm_bin: Path, *sets: str, namespace: str = "shardops-system", extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    args = ["template", "rel", str(CHART), "--namespace", namespace, *extra]
    for value in sets:
        args += ["--set", value]
    return [doc for doc in yaml.safe_load_all(helm(helm_bin, *args).stdout) if doc]


def only(objects: list[dict[str, Any]], kind: str, name_part: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name_part in o["metadata"]["name"]]
    assert len(found) == 1, f"expected one {kind} *{name_part}*, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


# --- values.yaml and values.schema.json --------------------------------------------------------


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}" if path else name)


def closed(node: dict[str, Any]) -> bool:
    return node.get("additionalProperties") is False


def value_paths(
    value: Any, schema: dict[str, Any], path: str = ""
) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """Every key of values.yaml with its schema node (None when the schema does not know it)."""
    if not isinstance(value, dict):
        return
    for key, child in value.items():
        child_path = f"{path}.{key}" if path else key
        props = schema.get("properties", {})
        node = props.get(key)
        if node is None and isinstance(schema.get("additionalProperties"), dict):
            node = schema["additionalProperties"]
        yield child_path, node
        if node is not None:
            yield from value_paths(child, node, child_path)


def test_every_value_is_in_the_schema() -> None:
    unknown = [path for path, node in value_paths(VALUES, SCHEMA) if node is None]
    assert unknown == [], f"values.yaml keys the schema does not describe: {unknown}"


def test_every_schema_property_of_the_chart_has_a_default_in_values() -> None:
    """Closed schema objects are the chart's own settings: each needs its documented default."""
    known = {path for path, _ in value_paths(VALUES, SCHEMA)}
    missing = [
        f"{path}.{name}" if path else name
        for path, node in schema_nodes(SCHEMA)
        if closed(node)
        for name in node.get("properties", {})
        if (f"{path}.{name}" if path else name) not in known | HELM_OWN_VALUES
    ]
    assert missing == [], f"schema properties without a value in values.yaml: {missing}"


def test_chart_settings_reject_unknown_keys() -> None:
    """A typo (operator.replica) must fail, so every object of chart settings is closed."""
    for path, node in schema_nodes(SCHEMA):
        if node.get("type") == "object" and "properties" in node and not closed(node):
            # Open on purpose: core/v1 types the chart passes through (security contexts and
            # their parts), where Kubernetes itself rejects unknown fields.
            assert path.startswith(("operator.podSecurityContext", "operator.securityContext")), path


def test_every_schema_node_is_described() -> None:
    for path, node in schema_nodes(SCHEMA):
        if path and "properties" in node and closed(node):
            assert node.get("description"), f"{path}: no description"
            for name, child in node["properties"].items():
                assert child.get("description"), f"{path}.{name}: no description"


def documented_keys() -> Iterator[tuple[int, str, str]]:
    """(line number, dotted path, previous line) of every mapping key in values.yaml."""
    lines = VALUES_TEXT.splitlines()
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        yield number + 1, ".".join(key for _, key in stack), lines[number - 1] if number else ""


def test_every_chart_setting_in_values_has_a_comment() -> None:
    known = dict(value_paths(VALUES, SCHEMA))
    parents = dict(schema_nodes(SCHEMA))
    checked = 0
    for line, path, previous in documented_keys():
        parent = parents.get(path.rpartition(".")[0])
        if parent is None or not closed(parent) or path not in known:
            continue  # inside a core/v1 object (resources, security contexts): Kubernetes' own fields
        checked += 1
        assert previous.strip().startswith("#"), f"values.yaml:{line}: {path} has no comment above it"
    assert checked >= 40


def test_schema_rejects_what_values_comments_promise() -> None:
    operator = SCHEMA["properties"]["operator"]["properties"]
    assert operator["podSecurityContext"]["properties"]["runAsNonRoot"]["const"] is True
    assert operator["securityContext"]["properties"]["allowPrivilegeEscalation"]["const"] is False
    assert operator["securityContext"]["properties"]["readOnlyRootFilesystem"]["const"] is True
    assert operator["replicas"]["minimum"] == 1


# --- Chart.yaml and CRDs -----------------------------------------------------------------------


def test_app_version_is_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert CHART_META["appVersion"] == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", CHART_META["version"])
    assert CHART_META["apiVersion"] == "v2"


def test_chart_crds_match_the_models() -> None:
    problems = drift(CHART / "crds")
    if problems:
        pytest.fail(
            "\n\n".join(problems) + "\n\nThe chart's copy is regenerated by `make manifests` "
            "(shardops crds --output charts/shardops/crds)",
            pytrace=False,
        )


def test_chart_crds_are_exactly_the_generated_ones() -> None:
    in_chart = {p.name: p.read_text() for p in (CHART / "crds").iterdir()}
    assert set(in_chart) == set(render_files()), (
        "charts/shardops/crds holds files that are not generated CRDs"
    )
    for name, text in in_chart.items():
        assert text == (ROOT / "crds" / name).read_text(), (
            f"charts/shardops/crds/{name} differs from crds/{name}"
        )


# --- helm lint and rendering ------------------------------------------------------------------


def test_helm_lint_strict_is_clean(helm_bin: Path) -> None:
    result = helm(helm_bin, "lint", "--strict", str(CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    messages = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert messages == [], f"helm lint has remarks: {messages}"


def test_default_rendering(helm_bin: Path) -> None:
    objects = render(helm_bin)
    assert kinds(objects) == sorted(
        [
            "ServiceAccount",  # the operator's; workers only in the namespaces listed (none by default)
            "ClusterRole", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "ClusterRole", "ClusterRole",  # aggregated into view, edit and admin
            "Deployment", "PodDisruptionBudget", "Service",
            *["ValidatingAdmissionPolicy"] * 5,
            *["ValidatingAdmissionPolicyBinding"] * 5,
        ]
    )  # fmt: skip
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding") and "Admission" not in obj["kind"]:
            assert obj["metadata"]["namespace"] == "shardops-system", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"


def deployment_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = only(objects, "Deployment")["spec"]["template"]
    return pod


def test_operator_deployment(helm_bin: Path) -> None:
    objects = render(helm_bin)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["shardops", "operator"]
    assert container["image"] == f"ghcr.io/shardops/shardops:{CHART_META['appVersion']}"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["SHARDOPS_NAMESPACES"] == ""  # every namespace
    assert env["SHARDOPS_METRICS_PORT"] == "8080"
    assert env["SHARDOPS_LEADER_ELECTION"] == "true"
    assert env["SHARDOPS_LEADER_ELECTION_LEASE_NAME"] == "rel-shardops-operator"
    assert env["SHARDOPS_LEADER_ELECTION_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["SHARDOPS_WORKER_SERVICE_ACCOUNT"] == "shardops-worker"
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 8080)
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["spec"]["serviceAccountName"] == "rel-shardops-operator"


def test_pods_meet_the_restricted_pod_security_standard(helm_bin: Path) -> None:
    pod = deployment_pod(render(helm_bin))["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in context
    # Writable scratch space on a read-only root filesystem, and only there.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert all("hostPath" not in v for v in pod["volumes"])
    assert not pod.get("hostNetwork") and not pod.get("hostPID")


def test_service_account_tokens_only_where_needed(helm_bin: Path) -> None:
    objects = render(helm_bin, "workers.namespaces={team-a}")
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert {a["metadata"]["name"] for a in accounts} == {"rel-shardops-operator", "shardops-worker"}
    assert all(a["automountServiceAccountToken"] is False for a in accounts)
    # The operator talks to the API server: its pod (and only its pod) asks for the token.
    assert deployment_pod(objects)["spec"]["automountServiceAccountToken"] is True


def test_pdb_service_and_metrics(helm_bin: Path) -> None:
    objects = render(helm_bin)
    pod_labels = deployment_pod(objects)["metadata"]["labels"]
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = only(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def test_single_replica_has_no_disruption_budget(helm_bin: Path) -> None:
    objects = render(helm_bin, "operator.replicas=1")
    assert only(objects, "Deployment")["spec"]["replicas"] == 1
    assert "PodDisruptionBudget" not in kinds(objects)


def test_service_monitor_points_at_the_metrics_service(helm_bin: Path) -> None:
    objects = render(
        helm_bin,
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
        extra=("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"),
    )
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["shardops-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "30s", "10s")
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_worker_metrics_are_off_by_default(helm_bin: Path) -> None:
    objects = render(helm_bin)
    env = {e["name"] for e in deployment_pod(objects)["spec"]["containers"][0]["env"]}
    assert not {n for n in env if n.startswith("SHARDOPS_WORKER_METRICS")}
    assert "PodMonitor" not in kinds(objects)


def test_worker_metrics_reach_the_operator_settings_and_the_pod_monitor_scrapes_worker_pods(
    helm_bin: Path,
) -> None:
    from shardops.api.names import ROLE_LABEL
    from shardops.k8s.jobs import WORKER_ROLE
    from shardops.scheduler.builders import WORKER_METRICS_PORT_NAME, WorkerMetricsEndpoint
    from shardops.scheduler.settings import OperatorSettings

    objects = render(
        helm_bin,
        "workers.metrics.enabled=true",
        "workers.metrics.port=9100",
        "workers.metrics.lingerSeconds=45",
        "workers.metrics.podMonitor.enabled=true",
        "workers.metrics.podMonitor.labels.release=prom",
        "watch.namespaces={team-a,team-b}",
        extra=("--api-versions", "monitoring.coreos.com/v1/PodMonitor"),
    )
    env = {
        e["name"]: e["value"] for e in deployment_pod(objects)["spec"]["containers"][0]["env"] if "value" in e
    }
    # What the chart sets is what the operator reads: its settings, parsed from the rendered env.
    settings = OperatorSettings.model_validate(
        {
            n.removeprefix("SHARDOPS_").lower(): v
            for n, v in env.items()
            if n.startswith("SHARDOPS_WORKER_METRICS")
        }
        | {"identity": "t"}
    )
    assert settings.worker_metrics() == WorkerMetricsEndpoint(9100, 45)
    monitor = only(objects, "PodMonitor")
    # The pods it selects are the worker pods the operator builds, on the port it names.
    assert monitor["spec"]["selector"] == {"matchLabels": {ROLE_LABEL: WORKER_ROLE}}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {
        "port": WORKER_METRICS_PORT_NAME,
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "10s",
    }
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["metadata"]["namespace"] == "shardops-system"


def test_image_digest_and_tag(helm_bin: Path) -> None:
    digest = "sha256:" + "ab" * 32
    pod = deployment_pod(render(helm_bin, f"image.digest={digest}", "image.tag=9.9.9"))
    assert pod["spec"]["containers"][0]["image"] == f"ghcr.io/shardops/shardops@{digest}"
    pod = deployment_pod(render(helm_bin, "image.tag=1.2.3", "image.repository=registry.example/so"))
    assert pod["spec"]["containers"][0]["image"] == "registry.example/so:1.2.3"


def test_pull_secrets_and_extra_env(helm_bin: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "imagePullSecrets": ["regcred", {"name": "mirror"}],
                "operator": {
                    "extraEnv": [
                        {"name": "SHARDOPS_TICK_SECONDS", "value": "2"},
                        # Behind an egress proxy: the S3 client goes through it (shardops.proxies).
                        {"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
                        {"name": "NO_PROXY", "value": ".svc.cluster.local"},
                    ]
                },
            }
        )
    )
    pod = deployment_pod(render(helm_bin, extra=("--values", str(values))))["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    (container,) = pod["containers"]
    assert "args" not in container
    assert {"name": "SHARDOPS_TICK_SECONDS", "value": "2"} in container["env"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"} in container["env"]


def test_no_value_passes_arguments_the_operator_refuses(helm_bin: Path) -> None:
    """`shardops operator` takes no arguments (it crash-loops on any): there is no value for them."""
    refused = helm(
        helm_bin, "template", "rel", str(CHART), "--set", "operator.extraArgs={--flag}", check=False
    )
    assert refused.returncode != 0 and "extraArgs" in refused.stderr


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("resultStore.type=S3", "resultStore.s3.bucket=results", "resultStore.retentionSeconds=3600"),
        (
            "workers.metrics.enabled=true",
            "operator.logLevel=debug",
            "operator.leaderElection.enabled=false",
            "operator.replicas=1",
        ),
        (
            "workers.imagePullSecrets={regcred}",
            "workers.nodeSelector.pool=batch",
            "workers.tolerations[0].key=batch",
            "workers.tolerations[0].operator=Exists",
            "workers.resources.requests.cpu=100m",
        ),
    ],
    ids=["defaults", "s3", "metrics-debug", "worker-placement"],
)
def test_the_operator_starts_with_what_the_chart_renders(
    helm_bin: Path, sets: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered command parses with the operator's own parser and its environment loads as its
    settings: a value the operator would refuse at start is caught here, not as a crash loop."""
    from shardops.main import build_parser
    from shardops.scheduler.settings import OperatorSettings

    (container,) = deployment_pod(render(helm_bin, *sets))["spec"]["containers"]
    argv = [*container["command"][1:], *container.get("args", [])]
    assert build_parser().parse_args(argv).run is not None
    # valueFrom entries (pod name, uid, namespace) get what the kubelet would put there; the settings
    # are read from the environment as the operator reads them (JSON values decoded).
    for name in [n for n in os.environ if n.startswith("SHARDOPS_")]:
        monkeypatch.delenv(name)
    for entry in container["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", "filled-by-kubelet"))
    settings = OperatorSettings()
    assert settings.log_level.upper() in {"DEBUG", "INFO", "WARNING", "ERROR"}
    if "workers.nodeSelector.pool=batch" in sets:
        defaults = settings.worker_pod_defaults()
        assert defaults.image_pull_secrets == ("regcred",) and defaults.node_selector == {"pool": "batch"}
        assert defaults.tolerations == ({"key": "batch", "operator": "Exists"},)
        assert defaults.resources == {"requests": {"cpu": "100m"}}


def test_worker_tolerations_the_operator_could_not_read_are_refused_at_install(helm_bin: Path) -> None:
    refused = helm(
        helm_bin, "template", "rel", str(CHART), "--set", "workers.tolerations[0].keyy=batch", check=False
    )
    assert refused.returncode != 0 and "tolerations" in refused.stderr


def test_kube_version_floor_covers_the_crd_features_used() -> None:
    """Workers list Shards with a field selector on a CRD selectableField (GA in Kubernetes 1.32)."""
    floor = re.fullmatch(r">=1\.(\d+)\.0-0", CHART_META["kubeVersion"])
    assert floor, CHART_META["kubeVersion"]
    shards_crd = yaml.safe_load((CHART / "crds" / "shardops.dev_shards.yaml").read_text())
    if any("selectableFields" in v for v in shards_crd["spec"]["versions"]):
        assert int(floor.group(1)) >= 32
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"Kubernetes **1.{floor.group(1)} or later**" in install


def test_watching_a_list_of_namespaces_binds_nothing_cluster_wide(helm_bin: Path) -> None:
    objects = render(helm_bin, "watch.namespaces={team-a,team-b}")
    assert "ClusterRoleBinding" not in kinds(objects)
    bindings = {
        (o["metadata"]["namespace"], o["roleRef"]["name"]) for o in objects if o["kind"] == "RoleBinding"
    }
    assert bindings == {
        ("team-a", "rel-shardops-shardops-system-operator"),
        ("team-b", "rel-shardops-shardops-system-operator"),
        ("team-a", "rel-shardops-shardops-system-worker"),
        ("team-b", "rel-shardops-shardops-system-worker"),
        ("shardops-system", "rel-shardops-leader-election"),
    }
    workers = {o["metadata"]["namespace"] for o in objects if o["kind"] == "ServiceAccount"} - {
        "shardops-system"
    }
    assert workers == {"team-a", "team-b"}
    env = {e["name"]: e.get("value") for e in deployment_pod(objects)["spec"]["containers"][0]["env"]}
    assert env["SHARDOPS_NAMESPACES"] == "team-a,team-b"  # OperatorSettings.namespaces: comma-separated
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert selector == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]


def test_watching_every_namespace_binds_cluster_wide(helm_bin: Path) -> None:
    objects = render(helm_bin)
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "rel-shardops-shardops-system-operator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-shardops-operator", "namespace": "shardops-system"}
    ]
    for policy_binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        assert "matchResources" not in policy_binding["spec"]


def shard_policy_writers(objects: list[dict[str, Any]]) -> str:
    policy = only(objects, "ValidatingAdmissionPolicy", "shard-state")
    expression: str = next(v for v in policy["spec"]["variables"] if v["name"] == "shardops")["expression"]
    return expression


def test_shard_policy_names_exactly_the_shardops_identities(helm_bin: Path) -> None:
    everywhere = shard_policy_writers(render(helm_bin))
    assert '"system:serviceaccount:shardops-system:rel-shardops-operator"' in everywhere
    assert '"^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:shardops-worker$"' in everywhere
    listed = shard_policy_writers(
        render(helm_bin, "watch.namespaces={team-a,team-b}", "admission.extraStateWriters={alice}")
    )
    assert '"^system:serviceaccount:(team-a|team-b):shardops-worker$"' in listed
    assert 'variables.writer in ["alice"]' in listed
    dotted = shard_policy_writers(render(helm_bin, "workers.serviceAccount.name=shardops.worker"))
    assert r':shardops\\.worker$"' in dotted  # a dot in the name matches only a dot


def test_shard_policy_matches_status_updates(helm_bin: Path) -> None:
    policy = only(render(helm_bin), "ValidatingAdmissionPolicy", "shard-state")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["shardops.dev"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["shards", "shards/status"],
        }
    ]
    messages = " ".join(v["message"] + v["messageExpression"] for v in policy["validations"])
    assert "state changes only through shardops actions" in messages.lower()
    assert "kubectl campaign retry" in messages


def test_campaign_inputs_policy_holds_exactly_the_fields_the_crd_holds(helm_bin: Path) -> None:
    """Two homes only because Helm never upgrades a chart's CRDs: the policy and the CRD's transition
    rules (api.rules.IMMUTABLE_CAMPAIGN_INPUTS) must name the same fields with the same words."""
    policy = only(render(helm_bin), "ValidatingAdmissionPolicy", "campaign-inputs")["spec"]
    held = {}
    for validation in policy["validations"]:
        (field,) = set(re.findall(r"object\.spec\.(\w+)", validation["expression"]))
        held[field] = validation["messageExpression"]
    assert set(held) == set(rules.IMMUTABLE_CAMPAIGN_INPUTS)
    for field, rule in rules.IMMUTABLE_CAMPAIGN_INPUTS.items():
        words = f"spec.{field} cannot change after the campaign is created"
        assert rule.message.startswith(words) and words in held[field], field


def test_campaign_budget_policy_says_the_models_words_and_judges_only_a_written_budget(
    helm_bin: Path,
) -> None:
    """maxPerShard over limit: CRD CEL cannot see untyped amounts, so the chart's policy refuses it,
    with the model's message (api.rules.BUDGET_PER_SHARD_WITHIN_LIMIT), on create and on a budget
    change only (an operator's finalizer update of an older campaign must pass)."""
    policy = only(render(helm_bin), "ValidatingAdmissionPolicy", "campaign-budget")["spec"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["campaigns"], ["CREATE", "UPDATE"])
    (written,) = policy["matchConditions"]
    assert "object.spec.budget != oldObject.spec.budget" in written["expression"]
    (validation,) = policy["validations"]
    assert validation["message"] == rules.BUDGET_PER_SHARD_WITHIN_LIMIT
    assert rules.BUDGET_PER_SHARD_WITHIN_LIMIT.split(";")[0] in validation["messageExpression"]
    assert (
        "double(variables.budget.maxPerShard) <= double(variables.budget.limit)" in validation["expression"]
    )


def test_admission_and_rbac_can_be_left_out(helm_bin: Path) -> None:
    objects = render(helm_bin, "admission.enabled=false", "rbac.create=false")
    assert not [o for o in objects if "Role" in o["kind"] or "Admission" in o["kind"]]
    assert "Deployment" in kinds(objects)
    objects = render(
        helm_bin,
        "operator.serviceAccount.create=false",
        "operator.serviceAccount.name=mine",
        "workers.namespaces={team-a}",
    )
    assert deployment_pod(objects)["spec"]["serviceAccountName"] == "mine"
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"] == ["shardops-worker"]


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _aggregated(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == "ClusterRole" and any(k.startswith(AGGREGATE) for k in o["metadata"]["labels"])
    ]


def test_namespace_users_get_campaigns_through_the_default_roles(helm_bin: Path) -> None:
    """view reads Campaigns, Shards and Sources; edit and admin also create, change and delete Campaigns
    and Sources; nobody but shardops writes Shards; ClusterSources are nobody's in a namespace."""
    by_default_role: dict[str, set[tuple[str, str, str]]] = {"view": set(), "edit": set(), "admin": set()}
    for role in _aggregated(render(helm_bin)):
        for default_role, granted in by_default_role.items():
            if role["metadata"]["labels"].get(AGGREGATE + default_role) == "true":
                granted.update(grants(role["rules"]))
    view = {
        ("shardops.dev", r, v) for r in ("campaigns", "shards", "sources") for v in ("get", "list", "watch")
    }
    write = {
        ("shardops.dev", r, v)
        for r in ("campaigns", "sources")
        for v in ("create", "update", "patch", "delete", "deletecollection")
    } | {("shardops.dev", "sources", "use")}
    assert by_default_role == {"view": view, "edit": view | write, "admin": view | write}
    assert not _aggregated(render(helm_bin, "rbac.aggregateToDefaultRoles=false"))


def test_cluster_scoped_names_carry_the_release_namespace(helm_bin: Path) -> None:
    """Two releases of one name in two namespaces must not share a ClusterRole or a policy."""
    a = render(helm_bin, namespace="team-a")
    b = render(helm_bin, namespace="team-b")
    cluster_scoped = (
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    names_a = {(o["kind"], o["metadata"]["name"]) for o in a if o["kind"] in cluster_scoped}
    names_b = {(o["kind"], o["metadata"]["name"]) for o in b if o["kind"] in cluster_scoped}
    assert len(names_a) == 15 and not names_a & names_b
    assert all("-team-a-" in name for _, name in names_a)


def test_notes_say_what_to_run_next(helm_bin: Path) -> None:
    result = helm(
        helm_bin, "install", "rel", str(CHART), "--dry-run=client", "--namespace", "ops",
        "--set", "watch.namespaces={team-a}",
    )  # fmt: skip
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n ops rollout status deployment/rel-shardops-operator" in notes
    # A campaign to paste: the chart ships no sample files, and its worker is the chart's own image.
    assert "kubectl -n team-a apply -f - <<EOF" in notes
    pasted = yaml.safe_load(notes.split("<<EOF\n", 1)[1].split("  EOF", 1)[0])
    assert Campaign.parse(pasted).spec.items is not None
    assert pasted["spec"]["worker"]["image"] == f"ghcr.io/shardops/shardops:{CHART_META['appVersion']}"
    assert "helm uninstall keeps the CRDs and your Campaigns" in notes


# --- refused values -----------------------------------------------------------------------------


REFUSED_VALUES = [
    ("operator.replicas=0", "at '/operator/replicas': minimum: got 0, want 1"),
    ("operator.replica=3", "at '/operator': additional properties 'replica' not allowed"),
    ("watch.namespaces={Team_A}", "at '/watch/namespaces/0': 'Team_A' does not match pattern"),
    (
        "operator.securityContext.allowPrivilegeEscalation=true",
        "at '/operator/securityContext/allowPrivilegeEscalation': value must be false",
    ),
    (
        "operator.securityContext.readOnlyRootFilesystem=false",
        "at '/operator/securityContext/readOnlyRootFilesystem': value must be true",
    ),
    (
        "operator.podSecurityContext.runAsNonRoot=false",
        "at '/operator/podSecurityContext/runAsNonRoot': value must be true",
    ),
    (
        "operator.securityContext.capabilities.drop={NET_RAW}",
        "at '/operator/securityContext/capabilities/drop': no items match contains schema",
    ),
    ("image.digest=sha256:abc", "at '/image/digest': 'sha256:abc' does not match pattern"),
    ("operator.logLevel=loud", "at '/operator/logLevel': value must be one of 'debug', 'info'"),
    ("metrics.port=80", "at '/metrics/port': minimum: got 80, want 1,024"),
    (
        "operator.leaderElection.leaseDurationSeconds=10",
        "at '/operator/leaderElection/leaseDurationSeconds': minimum: got 10, want 11",
    ),
    (
        "admission.validationActions={Deny,Warn}",
        "at '/admission/validationActions/1': value must be one of 'Deny', 'Audit'",
    ),
    (
        "operator.leaderElection.enabled=false",
        "operator.replicas is 2 but operator.leaderElection.enabled is false",
    ),
    (
        "operator.podDisruptionBudget.minAvailable=2",
        "operator.podDisruptionBudget.minAvailable (2) must be less than operator.replicas (2)",
    ),
    (
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1",
    ),
    ("workers.metrics.port=80", "at '/workers/metrics/port': minimum: got 80, want 1,024"),
    ("workers.metrics.lingerSeconds=-1", "at '/workers/metrics/lingerSeconds': minimum: got -1, want 0"),
    (
        "workers.metrics.podMonitor.enabled=true",
        "workers.metrics.podMonitor.enabled needs worker pods that serve metrics: set workers.metrics",
    ),
    (
        "workers.metrics.enabled=true,workers.metrics.podMonitor.enabled=true",
        "workers.metrics.podMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1 PodM",
    ),
]


@pytest.mark.parametrize(("value", "message"), REFUSED_VALUES, ids=[v for v, _ in REFUSED_VALUES])
def test_bad_values_are_refused_with_a_message_naming_the_value(
    helm_bin: Path, value: str, message: str
) -> None:
    result = helm(helm_bin, "template", "rel", str(CHART), "--set", value, check=False)
    assert result.returncode != 0, f"{value} was accepted"
    assert message in result.stderr, result.stderr


def test_worker_namespaces_must_be_watched(helm_bin: Path) -> None:
    sets = ["--set", "watch.namespaces={a}", "--set", "workers.namespaces={b}"]
    result = helm(helm_bin, "template", "rel", str(CHART), *sets, check=False)
    assert result.returncode != 0
    assert 'workers.namespaces lists "b", which is not in watch.namespaces [a]' in result.stderr


# --- RBAC: the rules and their reasons ----------------------------------------------------------


def rules_of(objects: list[dict[str, Any]], name_part: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = only(objects, "ClusterRole", name_part)["rules"]
    return rules


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("template", ["rbac-operator.yaml", "rbac-worker.yaml"])
def test_every_rule_carries_its_reason(template: str) -> None:
    lines = (TEMPLATES / template).read_text().splitlines()
    rules = [n for n, line in enumerate(lines) if re.match(r"^\s+- apiGroups:", line)]
    assert rules
    for n in rules:
        assert lines[n - 1].strip().startswith("#"), f"{template}:{n + 1}: a rule without a reason above it"


def test_no_wildcards_anywhere_in_rbac(helm_bin: Path) -> None:
    for obj in render(helm_bin, "watch.namespaces={a}"):
        for rule in obj.get("rules", []):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{obj['metadata']['name']}: wildcard in {key}"


def test_worker_rules_are_exactly_what_the_runtime_uses(helm_bin: Path) -> None:
    """Each grant maps to a call in operator/shardops/worker/ or the k8s/ functions it uses."""
    worker = grants(rules_of(render(helm_bin), "-worker"))
    assert worker == {
        ("shardops.dev", "campaigns", "get"),  # runtime: read the campaign (a fresh look)
        *{("shardops.dev", "campaigns", v) for v in ("list", "watch")},  # worker.observed: watch it by name
        ("shardops.dev", "shards", "get"),  # claim: re-read before writing
        ("shardops.dev", "shards", "list"),  # claim: find a claimable shard
        ("shardops.dev", "shards", "watch"),  # worker.observed: watch the unfinished shards
        ("shardops.dev", "shards/status", "patch"),  # k8s.shards.apply_transition
        *{("coordination.k8s.io", "leases", v) for v in ("get", "create", "update", "patch")},  # k8s.leases
        *{("", "configmaps", v) for v in ("get", "create", "update", "patch")},  # k8s.results, itemsFrom
        # No Events: the operator counts the worker's transitions in the campaign's Event series.
    }


def test_operator_rules_are_exactly_what_the_operator_uses(helm_bin: Path) -> None:
    """Each grant maps to a call in operator/shardops/scheduler/ (kopf included) or its k8s/ functions."""
    operator = grants(rules_of(render(helm_bin), "-operator"))
    assert operator == {
        *{("shardops.dev", "campaigns", v) for v in ("get", "list", "watch", "patch", "delete")},
        ("shardops.dev", "campaigns/status", "patch"),
        *{("shardops.dev", "shards", v) for v in ("get", "list", "watch", "create", "delete")},
        ("shardops.dev", "shards/status", "patch"),
        # scheduler.sources: shares of each Source's and ClusterSource's limits, in their status
        *{("shardops.dev", r, v) for r in ("sources", "clustersources") for v in ("get", "list", "watch")},
        *{("shardops.dev", f"{r}/status", "patch") for r in ("sources", "clustersources")},
        *{("coordination.k8s.io", "leases", v) for v in ("get", "patch", "delete")},
        *{("batch", "jobs", v) for v in ("list", "create")},
        ("", "pods", "list"),
        *{("", "configmaps", v) for v in ("get", "create")},  # itemsFrom; store.finished (zombies)
        ("events.k8s.io", "events", "create"),  # k8s.events.record
        *{("events.k8s.io", "events", v) for v in ("get", "update")},  # k8s.events.EventSeries
        ("", "events", "list"),  # k8s.jobs.failed_creates: why a worker Job got no pod
        ("", "secrets", "get"),  # scheduler.stores.store_secret_problem, by name only (below)
        ("kueue.x-k8s.io", "localqueues", "get"),  # k8s.kueue.queue_state: does the queue exist
        ("kueue.x-k8s.io", "workloads", "list"),  # k8s.kueue.queue_state: why Kueue holds a Job
    }
    (secrets,) = [r for r in rules_of(render(helm_bin), "-operator") if "secrets" in r["resources"]]
    assert secrets["resourceNames"] == ["shardops-store"], "the namespace's store Secret, no other"


def test_worker_rules_apply_only_in_worker_namespaces(helm_bin: Path) -> None:
    objects = render(helm_bin, "workers.namespaces={team-a}")
    worker_role = only(objects, "ClusterRole", "-worker")["metadata"]["name"]
    cluster_bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert all(b["roleRef"]["name"] != worker_role for b in cluster_bindings)
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == worker_role]
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shardops-worker", "namespace": "team-a"}
    ]


def test_leader_election_is_limited_to_the_operator_lease(helm_bin: Path) -> None:
    role = only(render(helm_bin), "Role", "leader-election")
    assert role["metadata"]["namespace"] == "shardops-system"
    named, create = sorted(role["rules"], key=lambda r: "resourceNames" in r, reverse=True)
    assert named["resourceNames"] == ["rel-shardops-operator"]
    assert named["verbs"] == ["get", "update", "patch"]
    assert create == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}
