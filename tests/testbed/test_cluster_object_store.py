"""How tests and shells learn about an S3 store: the SHARDOPS_S3_* variables and `make cluster-up`'s lines."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from testbed.cluster import lifecycle
from testbed.cluster.lifecycle import ObjectStore

STORE = ObjectStore(
    endpoint="http://127.0.0.1:9000",
    region="eu-west-3",
    access_key_id="AKID",
    secret_access_key="s3cr3t",
    bucket="results",
)


def test_no_endpoint_means_no_store() -> None:
    assert ObjectStore.from_env({"SHARDOPS_S3_ACCESS_KEY_ID": "AKID"}) is None


def test_env_round_trips() -> None:
    assert ObjectStore.from_env(STORE.env()) == STORE
    assert set(STORE.env()) == {
        "SHARDOPS_S3_ENDPOINT",
        "SHARDOPS_S3_REGION",
        "SHARDOPS_S3_ACCESS_KEY_ID",
        "SHARDOPS_S3_SECRET_ACCESS_KEY",
        "SHARDOPS_S3_BUCKET",
    }


def test_region_and_bucket_have_defaults() -> None:
    environ = {
        "SHARDOPS_S3_ENDPOINT": "http://127.0.0.1:9000",
        "SHARDOPS_S3_ACCESS_KEY_ID": "AKID",
        "SHARDOPS_S3_SECRET_ACCESS_KEY": "s3cr3t",
    }
    store = ObjectStore.from_env(environ)
    assert store is not None
    assert (store.region, store.bucket) == (lifecycle.DEFAULT_REGION, lifecycle.DEFAULT_BUCKET)


def test_endpoint_without_credentials_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="SHARDOPS_S3_ACCESS_KEY_ID, SHARDOPS_S3_SECRET_ACCESS_KEY"):
        ObjectStore.from_env({"SHARDOPS_S3_ENDPOINT": "http://127.0.0.1:9000"})


def test_cluster_up_prints_the_store_as_export_lines() -> None:
    info = {"kubeconfig": "/x/kubeconfig", "binDir": "/bin-dir", "objectStore": asdict(STORE)}
    lines = lifecycle._usage(info).splitlines()
    assert "  export SHARDOPS_S3_ENDPOINT=http://127.0.0.1:9000" in lines
    assert "  export SHARDOPS_S3_SECRET_ACCESS_KEY=s3cr3t" in lines
    assert lines[0] == "  export KUBECONFIG=/x/kubeconfig"


def test_seaweedfs_sockets_are_named_by_grpc_port() -> None:
    paths = lifecycle.seaweedfs_socket_paths({"s3.port": 1, "s3.port.grpc": 2, "master.port.grpc": 3})
    assert [str(p) for p in paths] == ["/tmp/seaweedfs-s3-grpc-2.sock", "/tmp/seaweedfs-master-grpc-3.sock"]
