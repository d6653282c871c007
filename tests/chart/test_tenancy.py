"""The chart keeps tenants apart: workers never beside the operator, Campaign references checked
against their author, worker writes narrowed to their own campaign (docs/security.md).

Rendering only; e2e/test_tenancy_admission.py sends the same policies to a real API server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.test_chart import CHART, ROOT, helm, only, render

CAMPAIGN_CRD: dict[str, Any] = yaml.safe_load((ROOT / "crds" / "shardops.dev_campaigns.yaml").read_text())


def fails(helm_bin: Path, *sets: str) -> str:
    args = ["template", "rel", str(CHART), "--namespace", "shardops-system"]
    for value in sets:
        args += ["--set", value]
    result = helm(helm_bin, *args, check=False)
    assert result.returncode != 0, f"{sets} was accepted"
    return result.stderr


# --- workers never in the release namespace -----------------------------------------------------


def test_watching_the_release_namespace_is_refused_with_the_fix(helm_bin: Path) -> None:
    stderr = fails(helm_bin, "watch.namespaces={team-a,shardops-system}")
    assert 'watch.namespaces lists "shardops-system", the release namespace' in stderr
    assert "could then take" in stderr and "workers.allowReleaseNamespace=true" in stderr


def test_workers_in_the_release_namespace_are_refused(helm_bin: Path) -> None:
    stderr = fails(helm_bin, "workers.namespaces={shardops-system}")
    assert 'workers.namespaces lists "shardops-system", the release namespace' in stderr


def test_watching_every_namespace_puts_no_worker_in_the_release_namespace(helm_bin: Path) -> None:
    objects = render(helm_bin)
    workers = [
        o
        for o in objects
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "worker"
    ]
    assert [o["kind"] for o in workers] == ["ClusterRole"], "a worker account or binding by default"
    env = {e["name"] for e in only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "SHARDOPS_ALLOW_CAMPAIGNS_IN_OPERATOR_NAMESPACE" not in env


def test_a_sandbox_may_allow_the_release_namespace(helm_bin: Path) -> None:
    objects = render(helm_bin, "watch.namespaces={shardops-system}", "workers.allowReleaseNamespace=true")
    accounts = [
        o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "shardops-worker"
    ]
    assert [a["metadata"]["namespace"] for a in accounts] == ["shardops-system"]
    env = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "SHARDOPS_ALLOW_CAMPAIGNS_IN_OPERATOR_NAMESPACE", "value": "true"} in env


# --- campaign references ------------------------------------------------------------------------


def fields_named(schema: dict[str, Any], path: str, wanted: tuple[str, ...]) -> Iterator[str]:
    """JSON paths (`[]` for list items) of the properties whose name ends with one of `wanted`."""
    for name, sub in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        if name.endswith(wanted):
            yield here
        yield from fields_named(sub, here, wanted)
    if "items" in schema:
        yield from fields_named(schema["items"], f"{path}[]", wanted)


def reference_policy(helm_bin: Path) -> str:
    policy = only(
        render(helm_bin, "workers.namespaces={team-a}"), "ValidatingAdmissionPolicy", "campaign-references"
    )
    return "\n".join(v["expression"] for v in [*policy["spec"]["variables"], *policy["spec"]["validations"]])


@pytest.mark.parametrize("wanted", [("Secret",), ("serviceAccountName",)])
def test_every_reference_the_crd_holds_is_checked(helm_bin: Path, wanted: tuple[str, ...]) -> None:
    """A new Secret or ServiceAccount field in the API must reach the policy, or it is a way around it."""
    expressions = reference_policy(helm_bin)
    spec = CAMPAIGN_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found = list(fields_named(spec, "object.spec", wanted))
    assert len(found) >= 2
    for path in found:
        if "[]" in path:
            # object.spec.worker.llm.sources[].apiKeySecret -> ...sources.filter(s, has(s.apiKeySecret))
            listed, field = path.split("[].")
            assert f"{listed}.filter(s, has(s.{field}))" in expressions, path
        else:
            assert path in expressions, path
        assert path.replace("object.", "oldObject.", 1).split("[]")[0] in expressions, path


def test_references_ask_the_authorizer_for_the_named_permission(helm_bin: Path) -> None:
    expressions = reference_policy(helm_bin)
    where = "authorizer.group('').resource('{}').namespace(request.namespace)"
    for key in ("storeSecret", "workerKey", "finalizeKey"):
        assert where.format("secrets") + f".name(variables.{key}).check('get')" in expressions
    for key in ("workerSourceKeys", "finalizeSourceKeys"):
        assert f"variables.{key}.all(n, " + where.format("secrets") + ".name(n).check('get')" in expressions
    for key in ("workerAccount", "finalizeAccount"):
        assert where.format("serviceaccounts") + f".name(variables.{key}).check('impersonate')" in expressions
        # The chart's own worker account is what an unset serviceAccountName gets: naming it is no escalation.
        assert f'variables.{key} == "shardops-worker"' in expressions
    assert where.format("configmaps") + ".name(variables.itemsConfigMap).check('get')" in expressions
    shardops = "authorizer.group('shardops.dev')"
    in_namespace = f"{shardops}.resource('sources').namespace(request.namespace)"
    assert f"{in_namespace}.name(r.name).check('use')" in expressions
    assert f"{shardops}.resource('clustersources').name(r.name).check('use')" in expressions
    assert "object.spec.sources.filter(s, has(s.sourceRef))" in expressions


# --- worker writes ------------------------------------------------------------------------------


def test_worker_writes_judge_only_pod_bound_worker_identities(helm_bin: Path) -> None:
    objects = render(helm_bin, "watch.namespaces={team-a,team-b}")
    policy = only(objects, "ValidatingAdmissionPolicy", "worker-writes")
    (condition,) = policy["spec"]["matchConditions"]
    assert '"^system:serviceaccount:(team-a|team-b):shardops-worker$"' in condition["expression"]
    assert "'authentication.kubernetes.io/pod-name' in request.userInfo.extra" in condition["expression"]
    rules = {
        (r["apiGroups"][0], tuple(r["resources"]))
        for r in policy["spec"]["matchConstraints"]["resourceRules"]
    }
    assert rules == {
        ("coordination.k8s.io", ("leases",)),
        ("", ("configmaps",)),
        ("shardops.dev", ("shards", "shards/status")),
    }
    binding = only(objects, "ValidatingAdmissionPolicyBinding", "worker-writes")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == ["team-a", "team-b"]


def test_worker_writes_know_the_result_store_names() -> None:
    """The policy's ConfigMap prefixes are the store's (store/configmap.py)."""
    from shardops.store.configmap import PREFIXES

    text = (CHART / "templates" / "admission-policies.yaml").read_text()
    assert f"[{', '.join(repr(p) for p in PREFIXES)}]" in text


def test_worker_writes_know_the_operator_names() -> None:
    """The policy tells a campaign's pods and claims by the names the operator gives them."""
    from shardops.scheduler.builders import worker_job_name
    from shardops.state.shardview import finalize_name, shard_name

    text = (CHART / "templates" / "admission-policies.yaml").read_text()
    assert worker_job_name("camp", 12) == "camp-worker-12"
    assert "variables.pod.startsWith(variables.campaign + '-worker-')" in text
    assert "substring(size(variables.campaign) + 8)" in text  # len("-worker-")
    assert shard_name("camp", 7) == "camp-00007" and finalize_name("camp") == "camp-finalize"
    assert "'^([0-9]{5,}|finalize)$'" in text


def test_notes_of_a_default_install_ask_for_a_team_namespace(helm_bin: Path) -> None:
    result = helm(helm_bin, "install", "rel", str(CHART), "--dry-run=client", "--namespace", "ops")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "workers:   none yet: list the teams' namespaces in workers.namespaces (never ops" in notes
    assert "kubectl -n team-a apply -f crds/samples/campaign-minimal.yaml" in notes
    assert "kubectl -n ops apply" not in notes
