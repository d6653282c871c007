"""A namespace is the boundary of the S3 result store (docs/security.md, "The result store"): one chart
installation on the real API server and the real SeaweedFS, two tenant namespaces and a hostile
one, each provisioned as an administrator adds a namespace (testbed.tenants.provision_namespace: keys
that reach only `<bucket>/<prefix>/<namespace>/`). The installation's keys stay with the operator.

* the hostile tenant's command tries to list, read, write and delete another namespace's objects and
  the bucket root's, and reads its own environment: every attempt is AccessDenied, no installation
  key is in it, and its own area still works;
* itemsFrom.object naming another namespace's object: Ready=False ItemsOutsideNamespace;
* a store override without credentials: refused at admission;
* a namespace added with `helm upgrade` as the chart's NOTES say: StoreSecretMissing (no worker pod)
  until its Secret exists, then examples/campaign-inline.yaml runs to Succeeded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from testbed.cluster import lifecycle
from testbed.harness import REPO_ROOT, Cluster, create_namespace, dump_json, wait_for
from testbed.kits import chart as chartkit

from testbed import tenants

# The hostile command: every S3 call it can think of outside its own area, with the keys it finds in
# its environment (the default chain), and its environment itself; one finding per attempt.
ATTACK = r"""
import json, os
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

