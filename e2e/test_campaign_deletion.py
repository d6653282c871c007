"""Deleting a Campaign, or its namespace, needs no running operator.

Campaigns carry no finalizer: the garbage collector removes what a Campaign owns (Shards, the
claim Leases the Shards own, worker Jobs) through owner references, with or without the operator.
Campaigns that chart 0.1.0 left with kopf's finalizer are healed by the operator when it starts,
or by hand with the command in docs/install.md, which the last test runs as written there.

Deletion times are measured and printed; the assertions only need the deletes to finish within a
generous `--timeout` (a Campaign held by a finalizer would never finish).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from testbed.bed import Bed
from testbed.harness import Cluster, create_namespace
from testbed.kits import chart as chartkit
from testbed.kits.scheduler import Operator, create_campaign, get_campaign, kube_for, operator_running

from shardops.api.names import CAMPAIGN_LABEL, KOPF_FINALIZER
from shardops.k8s.api import CAMPAIGNS, JOBS, LEASES, SHARDS, Kube, NotFound

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")

JSON = dict[str, Any]
INSTALL_GUIDE = Bed.REPO_ROOT / "docs" / "install.md"
# Generous: a delete that waits for a finalizer never finishes; one that does not takes seconds.
DELETE_TIMEOUT = "60s"
NAMESPACE_TIMEOUT = "180s"
OTHER_FINALIZERS = ["example.com/keep-me", "example.com/keep-me-too"]


@contextlib.contextmanager
def own_namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace the test itself deletes (the `namespace` fixture would fail deleting it again)."""
    name = create_namespace(cluster, "e2e-del")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def timed(cluster: Cluster, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = cluster.kubectl(*args, check=False)
    return result, time.monotonic() - started


def delete_campaign(cluster: Cluster, namespace: str, name: str) -> float:
    """`kubectl delete campaign` (which waits until the object is gone); returns the seconds it took."""
    result, seconds = timed(
        cluster, "delete", "campaign", name, "-n", namespace, f"--timeout={DELETE_TIMEOUT}"
    )
    assert result.returncode == 0, f"kubectl delete campaign {name}: {result.stderr}"
    assert not exists(kube_for(cluster), CAMPAIGNS, namespace, name)
    return seconds


def delete_namespace(cluster: Cluster, namespace: str) -> float:
    result, seconds = timed(cluster, "delete", "namespace", namespace, f"--timeout={NAMESPACE_TIMEOUT}")
    assert result.returncode == 0, (
        f"kubectl delete namespace {namespace}: {result.stderr}\n"
        + cluster.kubectl("get", "namespace", namespace, "-o", "yaml", check=False).stdout
    )
    gone = cluster.kubectl("get", "namespace", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    return seconds


def exists(kube: Kube, resource: Any, namespace: str, name: str) -> bool:
    try:
        kube.get(resource, namespace, name)
    except NotFound:
        return False
    return True


def owned(kube: Kube, namespace: str, campaign: str) -> dict[str, list[str]]:
    """Names of the Shards and worker Jobs of a campaign (they carry its label) and of the claim
    Leases of its Shards (named after the shard `<campaign>-<index>`, owned by it)."""
    selector = f"{CAMPAIGN_LABEL}={campaign}"

    def names(resource: Any) -> list[str]:
        return sorted(o["metadata"]["name"] for o in kube.list(resource, namespace, label_selector=selector))

    claims = sorted(
        lease["metadata"]["name"]
        for lease in kube.list(LEASES, namespace)
        if any(
            ref.get("kind") == "Shard" and str(ref.get("name", "")).startswith(f"{campaign}-")
            for ref in lease["metadata"].get("ownerReferences") or []
        )
    )
    return {"shards": names(SHARDS), "leases": claims, "jobs": names(JOBS)}


def wait_owned_gone(kube: Kube, namespace: str, campaign: str, what: str) -> dict[str, float]:
    """Wait until the garbage collector removed everything the campaign owned; seconds per kind."""
    started = time.monotonic()
    gone_at: dict[str, float] = {}

    def all_gone() -> bool:
        for kind, names in owned(kube, namespace, campaign).items():
            if not names:
                gone_at.setdefault(kind, time.monotonic() - started)
        return len(gone_at) == 3

    Bed.wait_for(f"the garbage collector to remove what {campaign} owned, {what}", all_gone, timeout=90)
    return gone_at


def wait_reconciled(kube: Kube, namespace: str, name: str, *, with_shards: bool = True) -> None:
    Bed.wait_for(
        f"campaign {name} to be reconciled",
        lambda: reconciled(kube, namespace, name, with_shards=with_shards),
        timeout=90,
    )


def finalizers(body: JSON) -> list[str]:
    return list((body.get("metadata") or {}).get("finalizers") or [])


def reconciled(kube: Kube, namespace: str, name: str, *, with_shards: bool = True) -> bool:
    """The operator has seen and reconciled the Campaign: it wrote a phase (and cut shards)."""
    body = get_campaign(kube, namespace, name)
    if not (body.get("status") or {}).get("phase"):
        return False
    return not with_shards or bool(owned(kube, namespace, name)["shards"])


def run_bash(cluster: Cluster, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def leader_of(kube: Kube, namespace: str, lease: str) -> str | None:
    if not exists(kube, LEASES, namespace, lease):
        return None
    return (kube.get(LEASES, namespace, lease).get("spec") or {}).get("holderIdentity") or None


def scale_to_zero(cluster: Cluster, operator: Operator) -> None:
    cluster.kubectl("scale", f"deployment/{Bed.OPERATOR_NAME}", "-n", operator.namespace, "--replicas=0")
    core = client.CoreV1Api(cluster.api)
    Bed.wait_for(
        "the operator pods to be gone",
        lambda: (
            not core.list_namespaced_pod(operator.namespace, label_selector=f"app={Bed.OPERATOR_NAME}").items
        ),
        timeout=60,
    )


def periodic_reconciles(operator: Operator) -> float:
    found = re.search(
        r'^shardops_periodic_reconciles_total\{outcome="ok"\} (\S+)$', operator.http("/metrics")[1], re.M
    )
    return float(found.group(1)) if found else 0.0


def running_campaign(name: str) -> JSON:
    """A campaign that is still working when the test deletes it: shards claimed (Leases held) and
    worker Jobs running."""
    items = [{"n": i} for i in range(8)]
    return Bed.campaign_body(
        name, items, shardSize=1, maxConcurrency=2, worker_env={"SHARDOPS_AGENT_LATENCY": 2}
    )


# --- (a) and (b): the garbage collector, with the operator and without it --------------------------------


def test_deleting_a_campaign_leaves_nothing_it_owns_with_or_without_the_operator(
    local_cluster: Cluster,
) -> None:
    cluster = local_cluster
    kube = kube_for(cluster)
    figures: dict[str, float] = {}
    with own_namespace(cluster) as namespace, operator_running(cluster, namespace) as operator:
        create_campaign(kube, namespace, running_campaign("busy"))

        def everything_owned() -> dict[str, list[str]] | None:
            found = owned(kube, namespace, "busy")
            return found if all(found.values()) else None

        seen = Bed.wait_for(
            "shards, held claim Leases and worker Jobs of busy", everything_owned, timeout=120
        )
        body = get_campaign(kube, namespace, "busy")
        assert (body.get("status") or {}).get("phase"), "the operator has reconciled it"
        assert finalizers(body) == [], "no finalizer on a Campaign the operator handles"
        assert all(finalizers(s) == [] for s in kube.list(SHARDS, namespace)), "nor on its Shards"

        # The periodic reconcile (the operator's own tick, not a kopf timer) runs for it.
        Bed.wait_for("a periodic reconcile", lambda: periodic_reconciles(operator) >= 1, timeout=30)

        # (a) With the operator running: the garbage collector removes every owned object.
        figures["delete campaign, operator running"] = delete_campaign(cluster, namespace, "busy")
        for kind, seconds in wait_owned_gone(kube, namespace, "busy", "with the operator").items():
            figures[f"  its {kind} gone (garbage collector), after the delete returned"] = seconds
        counts = {kind: len(names) for kind, names in seen.items()}
        print(f"\ncampaign busy owned {counts} when deleted")

        # (b) With the operator scaled to 0: Campaigns and their namespace still delete.
        for name in ("left-1", "left-2"):
            create_campaign(kube, namespace, running_campaign(name))
        for name in ("left-1", "left-2"):
            wait_reconciled(kube, namespace, name)
        scale_to_zero(cluster, operator)
        figures["delete campaign, operator scaled to 0"] = delete_campaign(cluster, namespace, "left-1")
        for kind, seconds in wait_owned_gone(kube, namespace, "left-1", "without the operator").items():
            figures[f"  its {kind} gone (garbage collector, no operator), after the delete returned"] = (
                seconds
            )
        assert exists(kube, CAMPAIGNS, namespace, "left-2")
        figures["delete namespace holding a Campaign, operator scaled to 0"] = delete_namespace(
            cluster, namespace
        )
    _print(figures)


def test_after_helm_uninstall_campaigns_and_their_namespace_delete(local_cluster: Cluster) -> None:
    cluster = local_cluster
    kube = kube_for(cluster)
    figures: dict[str, float] = {}
    with own_namespace(cluster) as namespace:
        chartkit.install_chart(cluster, namespace)
        try:
            lease = f"{chartkit.fullname()}-operator"
            Bed.wait_for(
                "the chart's operator to lead", lambda: leader_of(kube, namespace, lease), timeout=90
            )
            for name in ("first", "second"):
                create_campaign(kube, namespace, running_campaign(name))
            for name in ("first", "second"):
                wait_reconciled(kube, namespace, name)
                assert finalizers(get_campaign(kube, namespace, name)) == []
        finally:
            chartkit.uninstall_chart(cluster, namespace, check=False)
        selector = "app.kubernetes.io/component=operator"
        core = client.CoreV1Api(cluster.api)
        Bed.wait_for(
            "the operator pod to be gone after helm uninstall",
            lambda: not core.list_namespaced_pod(namespace, label_selector=selector).items,
            timeout=60,
        )
        figures["delete campaign after helm uninstall"] = delete_campaign(cluster, namespace, "first")
        figures["delete namespace holding a Campaign after helm uninstall"] = delete_namespace(
            cluster, namespace
        )
    _print(figures)


# --- (c) the upgrade heals Campaigns that carry the old finalizer -------------------------------------------


def _with_finalizers(name: str, entries: list[str]) -> JSON:
    body = Bed.campaign_body(name, [{"n": 1}, {"n": 2}], suspend=True)
    body["metadata"]["finalizers"] = entries
    return body


def _clear_other_finalizers(cluster: Cluster, namespace: str, name: str) -> None:
    """Test cleanup: the example finalizers nobody serves, so that the namespace can go."""
    cluster.kubectl(
        "patch", "campaign", name, "-n", namespace, "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False,
    )  # fmt: skip


def test_the_operator_removes_the_old_finalizer_and_keeps_the_others(bed: Bed) -> None:
    bed.cluster = bed.cluster
    kube = bed.kube
    # As chart 0.1.0 left them: kopf's finalizer on every Campaign it had seen, next to whatever
    # other controllers added; one Campaign deleted while no operator ran, stuck ever since.
    bed.create_campaign(_with_finalizers("old", [KOPF_FINALIZER]))
    bed.create_campaign(
        _with_finalizers("shared", [OTHER_FINALIZERS[0], KOPF_FINALIZER, OTHER_FINALIZERS[1]]),
    )
    bed.create_campaign(_with_finalizers("stuck", [KOPF_FINALIZER]))
    bed.cluster.kubectl("delete", "campaign", "stuck", "-n", bed.namespace, "--wait=false")
    assert bed.get_campaign("stuck")["metadata"].get("deletionTimestamp")
    try:
        started = time.monotonic()
        with bed.operator() as operator:
            bed.wait_for(
                "the old finalizer to be gone from every Campaign",
                lambda: (
                    finalizers(bed.get_campaign("old")) == []
                    and finalizers(bed.get_campaign("shared")) == OTHER_FINALIZERS
                    and not exists(kube, CAMPAIGNS, bed.namespace, "stuck")
                ),
                timeout=60,
            )
            healed = time.monotonic() - started
            # The operator did it, not only kopf: kopf drops its own finalizer name from an object
            # being deleted ("stuck"), so which of the two removes that one is a race; from the
            # Campaigns not being deleted ("old", "shared") only the operator removes it.
            (pod,) = operator.pods()

            def settled() -> tuple[float, list[str]] | None:
                # The log first, then the counter (counted before it is logged): equal once every
                # removal that will happen has happened.
                lines = [
                    line
                    for line in operator.log(pod.metadata.name).splitlines()
                    if "removed the finalizer" in line
                ]
                found = re.search(
                    r"^shardops_old_finalizers_removed_total (\S+)$", operator.http("/metrics")[1], re.M
                )
                count = float(found.group(1)) if found else -1.0
                return (count, lines) if count == len(lines) else None

            count, lines = bed.wait_for("the counter and the log to agree", settled, timeout=30)
            assert count in {2.0, 3.0}, lines
            assert any("/old: removed" in line for line in lines), lines
            assert any("/shared: removed" in line for line in lines), lines
            # And the healed Campaigns are handled as usual.
            for name in ("old", "shared"):
                wait_reconciled(kube, bed.namespace, name, with_shards=False)
            assert finalizers(bed.get_campaign("shared")) == OTHER_FINALIZERS
        print(f"\nold finalizer removed from 3 Campaigns {healed:.1f}s after the operator was started")
    finally:
        _clear_other_finalizers(bed.cluster, bed.namespace, "shared")


# --- by hand, with the command of docs/install.md --------------------------------------------------------


def install_guide_block() -> str:
    section = INSTALL_GUIDE.read_text().split("### Clearing the old finalizer by hand", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "docs/install.md: no sh block under 'Clearing the old finalizer by hand'"
    return match.group(1)


def test_the_install_guide_clears_the_old_finalizer_without_an_operator(bed: Bed) -> None:
    bed.cluster = bed.cluster
    kube = bed.kube
    block = install_guide_block()
    with own_namespace(bed.cluster) as doomed:
        bed.create_campaign(_with_finalizers("stuck", [KOPF_FINALIZER]))
        bed.create_campaign(_with_finalizers("shared", [OTHER_FINALIZERS[0], KOPF_FINALIZER]))
        bed.namespaced(doomed).create_campaign(_with_finalizers("in-doomed", [KOPF_FINALIZER]))
        bed.cluster.kubectl("delete", "campaign", "stuck", "-n", bed.namespace, "--wait=false")
        bed.cluster.kubectl("delete", "namespace", doomed, "--wait=false")
        # What issue reporters saw: the Campaign and the namespace stay, held by the finalizer.
        held, _ = timed(bed.cluster, "delete", "campaign", "stuck", "-n", bed.namespace, "--timeout=3s")
        assert held.returncode != 0 and "timed out" in held.stderr, held.stderr
        assert exists(kube, CAMPAIGNS, doomed, "in-doomed")
        try:
            started = time.monotonic()
            run = run_bash(bed.cluster, block)
            assert run.returncode == 0, f"the install guide's command failed:\n{run.stdout}\n{run.stderr}"
            ran = time.monotonic() - started
            patched = sorted(re.findall(r"campaign\.shardops\.dev/(\S+) patched", run.stdout))
            assert patched == ["in-doomed", "shared", "stuck"], run.stdout
            bed.wait_for(
                "campaign stuck to be gone",
                lambda: not exists(kube, CAMPAIGNS, bed.namespace, "stuck"),
                timeout=30,
            )
            assert finalizers(bed.get_campaign("shared")) == [OTHER_FINALIZERS[0]]
            core = client.CoreV1Api(bed.cluster.api)

            def namespace_gone() -> bool:
                try:
                    core.read_namespace(doomed)
                except client.ApiException as error:
                    return error.status == 404
                return False

            bed.wait_for(f"namespace {doomed} to finish deleting", namespace_gone, timeout=180)
            namespace_done = time.monotonic() - started
            # Idempotent: a second run finds nothing to do (and fails on nothing).
            again = run_bash(bed.cluster, block)
            assert again.returncode == 0 and "patched" not in again.stdout, again.stdout + again.stderr
        finally:
            _clear_other_finalizers(bed.cluster, bed.namespace, "shared")
    _print(
        {
            "install guide loop over all Campaigns": ran,
            "stuck namespace gone after the loop started": namespace_done,
        }
    )
    print(f"install guide command:\n{block}")


def _print(figures: dict[str, float]) -> None:
    print("\ndeletion figures:")
    for what, seconds in figures.items():
        print(f"  {seconds:6.2f} s  {what}")
