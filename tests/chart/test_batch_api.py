"""The chart's optional Batch API service (batchAPI): off by default; when on, its Deployment runs
`shardops batch-api` with settings it loads, its RBAC is the reviews plus campaigns in the watched
namespaces, and values it cannot run with are refused naming the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.chart.test_chart import CHART, helm, render

ON = (
    "batchAPI.enabled=true",
    "batchAPI.sourceRef.name=team-llm",
    "resultStore.type=S3",
    "resultStore.s3.bucket=results",
    "resultStore.s3.credentialsSecret=admin-s3",
)


def _batch_api(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if "batch-api" in o["metadata"]["name"]]


def _container(objects: list[dict[str, Any]], name_part: str) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and name_part in o["metadata"]["name"]]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_off_by_default(helm_bin: Path) -> None:
    assert _batch_api(render(helm_bin)) == []


def test_the_service_starts_with_what_the_chart_renders(
    helm_bin: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardops.batchapi.main import BatchApiSettings
    from shardops.main import build_parser

    objects = render(helm_bin, *ON)
    assert sorted(o["kind"] for o in _batch_api(objects)) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    container = _container(objects, "batch-api")
    assert build_parser().parse_args(container["command"][1:]).run is not None
    for name in [n for n in os.environ if n.startswith(("SHARDOPS_", "AWS_"))]:
        monkeypatch.delenv(name)
    for entry in container["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", "filled-by-kubelet"))
    settings = BatchApiSettings()
    assert (str(settings.batch_api_source_kind), settings.batch_api_source_name) == (
        "ClusterSource",
        "team-llm",
    )
    assert settings.result_store_location().bucket == "results"
    assert settings.batch_api_worker_image.startswith("ghcr.io/shardops/shardops:")
    # The installation's store settings and keys, from the one template both processes use.
    store = [
        e for e in container["env"] if e["name"].startswith(("SHARDOPS_S3_", "SHARDOPS_RESULT_STORE", "AWS_"))
    ]
    operator = _container(objects, "-operator")
    assert all(entry in operator["env"] for entry in store) and len(store) == 5
    pod = next(o for o in objects if o["kind"] == "Deployment" and "batch-api" in o["metadata"]["name"])
    assert pod["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_rbac_is_the_reviews_and_campaigns_of_the_watched_namespaces_only(helm_bin: Path) -> None:
    objects = _batch_api(render(helm_bin, *ON, "watch.namespaces={team-a,team-b}"))
    reviews = next(
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-reviews")
    )
    assert {(r["resources"][0], tuple(r["verbs"])) for r in reviews["rules"]} == {
        ("tokenreviews", ("create",)),
        ("subjectaccessreviews", ("create",)),
        ("clustersources", ("use",)),
    }
    assert next(r for r in reviews["rules"] if r["resources"] == ["clustersources"])["resourceNames"] == [
        "team-llm"
    ]
    namespaced = next(
        o for o in objects if o["kind"] == "ClusterRole" and not o["metadata"]["name"].endswith("-reviews")
    )
    assert {r["resources"][0]: r["verbs"] for r in namespaced["rules"]} == {
        "campaigns": ["get", "list", "create", "patch"],
        "shards": ["list"],
    }
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    (cluster_binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"].endswith("-reviews")


def test_a_namespaced_source_is_used_through_the_namespace_bindings(helm_bin: Path) -> None:
    objects = _batch_api(render(helm_bin, *ON, "batchAPI.sourceRef.kind=Source"))
    namespaced = next(
        o for o in objects if o["kind"] == "ClusterRole" and not o["metadata"]["name"].endswith("-reviews")
    )
    assert {
        "apiGroups": ["shardops.dev"],
        "resources": ["sources"],
        "resourceNames": ["team-llm"],
        "verbs": ["use"],
    } in (namespaced["rules"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("batchAPI.enabled=true",), "set batchAPI.sourceRef.name"),
        (("batchAPI.enabled=true", "batchAPI.sourceRef.name=team-llm"), "set resultStore.type=S3"),
        ((*ON[:2], "resultStore.s3.bucket=results"), "set resultStore.type=S3 and resultStore.s3.bucket"),
        ((*ON, "batchAPI.sourceRef.kind=Cluster"), "at '/batchAPI/sourceRef/kind'"),
    ],
)
def test_values_it_cannot_run_with_are_refused(helm_bin: Path, sets: tuple[str, ...], message: str) -> None:
    args = ["template", "rel", str(CHART)]
    for value in sets:
        args += ["--set", value]
    result = helm(helm_bin, *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_notes_give_the_base_url_and_how_to_get_a_token(helm_bin: Path) -> None:
    sets = [arg for value in ON for arg in ("--set", value)]
    result = helm(helm_bin, "install", "rel", str(CHART), "--dry-run=client", "--namespace", "ops", *sets)
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "http://rel-shardops-batch-api.ops.svc/v1" in notes
    assert "kubectl -n NS create token SERVICE-ACCOUNT" in notes


def test_the_documented_helm_command_turns_it_on(helm_bin: Path) -> None:
    """docs/openai-batch.md's `helm upgrade ... --set` values, over an installation with the S3
    store (what --reuse-values keeps), render the service through the ClusterSource it names."""
    import shlex

    doc = (CHART.parents[1] / "docs" / "openai-batch.md").read_text(encoding="utf-8")
    block = doc.split("### Turning it on", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " ").removeprefix("$ "))
    assert words[:2] == ["helm", "upgrade"] and "--reuse-values" in words
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    objects = render(helm_bin, *ON[2:], *sets)
    container = _container(objects, "batch-api")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["SHARDOPS_BATCH_API_SOURCE_KIND"], env["SHARDOPS_BATCH_API_SOURCE_NAME"]) == (
        "ClusterSource",
        "team-llm",
    )
