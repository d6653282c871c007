"""The process-kubelet's runc containers, their pure part: what a pod spec and an image make of a
container's config (testbed/cluster/kubelet/runc.py), and which image a pod's reference names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testbed.cluster.images import LocalImage, normalize_reference
from testbed.cluster.kubelet.runc import (
    DEFAULT_CAPABILITIES,
    KUBE_MOUNT,
    SA_MOUNT,
    ContainerConfigError,
    PodPaths,
    bundle_config,
    capabilities,
    container_argv,
    container_user,
    image_env,
    volume_mounts,
)

IMAGE = LocalImage(
    archive=Path("/dev/null"),
    digest="sha256:" + "a" * 64,
    names=("ghcr.io/shardops/shardops:0.1.0",),
    config={},
    layers=(),
    process={
        "User": "65532:65532",
        "Entrypoint": ["shardops"],
        "Cmd": ["operator"],
        "Env": ["PATH=/opt/shardops/bin:/usr/bin", "PYTHONUNBUFFERED=1"],
        "WorkingDir": "/tmp",
    },
)
PATHS = PodPaths(Path("/pod/serviceaccount"), Path("/pod/kube"), Path("/pod/volumes"))


@pytest.mark.parametrize(
    ("reference", "full"),
    [
        ("shardops:dev", "docker.io/library/shardops:dev"),
        ("team/agent", "docker.io/team/agent:latest"),
        ("ghcr.io/shardops/shardops:0.1.0", "ghcr.io/shardops/shardops:0.1.0"),
        ("localhost:5000/x:1", "localhost:5000/x:1"),
        ("ghcr.io/a/b@sha256:" + "b" * 64, "ghcr.io/a/b@sha256:" + "b" * 64),
    ],
)
def test_normalize_reference(reference: str, full: str) -> None:
    assert normalize_reference(reference) == full


def test_an_image_matches_its_name_and_digest_only() -> None:
    assert IMAGE.matches("ghcr.io/shardops/shardops:0.1.0")
    assert IMAGE.matches("ghcr.io/shardops/shardops@" + IMAGE.digest)
    assert not IMAGE.matches("ghcr.io/shardops/shardops:0.2.0")
    assert not IMAGE.matches("shardops:0.1.0")


@pytest.mark.parametrize(
    ("spec", "argv"),
    [
        ({}, ["shardops", "operator"]),
        ({"args": ["worker", "--campaign", "$(NAME)"]}, ["shardops", "worker", "--campaign", "demo"]),
        ({"command": ["python3", "-c", "pass"]}, ["python3", "-c", "pass"]),
        ({"command": ["shardops"], "args": ["crds"]}, ["shardops", "crds"]),
    ],
)
def test_command_replaces_the_entrypoint_and_args_the_cmd(spec: dict[str, Any], argv: list[str]) -> None:
    assert container_argv({"name": "c", **spec}, IMAGE, {"NAME": "demo"}) == argv


def test_image_env() -> None:
    assert image_env(IMAGE) == {"PATH": "/opt/shardops/bin:/usr/bin", "PYTHONUNBUFFERED": "1"}


def test_user_from_image_pod_and_container() -> None:
    assert container_user({}, {}, IMAGE) == (65532, 65532, [])
    pod = {
        "securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000, "supplementalGroups": [4]}
    }
    assert container_user({}, pod, IMAGE) == (1000, 2000, [4, 3000])
    container = {"securityContext": {"runAsUser": 1001}}
    assert container_user(container, pod, IMAGE) == (1001, 2000, [4, 3000])


def test_run_as_non_root_refuses_root_and_unverifiable_users() -> None:
    with pytest.raises(ContainerConfigError, match="runAsNonRoot and image will run as root"):
        container_user({"securityContext": {"runAsUser": 0, "runAsNonRoot": True}}, {}, IMAGE)
    named = LocalImage(IMAGE.archive, IMAGE.digest, IMAGE.names, {}, (), {"User": "app"})
    with pytest.raises(ContainerConfigError, match="non-numeric user"):
        container_user({}, {"securityContext": {"runAsNonRoot": True}}, named)
    rootless = LocalImage(IMAGE.archive, IMAGE.digest, IMAGE.names, {}, (), {})
    assert container_user({}, {}, rootless) == (0, 0, [])


def test_capabilities_default_drop_and_add() -> None:
    assert capabilities({}) == sorted(DEFAULT_CAPABILITIES)
    assert capabilities({"securityContext": {"capabilities": {"drop": ["ALL"]}}}) == []
    only = {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}
    assert capabilities(only) == ["CAP_NET_BIND_SERVICE"]
    fewer = capabilities({"securityContext": {"capabilities": {"drop": ["chown", "CAP_KILL"]}}})
    assert "CAP_CHOWN" not in fewer and "CAP_KILL" not in fewer and "CAP_SETUID" in fewer


def test_volume_mounts_empty_dir_and_the_service_account() -> None:
    pod = {
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {
                "name": "kube-api-access-x",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
            },
        ]
    }
    container = {
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kube-api-access-x", "mountPath": SA_MOUNT, "readOnly": True},
        ]
    }
    mounts = {m["destination"]: (m["source"], m["options"]) for m in volume_mounts(container, pod, PATHS)}
    assert mounts == {
        "/tmp": ("/pod/volumes/tmp", ["rbind", "rw", "nosuid", "nodev"]),
        SA_MOUNT: ("/pod/serviceaccount", ["rbind", "ro", "nosuid", "nodev"]),
        KUBE_MOUNT: ("/pod/kube", ["rbind", "ro"]),
    }


def test_unsupported_volumes_are_refused_with_their_type() -> None:
    pod = {"volumes": [{"name": "conf", "configMap": {"name": "c"}}]}
    container = {"volumeMounts": [{"name": "conf", "mountPath": "/etc/conf"}]}
    with pytest.raises(ContainerConfigError, match=r"volume 'conf' \(configMap\)"):
        volume_mounts(container, pod, PATHS)
    with pytest.raises(ContainerConfigError, match="no such volume"):
        volume_mounts({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, pod, PATHS)


def test_bundle_config_read_only_root_no_privileges_host_network() -> None:
    spec = {
        "name": "operator",
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    config = bundle_config(
        spec=spec,
        pod_spec={},
        image=IMAGE,
        rootfs=Path("/cache/rootfs"),
        argv=["shardops", "operator"],
        env={"A": "1"},
        hostname="pod-1",
        paths=PATHS,
    )
    assert config["root"] == {"path": "/cache/rootfs", "readonly": True}
    process = config["process"]
    assert process["user"] == {"uid": 65532, "gid": 65532}
    assert process["noNewPrivileges"] is True
    assert process["capabilities"] == {"bounding": [], "effective": [], "permitted": []}
    assert process["cwd"] == "/tmp" and process["env"] == ["A=1"]
    assert config["hostname"] == "pod-1"
    assert "network" not in {n["type"] for n in config["linux"]["namespaces"]}, "the host's network"
