"""The chart's RBAC is least privilege and its admission policies keep shard state in shardops' hands.

The chart's ServiceAccounts, RBAC and admission policies are rendered by helm and applied as they
are (without the operator Deployment, so nothing else writes the objects these tests write). Every
identity is real: a token of the ServiceAccount from the TokenRequest API, as its pods get one.
Each refusal is paired with an allowed request of the same identity, so a refusal cannot come
from a broken token or from a policy that refuses everything.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from testbed.harness import Cluster, dump_json, wait_for
from testbed.kits import chart as chartkit

from shardops.api import rules
from shardops.api.campaign import Budget

FORBIDDEN = 403


def _campaign(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": [{"n": 1}, {"n": 2}],
            "suspend": True,
            "worker": {"image": "shardops:dev", "command": ["true"]},
        },
    }


def _shard(name: str, campaign: str) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Shard",
        "metadata": {"name": name, "labels": {"shardops.dev/campaign": campaign}},
        "spec": {"campaign": campaign, "index": 0, "items": [{"n": 1}], "idempotencyKey": "sha256-e2e"},
    }


def _status(phase: str) -> dict[str, Any]:
    return {"status": {"phase": phase, "attempt": 1}}


@dataclass
class Policies:
    """The chart's RBAC and admission policies, applied once for a release in `namespace`.

    Tests share it, so each works on objects of its own (`new_campaign`) and leaves the rest alone.
    """

    cluster: Cluster
    namespace: str
    other_namespace: str
    tmp: Path
    identities: dict[str, Path] = field(default_factory=dict)

    def identity(self, service_account: str) -> Path:
        """A kubeconfig of that ServiceAccount of the release namespace."""
        if service_account not in self.identities:
            path = self.tmp / f"{service_account}.kubeconfig"
            self.identities[service_account] = chartkit.token_kubeconfig(
                self.cluster, self.namespace, service_account, path
            )
        return self.identities[service_account]

    def new_campaign(self, namespace: str | None = None) -> tuple[str, str]:
        """A fresh suspended Campaign and one Shard of it, created by the admin: (campaign, shard)."""
        campaign = f"c-{uuid.uuid4().hex[:8]}"
        shard = f"{campaign}-00000"
        for obj in (_campaign(campaign), _shard(shard, campaign)):
            self.cluster.kubectl("create", "-n", namespace or self.namespace, "-f", "-", stdin=dump_json(obj))
        return campaign, shard

    def admin_patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        dry_run: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """kubectl patch --type=merge as the cluster admin; never raises."""
        args = [
            "patch",
            kind,
            name,
            "-n",
            namespace or self.namespace,
            "--type=merge",
            "-p",
            json.dumps(patch),
        ]
        args += ["--subresource=status"] if status else []
        args += ["--dry-run=server"] if dry_run else []
        return self.cluster.kubectl(*args, check=False)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        text = self.cluster.kubectl("get", kind, name, "-n", namespace or self.namespace, "-o", "json").stdout
        obj: dict[str, Any] = json.loads(text)
        return obj

    def phase(self, shard: str, namespace: str | None = None) -> str | None:
        phase: str | None = (self.get("shard", shard, namespace).get("status") or {}).get("phase")
        return phase


def _create_namespace(core: client.CoreV1Api, name: str) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Published by the root-ca-certificate-publisher controller; the secrets test reads it.
    wait_for(
        f"kube-root-ca.crt in {name}",
        lambda: core.list_namespaced_config_map(name, field_selector="metadata.name=kube-root-ca.crt").items,
    )


@pytest.fixture(scope="module")
def policies(
    cluster: Cluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Policies]:
    suffix = uuid.uuid4().hex[:8]
    namespace, other = f"e2e-policy-{suffix}", f"e2e-other-{suffix}"
    core = client.CoreV1Api(cluster.api)
    templates = [chartkit.SERVICE_ACCOUNTS, chartkit.RBAC_OPERATOR, chartkit.RBAC_WORKER, chartkit.ADMISSION]
    objects = chartkit.render(
        namespace, chartkit.local_values(namespace), show_only=templates, bin_dir=cluster.bin_dir
    )
    try:
        for name in (namespace, other):
            _create_namespace(core, name)
        chartkit.apply_objects(cluster, objects)
        state = Policies(cluster, namespace, other, tmp_path_factory.mktemp("identities"))
        _, probe = state.new_campaign()
        # A new policy reaches the API server's admission cache a moment after it is created:
        # wait until it refuses a (dry-run) status patch by the admin before testing anything.
        wait_for(
            "the shard-state admission policy to be enforced",
            lambda: (
                "ValidatingAdmissionPolicy"
                in state.admin_patch("shard", probe, _status("Done"), status=True, dry_run=True).stderr
            ),
            timeout=30,
        )
        yield state
    finally:
        chartkit.delete_cluster_scoped(cluster, objects)
        for name in (namespace, other):
            core.delete_namespace(name, propagation_policy="Background")


def _refused_by_rbac(result: tuple[int, str], verb: str, resource: str) -> None:
    code, message = result
    assert code == FORBIDDEN, f"expected RBAC to refuse {verb} {resource}, got {code}: {message}"
    assert f'cannot {verb} resource "{resource}"' in message, message


def _kubectl_refused_by_rbac(result: subprocess.CompletedProcess[str], verb: str, resource: str) -> None:
    assert result.returncode != 0, f"expected RBAC to refuse {verb} {resource}, got:\n{result.stdout}"
    assert "(Forbidden)" in result.stderr and f'cannot {verb} resource "{resource}"' in result.stderr, (
        result.stderr
    )


# --- admission: shard state ---------------------------------------------------------------------


def test_admin_status_patch_is_refused_with_the_shardops_action_to_use(policies: Policies) -> None:
    ns = policies.namespace
    campaign, shard = policies.new_campaign()
    result = policies.admin_patch("shard", shard, _status("Done"), status=True)
    assert result.returncode != 0, "a cluster admin changed shard status past the policy"
    assert "-shard-state' with binding" in result.stderr, result.stderr
    assert f"shard {shard}: its status is written only by shardops" in result.stderr, result.stderr
    assert f"kubectl campaign retry {campaign} -n {ns}" in result.stderr, result.stderr
    assert f"kubectl campaign suspend|resume {campaign} -n {ns}" in result.stderr, result.stderr
    assert policies.phase(shard) is None


def test_operator_and_worker_service_accounts_write_shard_status(policies: Policies) -> None:
    _, shard = policies.new_campaign()
    for account, phase in (
        (chartkit.operator_service_account(), "Pending"),
        (chartkit.worker_service_account(), "Running"),
    ):
        identity = policies.identity(account)
        code, message = chartkit.patch_as(
            identity, policies.namespace, "shards", shard, _status(phase), status=True
        )
        assert code == 200, f"{account} could not write shard status: {code} {message}"
        assert policies.phase(shard) == phase


def test_policy_applies_only_in_the_watched_namespaces(policies: Policies) -> None:
    """A release watching some namespaces does not judge shards elsewhere (another release may)."""
    other = policies.other_namespace
    _, shard = policies.new_campaign(other)
    result = policies.admin_patch("shard", shard, _status("Pending"), namespace=other, status=True)
    assert result.returncode == 0, result.stderr
    assert policies.phase(shard, other) == "Pending"


def test_shard_spec_is_not_edited_by_hand_but_labels_are(policies: Policies) -> None:
    _, shard = policies.new_campaign()
    spec_edit = policies.admin_patch("shard", shard, {"spec": {"priority": 5}})
    assert spec_edit.returncode != 0, "a cluster admin edited a shard's spec past the policy"
    assert f"shard {shard}: its spec is written once by the shardops operator" in spec_edit.stderr, (
        spec_edit.stderr
    )
    assert policies.get("shard", shard)["spec"]["priority"] == 0
    label = policies.admin_patch("shard", shard, {"metadata": {"labels": {"team": "e2e"}}})
    assert label.returncode == 0, label.stderr
    assert policies.get("shard", shard)["metadata"]["labels"]["team"] == "e2e"


# --- admission: campaign inputs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"items": [{"n": 1}, {"n": 3}]}}, "spec.items cannot change after the campaign is created"),
        ({"spec": {"shardSize": 1}}, "spec.shardSize cannot change after the campaign is created"),
        (
            {"spec": {"items": None, "itemsFrom": {"configMapName": "work-items", "key": "items.jsonl"}}},
            "spec.items cannot change after the campaign is created",
        ),
    ],
    ids=["items", "shardSize", "items-to-itemsFrom"],
)
def test_campaign_inputs_cannot_change_after_creation(
    policies: Policies, patch: dict[str, Any], message: str
) -> None:
    campaign, _ = policies.new_campaign()
    before = policies.get("campaign", campaign)["spec"]
    result = policies.admin_patch("campaign", campaign, patch)
    assert result.returncode != 0, f"{patch} was accepted"
    # The CRD's transition rules answer before the policy is asked (schema validation runs first),
    # in the same words; the policy only speaks where the CRDs predate those rules.
    assert message in result.stderr, result.stderr
    assert policies.get("campaign", campaign)["spec"] == before


def test_campaign_settings_other_than_inputs_still_change(policies: Policies) -> None:
    campaign, _ = policies.new_campaign()
    patch = {"spec": {"maxConcurrency": 2, "suspend": False, "retry": {"generation": 1}}}
    result = policies.admin_patch("campaign", campaign, patch)
    assert result.returncode == 0, result.stderr
    spec = policies.get("campaign", campaign)["spec"]
    assert (spec["maxConcurrency"], spec["suspend"], spec["retry"]["generation"]) == (2, False, 1)


# --- admission: amounts -------------------------------------------------------------------------


def _create_with_budget(
    policies: Policies, budget: dict[str, Any], *, dry_run: bool = False
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`kubectl create` of a fresh Campaign with that budget, as the admin; never raises."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    campaign = _campaign(name)
    campaign["spec"]["budget"] = budget
    args = ["create", "-n", policies.namespace, "-f", "-", *(["--dry-run=server"] if dry_run else [])]
    return name, policies.cluster.kubectl(*args, stdin=dump_json(campaign), check=False)


OVER_LIMIT = [rules.BUDGET_PER_SHARD_WITHIN_LIMIT]


@pytest.mark.parametrize(
    ("budget", "said"),
    [
        # The CRD alone (value checks of an untyped field, by the value's kind).
        ({"limit": "abc"}, ["spec.budget.limit", "should match"]),
        ({"limit": -1}, ["spec.budget.limit", "should be greater than or equal to 0"]),
        ({"limit": 5, "maxPerShard": "-0.5"}, ["spec.budget.maxPerShard", "should match"]),
        # The chart's campaign-budget policy: numbers, strings, and one of each.
        ({"limit": 10, "maxPerShard": 20}, [*OVER_LIMIT, "(maxPerShard 20, limit 10)"]),
        ({"limit": "0.5", "maxPerShard": "0.6"}, [*OVER_LIMIT, "(maxPerShard 0.6, limit 0.5)"]),
        ({"limit": "0.5", "maxPerShard": 0.6}, [*OVER_LIMIT, "(maxPerShard 0.6, limit 0.5)"]),
    ],
    ids=["word", "negative", "negative-string", "over-numbers", "over-strings", "over-mixed"],
)
def test_a_bad_amount_is_refused_at_admission_naming_the_field_and_the_fix(
    policies: Policies, budget: dict[str, Any], said: list[str]
) -> None:
    # A new policy reaches the API server's admission cache a moment after it is created.
    wait_for(
        "the campaign-budget admission policy to be enforced",
        lambda: (
            "-campaign-budget' with binding"
            in _create_with_budget(policies, {"limit": 1, "maxPerShard": 2}, dry_run=True)[1].stderr
        ),
        timeout=30,
    )
    name, result = _create_with_budget(policies, budget)
    assert result.returncode != 0, f"{budget} was admitted"
    for text in said:
        assert text in result.stderr, result.stderr
    assert policies.cluster.kubectl("get", "campaign", name, "-n", policies.namespace, check=False).returncode


@pytest.mark.parametrize(
    "budget",
    [
        {"limit": 5},
        {"limit": 0.5},
        {"limit": "0.5"},
        {"limit": "0.5", "maxPerShard": 0.5},
        {"limit": 1, "maxPerShard": "0.3"},
        {"limit": "2.5e1", "maxPerShard": 20},
    ],
    ids=["integer", "number", "string", "equal-mixed", "under-mixed", "exponent"],
)
def test_a_good_amount_is_admitted_as_written(policies: Policies, budget: dict[str, Any]) -> None:
    name, result = _create_with_budget(policies, budget)
    assert result.returncode == 0, result.stderr
    stored = policies.get("campaign", name)["spec"]["budget"]
    assert {key: stored[key] for key in budget} == budget


def test_a_budget_change_is_judged_and_other_edits_pass(policies: Policies) -> None:
    name, created = _create_with_budget(policies, {"limit": 10, "maxPerShard": 5})
    assert created.returncode == 0, created.stderr
    raised = policies.admin_patch("campaign", name, {"spec": {"budget": {"maxPerShard": 20}}})
    assert raised.returncode != 0 and rules.BUDGET_PER_SHARD_WITHIN_LIMIT in raised.stderr, raised.stderr
    relabelled = policies.admin_patch("campaign", name, {"metadata": {"labels": {"team": "a"}}})
    assert relabelled.returncode == 0, relabelled.stderr
    assert policies.get("campaign", name)["spec"]["budget"]["maxPerShard"] == 5


def test_amounts_closer_than_a_double_pass_to_the_operator(policies: Policies) -> None:
    """The policy compares doubles: 0.30000000000000001 over 0.3 is one double, so it is admitted
    (never a valid budget refused); the model, exact, refuses it and the operator reports InvalidSpec."""
    budget = {"limit": 0.3, "maxPerShard": "0.30000000000000001"}
    _, result = _create_with_budget(policies, budget)
    assert result.returncode == 0, result.stderr
    with pytest.raises(ValueError, match=re.escape(rules.BUDGET_PER_SHARD_WITHIN_LIMIT)):
        Budget.model_validate(budget)


# --- RBAC: least privilege ----------------------------------------------------------------------


def test_worker_cannot_patch_a_campaign_but_can_read_it(policies: Policies) -> None:
    worker = policies.identity(chartkit.worker_service_account())
    ns = policies.namespace
    campaign, _ = policies.new_campaign()
    read = chartkit.kubectl_as(policies.cluster, worker, "get", "campaign", campaign, "-n", ns)
    assert read.returncode == 0, read.stderr
    spec = chartkit.patch_as(worker, ns, "campaigns", campaign, {"spec": {"maxConcurrency": 1}})
    _refused_by_rbac(spec, "patch", "campaigns")
    status = chartkit.patch_as(
        worker, ns, "campaigns", campaign, {"status": {"phase": "Succeeded"}}, status=True
    )
    _refused_by_rbac(status, "patch", "campaigns/status")
    assert policies.get("campaign", campaign)["spec"]["maxConcurrency"] == 6


def test_worker_cannot_touch_shards_of_another_namespace(policies: Policies) -> None:
    worker = policies.identity(chartkit.worker_service_account())
    cluster = policies.cluster
    other = policies.other_namespace
    _, own_shard = policies.new_campaign()
    _, shard = policies.new_campaign(other)
    own = chartkit.kubectl_as(cluster, worker, "get", "shards", "-n", policies.namespace)
    assert own.returncode == 0 and own_shard in own.stdout, own.stderr
    listed = chartkit.kubectl_as(cluster, worker, "get", "shards", "-n", other)
    _kubectl_refused_by_rbac(listed, "list", "shards")
    got = chartkit.kubectl_as(cluster, worker, "get", "shard", shard, "-n", other)
    _kubectl_refused_by_rbac(got, "get", "shards")
    patched = chartkit.patch_as(worker, other, "shards", shard, _status("Done"), status=True)
    _refused_by_rbac(patched, "patch", "shards/status")
    assert policies.phase(shard, other) is None


@pytest.mark.parametrize("account", ["worker", "operator"])
def test_shardops_accounts_cannot_read_secrets(policies: Policies, account: str) -> None:
    name = chartkit.worker_service_account() if account == "worker" else chartkit.operator_service_account()
    identity = policies.identity(name)
    cluster = policies.cluster
    ns = policies.namespace
    secret = f"api-key-{account}"
    cluster.kubectl("create", "secret", "generic", secret, "-n", ns, "--from-literal=key=s3cr3t")
    # Both read ConfigMaps (items, results): the same kind of read is refused only for Secrets.
    configmap = chartkit.kubectl_as(cluster, identity, "get", "configmap", "kube-root-ca.crt", "-n", ns)
    assert configmap.returncode == 0, configmap.stderr
    listed = chartkit.kubectl_as(cluster, identity, "get", "secrets", "-n", ns)
    _kubectl_refused_by_rbac(listed, "list", "secrets")
    got = chartkit.kubectl_as(cluster, identity, "get", "secret", secret, "-n", ns, "-o", "yaml")
    _kubectl_refused_by_rbac(got, "get", "secrets")
    assert "s3cr3t" not in got.stdout


def test_operator_is_confined_to_the_watched_namespaces(policies: Policies) -> None:
    operator = policies.identity(chartkit.operator_service_account())
    cluster = policies.cluster
    campaign, _ = policies.new_campaign()
    own = chartkit.kubectl_as(cluster, operator, "get", "campaigns,shards", "-n", policies.namespace)
    assert own.returncode == 0 and campaign in own.stdout, own.stderr
    other = chartkit.kubectl_as(cluster, operator, "get", "campaigns", "-n", policies.other_namespace)
    _kubectl_refused_by_rbac(other, "list", "campaigns")
    everywhere = chartkit.kubectl_as(cluster, operator, "get", "shards", "--all-namespaces")
    _kubectl_refused_by_rbac(everywhere, "list", "shards")