env = os.environ
s3 = boto3.client("s3", endpoint_url=env["TARGET_ENDPOINT"], region_name=env["TARGET_REGION"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
bucket, other, root, own = env["TARGET_BUCKET"], env["TARGET_OTHER"], env["TARGET_ROOT"], env["TARGET_OWN"]
climb = own + "../" + env["TARGET_OTHER_NS"] + "/data.jsonl"
attempts = {
    "list other": lambda: s3.list_objects_v2(Bucket=bucket, Prefix=other),
    "read other": lambda: s3.get_object(Bucket=bucket, Key=other + "data.jsonl"),
    "write other": lambda: s3.put_object(Bucket=bucket, Key=other + "planted", Body=b"x"),
    "delete other": lambda: s3.delete_object(Bucket=bucket, Key=other + "data.jsonl"),
    "list root": lambda: s3.list_objects_v2(Bucket=bucket),
    "read root": lambda: s3.get_object(Bucket=bucket, Key=root),
    "write root": lambda: s3.put_object(Bucket=bucket, Key="planted", Body=b"x"),
    "delete root": lambda: s3.delete_object(Bucket=bucket, Key=root),
    "read other through ..": lambda: s3.get_object(Bucket=bucket, Key=climb),
    "write own": lambda: s3.put_object(Bucket=bucket, Key=own + "mine", Body=b"x"),
}
findings = {}
for name, call in attempts.items():
    try:
        call()
        findings[name] = "allowed"
    except ClientError as error:
        findings[name] = error.response["Error"]["Code"]
findings["environment"] = dict(env)
with open(env["SHARDOPS_RESULTS_FILE"], "a") as results:
    for line in open(env["SHARDOPS_ITEMS_FILE"]):
        results.write(json.dumps({"key": json.loads(line)["key"], "result": findings}) + "\n")
"""


@dataclass
class Installation:
    cluster: Cluster
    operator_namespace: str
    store: lifecycle.ObjectStore
    prefix: str
    team_a: str
    team_b: str
    hostile: str
    keys: dict[str, lifecycle.ObjectStore]
    base_values: dict[str, Any]

    def area(self, namespace: str) -> str:
        return f"{self.prefix}/{namespace}/"

    def values(self, namespaces: list[str]) -> dict[str, Any]:
        """The installation's values serving `namespaces` (`helm upgrade` is given them all)."""
        served = {"watch": {"namespaces": namespaces}, "workers": {"namespaces": namespaces}}
        return chartkit.merge(self.base_values, served)


def _campaign(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {"worker": {"image": chartkit.built_image(), "command": ["shardops-example-agent"]}, **spec},
    }


def _get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        cluster.kubectl("get", "campaign", name, "-n", namespace, "-o", "json").stdout
    )
    return body


def _ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    conditions = (_get(cluster, namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def _phase(cluster: Cluster, namespace: str, name: str) -> str:
    return str((_get(cluster, namespace, name).get("status") or {}).get("phase") or "")


def _events(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "events.events.k8s.io", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    return [e for e in items if e.get("reason") == reason]


@pytest.fixture(scope="module")
def installation(cluster: Cluster, object_store: lifecycle.ObjectStore) -> Iterator[Installation]:
    if cluster.local is None:
        pytest.skip("needs the local SeaweedFS to give each namespace its own identity")
    from testbed.harness import install_crds

    install_crds(cluster)
    operator_namespace = create_namespace(cluster, "e2e-ops")
    teams = [create_namespace(cluster, p) for p in ("e2e-team-a", "e2e-team-b", "e2e-hostile")]
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api)
    # One metrics port for the installation's life: an upgrade changes only the namespaces.
    base = chartkit.merge(
        chartkit.local_values(operator_namespace, workers={"allowReleaseNamespace": False}),
        chartkit.s3_store_values(cluster, operator_namespace, object_store, prefix),
    )
    keys = {
        ns: tenants.provision_namespace(
            cluster.api, ns, directory=cluster.local.directory, store=object_store, prefix=prefix
        )
        for ns in teams
    }
    found = Installation(
        cluster, operator_namespace, object_store, prefix, *teams, keys=keys, base_values=base
    )
    chartkit.install_chart(cluster, operator_namespace, found.values(teams))
    try:
        wait_for(
            "the chart's operator to be ready",
            lambda: "1/1" in cluster.kubectl("get", "deploy", "-n", operator_namespace, check=False).stdout,
            timeout=120,
        )
        yield found
    finally:
        chartkit.uninstall_chart(cluster, operator_namespace, check=False)
        for ns in [operator_namespace, *teams]:
            core.delete_namespace(ns, propagation_policy="Background")


def test_a_hostile_command_reaches_nothing_outside_its_namespaces_area(installation: Installation) -> None:
    inst, cluster, store = installation, installation.cluster, installation.store
    admin = store.client()
    other = inst.area(inst.team_a)
    admin.put_object(Bucket=store.bucket, Key=other + "data.jsonl", Body=b'{"secret": 1}\n')
    root = f"root-{uuid.uuid4().hex[:8]}"
    admin.put_object(Bucket=store.bucket, Key=root, Body=b"root")
    env = {
        "TARGET_ENDPOINT": store.endpoint,
        "TARGET_REGION": store.region,
        "TARGET_BUCKET": store.bucket,
        "TARGET_OTHER": other,
        "TARGET_ROOT": root,
        "TARGET_OWN": inst.area(inst.hostile),
        "TARGET_OTHER_NS": inst.team_a,
    }
    body = _campaign("attack", items=[{"n": 1}])
    body["spec"]["worker"] = {
        "image": chartkit.built_image(),
        "command": ["python", "-c", ATTACK],
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    cluster.kubectl("create", "-n", inst.hostile, "-f", "-", stdin=dump_json(body))
    wait_for(
        "the attack to finish", lambda: _phase(cluster, inst.hostile, "attack") == "Succeeded", timeout=240
    )

    # The campaign's one committed result (its Shard may be folded away by now): its pointer names it.
    results = inst.area(inst.hostile) + "results/"
    pointers = wait_for(
        "the attack's committed result",
        lambda: admin.list_objects_v2(Bucket=store.bucket, Prefix=results).get("Contents"),
        timeout=60,
    )
    (pointer,) = [o["Key"] for o in pointers]
    ref = json.loads(admin.get_object(Bucket=store.bucket, Key=pointer)["Body"].read())["ref"]
    assert ref.startswith(inst.area(inst.hostile)), "the results stay in the hostile namespace's area"
    document = json.loads(admin.get_object(Bucket=store.bucket, Key=ref)["Body"].read())
    findings = document["items"][0]["result"]
    environment = findings.pop("environment")
    # A key that climbs out of its area is refused, or is a key of its own that does not exist:
    # either way the other namespace's object is not read.
    assert findings.pop("read other through ..") in ("AccessDenied", "NoSuchKey", "InvalidRequest"), findings
    assert findings == {
        "list other": "AccessDenied",
        "read other": "AccessDenied",
        "write other": "AccessDenied",
        "delete other": "AccessDenied",
        "list root": "AccessDenied",
        "read root": "AccessDenied",
        "write root": "AccessDenied",
        "delete root": "AccessDenied",
        "write own": "allowed",
    }, findings
    # Its keys are its namespace's, and no installation key is anywhere in its environment.
    assert environment["AWS_ACCESS_KEY_ID"] == inst.keys[inst.hostile].access_key_id
    values = "\n".join(environment.values())
    assert store.access_key_id not in values and store.secret_access_key not in values
    # And the other namespace's object is intact, nothing was planted.
    assert (
        admin.get_object(Bucket=store.bucket, Key=other + "data.jsonl")["Body"].read() == b'{"secret": 1}\n'
    )
    listed = admin.list_objects_v2(Bucket=store.bucket, Prefix=other)["Contents"]
    assert [o["Key"] for o in listed] == [other + "data.jsonl"]


def test_items_of_another_namespace_are_refused_with_a_condition(installation: Installation) -> None:
    inst, cluster, store = installation, installation.cluster, installation.store
    victim = inst.area(inst.team_a) + "inputs/victim.jsonl"
    store.client().put_object(Bucket=store.bucket, Key=victim, Body=b'{"n": 1}\n')
    body = _campaign("steal", itemsFrom={"object": {"key": victim}})
    cluster.kubectl("create", "-n", inst.team_b, "-f", "-", stdin=dump_json(body))
    ready = wait_for(
        "Ready=False ItemsOutsideNamespace",
        lambda: (r := _ready(cluster, inst.team_b, "steal")).get("reason") == "ItemsOutsideNamespace" and r,
        timeout=60,
    )
    assert "spec.itemsFrom.object" in ready["message"], ready
    assert f"s3://{store.bucket}/{inst.area(inst.team_b)}" in ready["message"], (
        "it says where items must live"
    )
    assert _events(cluster, inst.team_b, "ItemsOutsideNamespace"), "an Event names it too"
    shards = cluster.kubectl("get", "shards", "-n", inst.team_b, "-o", "name").stdout
    assert shards.strip() == "", "nothing is cut from another namespace's object"


def test_a_store_override_without_credentials_is_refused_at_admission(installation: Installation) -> None:
    inst, cluster = installation, installation.cluster
    body = _campaign(
        "elsewhere",
        items=[{"n": 1}],
        resultStore={"type": "S3", "s3": {"endpoint": "http://169.254.169.254"}},
    )
    result = cluster.kubectl("create", "-n", inst.team_b, "-f", "-", stdin=dump_json(body), check=False)
    assert result.returncode != 0
    assert "without credentials" in result.stderr and "credentialsSecret" in result.stderr, result.stderr


def test_a_namespace_added_as_the_notes_say_runs_the_inline_example(installation: Installation) -> None:
    inst, cluster = installation, installation.cluster
    added = create_namespace(cluster, "e2e-team-c")
    try:
        served = [inst.team_a, inst.team_b, inst.hostile, added]
        upgraded = chartkit.upgrade_chart(cluster, inst.operator_namespace, inst.values(served))
        # The NOTES name the Secret to create in a new namespace.
        assert "kubectl -n NS create secret generic shardops-store" in upgraded.stdout, upgraded.stdout
        example = yaml.safe_load((REPO_ROOT / "examples" / "campaign-inline.yaml").read_text())
        name = example["metadata"]["name"]
        wait_for(
            "the upgraded operator to serve the new namespace",
            lambda: (
                cluster.kubectl(
                    "apply", "-n", added, "-f", "-", stdin=dump_json(example), check=False
                ).returncode
                == 0
            ),
            timeout=60,
        )
        ready = wait_for(
            "Ready=False StoreSecretMissing",
            lambda: (r := _ready(cluster, added, name)).get("reason") == "StoreSecretMissing" and r,
            timeout=120,
        )
        assert (
            "shardops-store" in ready["message"] and f"kubectl -n {added} create secret" in ready["message"]
        )
        jobs = cluster.kubectl("get", "jobs", "-n", added, "-o", "name").stdout
        assert jobs.strip() == "", "no worker pod that would fail on the missing Secret"

        assert cluster.local is not None
        tenants.provision_namespace(
            cluster.api, added, directory=cluster.local.directory, store=inst.store, prefix=inst.prefix
        )
        wait_for("the example to succeed", lambda: _phase(cluster, added, name) == "Succeeded", timeout=240)
    finally:
        client.CoreV1Api(cluster.api).delete_namespace(added, propagation_policy="Background")
