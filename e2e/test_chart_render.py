"""The chart's renderings are accepted by a real API server, for the defaults and a matrix of other values.

`kubectl apply --dry-run=server` runs every object through the API server's decoding, validation
and admission (RBAC escalation checks, admission policy compilation, PodDisruptionBudget and
Deployment validation) without persisting anything, so the matrix leaves nothing behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from testbed.harness import Cluster
from testbed.kits import chart as chartkit

OTHER = f"e2e-render-{uuid.uuid4().hex[:8]}"
DIGEST = "sha256:" + "0123456789abcdef" * 4

MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    # The release namespace is a watched one here: a sandbox (workers.allowReleaseNamespace).
    "watch-list": {"watch": {"namespaces": ["{ns}", OTHER]}, "workers": {"allowReleaseNamespace": True}},
    "workers-in-some-watched": {
        "watch": {"namespaces": ["{ns}", OTHER]},
        "workers": {"namespaces": [OTHER], "allowReleaseNamespace": True},
    },
    "one-replica-no-election": {"operator": {"replicas": 1, "leaderElection": {"enabled": False}}},
    "three-replicas-percent-pdb": {
        "operator": {"replicas": 3, "podDisruptionBudget": {"minAvailable": "50%"}},
    },
    "private-registry-digest": {
        "image": {
            "repository": "registry.example.com/team/shardops",
            "digest": DIGEST,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": ["regcred", {"name": "mirror"}],
    },
    "scheduling-and-env": {
        "operator": {
            "logLevel": "debug",
            "extraEnv": [{"name": "SHARDOPS_TICK_SECONDS", "value": "2"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "podLabels": {"team": "ops"},
            "podAnnotations": {"example.com/owner": "ops"},
            "resources": {
                "requests": {"cpu": "50m", "memory": "96Mi"},
                "limits": {"cpu": 1, "memory": "1Gi"},
            },
            "terminationGracePeriodSeconds": 60,
            "leaderElection": {"leaseName": "shardops-lock", "leaseDurationSeconds": 30},
        },
    },
    "existing-service-accounts": {
        "operator": {"serviceAccount": {"create": False, "name": "ops-operator"}},
        "workers": {"serviceAccount": {"create": False, "name": "ops-worker"}},
    },
    "annotated-service-accounts": {
        "operator": {"serviceAccount": {"annotations": {"iam.example.com/role": "operator"}}},
        "workers": {
            "serviceAccount": {"name": "batch-runner", "annotations": {"iam.example.com/role": "llm"}}
        },
    },
    "without-rbac-and-admission": {"rbac": {"create": False}, "admission": {"enabled": False}},
    "admission-audit-only": {
        "admission": {
            "validationActions": ["Warn", "Audit"],
            "extraStateWriters": ["system:serviceaccount:ops:break-glass", "alice@example.com"],
        }
    },
    "metrics-nodeport": {
        "metrics": {"port": 9090, "service": {"type": "NodePort", "port": 9090, "annotations": {"a": "b"}}}
    },
    "no-metrics-service": {"metrics": {"service": {"enabled": False}}},
    "worker-metrics": {"workers": {"metrics": {"enabled": True, "port": 9100, "lingerSeconds": 45}}},
    "names-overridden": {"fullnameOverride": "so", "nameOverride": "campaigns"},
    "s3-with-retention": {
        "resultStore": {
            "type": "S3",
            "s3": {"endpoint": "http://s3.storage:8333", "bucket": "results", "credentialsSecret": "s3"},
            "retentionSeconds": 2592000,
        }
    },
}


def _fill(value: Any, namespace: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, namespace) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, namespace) for v in value]
    return value.replace("{ns}", namespace) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def other_namespace(cluster: Cluster) -> Iterator[str]:
    core = client.CoreV1Api(cluster.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=OTHER)))
    yield OTHER
    core.delete_namespace(OTHER, propagation_policy="Background")


def _dry_run(cluster: Cluster, objects: list[dict[str, Any]]) -> str:
    result = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--force-conflicts",
        "--field-manager=shardops-e2e-dry-run", "-f", "-",
        stdin=chartkit.dump_objects(objects), check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"the API server refused the rendering:\n{result.stderr}"
    return result.stdout


@pytest.mark.usefixtures("crds_installed", "other_namespace")
@pytest.mark.parametrize("case", list(MATRIX))
def test_rendering_is_accepted_by_the_api_server(cluster: Cluster, namespace: str, case: str) -> None:
    values = _fill(MATRIX[case], namespace)
    objects = chartkit.render(namespace, values, include_crds=case == "defaults", bin_dir=cluster.bin_dir)
    out = _dry_run(cluster, objects)
    # Every rendered object went through the server, none was dropped on the way.
    assert out.count("(server dry run)") == len(objects), out
    assert "deployment.apps/" in out


@pytest.mark.usefixtures("crds_installed")
def test_service_monitor_needs_the_prometheus_operator(cluster: Cluster, namespace: str) -> None:
    """Against this cluster (no monitoring.coreos.com), enabling it fails with what to do, not a 404."""
    if _has_service_monitors(cluster):
        pytest.skip("this cluster has the ServiceMonitor CRD")
    result = chartkit.helm(
        "install", "shardops", str(chartkit.CHART), "--namespace", namespace, "--dry-run=server",
        "--skip-crds", "--set", "metrics.serviceMonitor.enabled=true",
        bin_dir=cluster.bin_dir, env=cluster.env(), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        "metrics.serviceMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1"
        in result.stderr
    )


@pytest.mark.usefixtures("crds_installed")
def test_pod_monitor_needs_the_prometheus_operator(cluster: Cluster, namespace: str) -> None:
    """The worker PodMonitor, like the ServiceMonitor, is refused with what to do on a cluster without it."""
    if _has_crd(cluster, "podmonitors.monitoring.coreos.com"):
        pytest.skip("this cluster has the PodMonitor CRD")
    result = chartkit.helm(
        "install", "shardops", str(chartkit.CHART), "--namespace", namespace, "--dry-run=server",
        "--skip-crds", "--set", "workers.metrics.enabled=true",
        "--set", "workers.metrics.podMonitor.enabled=true",
        bin_dir=cluster.bin_dir, env=cluster.env(), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    wanted = "workers.metrics.podMonitor.enabled is true but this cluster has no monitoring.coreos.com/v1"
    assert f"{wanted} PodMonitor" in result.stderr


@pytest.mark.usefixtures("crds_installed")
def test_bad_values_are_refused_before_anything_reaches_the_cluster(cluster: Cluster, namespace: str) -> None:
    result = chartkit.helm(
        "install", "shardops", str(chartkit.CHART), "--namespace", namespace, "--skip-crds",
        "--set", "operator.replicas=0", "--set", "watch.namespaces={Not_A_Namespace}",
        bin_dir=cluster.bin_dir, env=cluster.env(), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "at '/operator/replicas': minimum: got 0, want 1" in result.stderr
    assert "at '/watch/namespaces/0': 'Not_A_Namespace' does not match pattern" in result.stderr
    assert "shardops" not in _releases(cluster, namespace)
    assert not cluster.kubectl("get", "deployments", "-n", namespace, "-o", "name").stdout.strip()


def _releases(cluster: Cluster, namespace: str) -> str:
    result = chartkit.helm("list", "-q", "--namespace", namespace, bin_dir=cluster.bin_dir, env=cluster.env())
    return result.stdout


def _has_service_monitors(cluster: Cluster) -> bool:
    return _has_crd(cluster, "servicemonitors.monitoring.coreos.com")


def _has_crd(cluster: Cluster, name: str) -> bool:
    result = cluster.kubectl("get", "crd", name, check=False)
    return result.returncode == 0


def test_the_result_retention_reaches_the_operator_as_its_setting(cluster: Cluster, namespace: str) -> None:
    from shardops.scheduler.settings import OperatorSettings

    def operator_env(values: dict[str, Any]) -> dict[str, str]:
        objects = chartkit.render(
            namespace, values, show_only=["templates/deployment.yaml"], bin_dir=cluster.bin_dir
        )
        (container,) = objects[0]["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in container["env"] if "value" in e}

    assert "SHARDOPS_RESULT_RETENTION_SECONDS" not in operator_env({}), "unset: kept until purged"
    env = operator_env(_fill(MATRIX["s3-with-retention"], namespace))
    # 30 days as an integer, not helm's float rendering of a large number (2.592e+06).
    assert env["SHARDOPS_RESULT_RETENTION_SECONDS"] == "2592000"
    settings = OperatorSettings.model_validate(
        {k.removeprefix("SHARDOPS_").lower(): v for k, v in env.items()}
    )
    assert settings.result_retention_seconds == 2592000
