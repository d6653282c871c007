"""Namespace users reach Campaigns through Kubernetes' default roles: the chart's aggregated
ClusterRoles (templates/rbac-aggregate.yaml) add shardops' resources to view, edit and admin, and
the controller manager's clusterrole-aggregation controller copies them in. A user bound to `edit`
in a namespace creates a Campaign there; one bound to `view` reads it and cannot create one."""

from __future__ import annotations

from pathlib import Path

import pytest
from testbed.harness import Cluster, dump_json, wait_for
from testbed.kits import chart as chartkit

from shardops.api.names import API_GROUP_VERSION

pytestmark = pytest.mark.usefixtures("crds_installed")


def _user(cluster: Cluster, namespace: str, name: str, default_role: str, tmp_path: Path) -> Path:
    """A ServiceAccount bound to a default ClusterRole in `namespace` only (a RoleBinding)."""
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    cluster.kubectl(
        "create", "rolebinding", f"{name}-{default_role}", f"--clusterrole={default_role}",
        f"--serviceaccount={namespace}:{name}", "-n", namespace,
    )  # fmt: skip
    return chartkit.token_kubeconfig(cluster, namespace, name, tmp_path / f"{name}.kubeconfig")


def test_a_namespace_edit_user_creates_a_campaign_and_a_view_user_reads_it(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    objects = chartkit.render(
        namespace, chartkit.local_values(namespace), show_only=["templates/rbac-aggregate.yaml"]
    )
    assert {o["kind"] for o in objects} == {"ClusterRole"}
    chartkit.apply_objects(cluster, objects)
    try:
        editor = _user(cluster, namespace, "editor", "edit", tmp_path)
        viewer = _user(cluster, namespace, "viewer", "view", tmp_path)

        def aggregated() -> bool:
            asked = chartkit.kubectl_as(cluster, editor, "auth", "can-i", "create", "campaigns.shardops.dev")
            return asked.stdout.strip() == "yes"

        wait_for("edit to aggregate the chart's Campaign rules", aggregated, timeout=60)
        campaign = {
            "apiVersion": API_GROUP_VERSION,
            "kind": "Campaign",
            "metadata": {"name": "by-editor"},
            "spec": {
                "items": [{"id": 1}],
                "suspend": True,
                "worker": {"image": chartkit.built_image(), "command": ["shardops-example-agent"]},
            },
        }
        created = chartkit.kubectl_as(cluster, editor, "create", "-f", "-", stdin=dump_json(campaign))
        assert created.returncode == 0, created.stderr

        read = chartkit.kubectl_as(cluster, viewer, "get", "campaigns,shards", "-o", "name")
        assert read.returncode == 0 and "campaign.shardops.dev/by-editor" in read.stdout, read.stderr
        campaign["metadata"]["name"] = "by-viewer"
        refused = chartkit.kubectl_as(cluster, viewer, "create", "-f", "-", stdin=dump_json(campaign))
        assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
        # Outside the namespace of the binding the editor has nothing.
        elsewhere = chartkit.kubectl_as(cluster, editor, "get", "campaigns", "-n", "default")
        assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr
    finally:
        chartkit.delete_cluster_scoped(cluster, objects)
