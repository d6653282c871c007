"""A namespace is the boundary of the S3 store (docs/security.md): workers get their namespace's
Secret and never the installation's keys, the operator reads items only from the campaign's
namespace's area, a store moved elsewhere brings its own credentials, and a namespace without its
store Secret is told so before any worker pod would fail on it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shardops.api import rules
from shardops.api.campaign import Campaign
from shardops.api.enums import ConditionReason
from shardops.api.items import ItemsObject
from shardops.api.store import DEFAULT_STORE_SECRET, S3Location, resolve_result_store
from shardops.k8s import campaigns
from shardops.k8s.api import EVENTS, JOBS, SECRETS
from shardops.scheduler import builders
from shardops.scheduler.settings import OperatorSettings
from shardops.store.items import object_items
from shardops.store.s3 import S3Store
from tests.fakes3 import FakeS3
from tests.schedulerkit import (
    NAMESPACE,
    Clock,
    OperatorKube,
    campaign,
    condition,
    put_campaign,
    reconciler,
    status_of,
)

ADMIN_KEY, ADMIN_SECRET = "ADMINKEY0001", "admin-secret-value"


def _s3_settings(monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    # The operator's own keys, in its environment as the chart maps them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ADMIN_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ADMIN_SECRET)
    return OperatorSettings(result_store="S3", s3_bucket="results", s3_endpoint="http://s3.local:8333")


def test_the_worker_job_gets_the_namespace_secret_and_never_the_installations_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _s3_settings(monkeypatch)
    location = resolve_result_store(None, settings.result_store_location())
    body = campaign()
    body["metadata"]["namespace"] = NAMESPACE
    camp = Campaign.parse({**body, "status": {"resultStore": location.to_dict()}})
    job = builders.worker_job_body(camp, camp.spec.worker, "sa", pod_defaults=settings.worker_pod_defaults())
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {
        v["name"]: v["valueFrom"]["secretKeyRef"]["name"]
        for v in env
        if "secretKeyRef" in v.get("valueFrom", {})
    }
    assert refs == {"AWS_ACCESS_KEY_ID": DEFAULT_STORE_SECRET, "AWS_SECRET_ACCESS_KEY": DEFAULT_STORE_SECRET}
    text = str(job)
    assert ADMIN_KEY not in text and ADMIN_SECRET not in text, "the operator's keys are never in a pod"


def test_items_outside_the_namespaces_area_are_refused_naming_where_they_must_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    location = resolve_result_store(None, _s3_settings(monkeypatch).result_store_location())
    s3 = S3Store(location, "team-b", client=FakeS3())
    for source in (
        ItemsObject(key="shardops/team-a/inputs/x.jsonl"),  # another namespace's area
        ItemsObject(key="inputs/x.jsonl"),  # the bucket root
        ItemsObject(key="shardops/team-b/inputs/x.jsonl", bucket="other-bucket"),  # another bucket
        ItemsObject(key="shardops/team-bx/inputs/x.jsonl"),  # a namespace whose name starts alike
    ):
        with pytest.raises(campaigns.ItemsUnavailable) as refused:
            object_items(source, s3)
        assert refused.value.reason is ConditionReason.ITEMS_OUTSIDE_NAMESPACE
        assert "spec.itemsFrom.object" in refused.value.message
        assert "s3://results/shardops/team-b/" in refused.value.message
    assert object_items(ItemsObject(key="shardops/team-b/inputs/x.jsonl"), s3) is not None


@pytest.mark.parametrize(
    "moved",
    [
        {"endpoint": "http://169.254.169.254"},
        {"bucket": "elsewhere"},
        {"region": "mars-1"},
        {"prefix": "shardops/team-a"},
    ],
)
def test_a_store_override_without_credentials_is_refused(moved: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="without credentials"):
        S3Location.model_validate(moved)
    assert S3Location.model_validate({**moved, "credentialsSecret": "team-keys"}).credentials_secret
    assert "credentialsSecret" in rules.STORE_OVERRIDE_NEEDS_CREDENTIALS.message


def test_a_namespace_without_its_store_secret_gets_a_condition_and_no_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube, clock = OperatorKube(), Clock()
    put_campaign(kube, campaign(items=[{"id": 0}]))
    operator = reconciler(kube, clock, provisioned=False, result_store="S3", s3_bucket="results")
    location = operator.settings.result_store_location()
    operator.stores.use(NAMESPACE, location, S3Store(location, NAMESPACE, client=FakeS3()))
    operator.reconcile(NAMESPACE, "camp")
    ready = condition(status_of(kube), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "StoreSecretMissing")
    assert f"kubectl -n {NAMESPACE} create secret generic {DEFAULT_STORE_SECRET}" in ready["message"]
    assert kube.list(JOBS, NAMESPACE) == [], "no worker pod that would fail on the missing Secret"
    assert any(e.get("reason") == "StoreSecretMissing" for e in kube.list(EVENTS, NAMESPACE))

    kube.put(SECRETS, NAMESPACE, {"metadata": {"name": DEFAULT_STORE_SECRET}, "data": {}})
    operator.reconcile(NAMESPACE, "camp")
    assert kube.list(JOBS, NAMESPACE), "with the Secret there, workers start"
    assert condition(status_of(kube), "Ready")["status"] == "True"
