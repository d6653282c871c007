"""The in-memory API server's own tests: they keep `fakekube.FakeKube` honest to the real one."""

from __future__ import annotations

import pytest

from shardops.k8s.api import (
    CAMPAIGNS,
    EVENTS,
    JOBS,
    LEASES,
    SHARDS,
    AlreadyExists,
    ApiError,
    Conflict,
    Invalid,
    NotFound,
)
from tests.fakekube import Call, FakeKube, json_patch_ops, merge_patch

NAMESPACE = "ns"


def test_merge_patch_follows_rfc_7386() -> None:
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": [1]}) == {
        "a": 1,
        "b": {"d": 3, "e": 4},
        "f": [1],
    }


def test_json_patch_follows_rfc_6902_test_remove_add() -> None:
    doc = {"metadata": {"finalizers": ["a", "b", "c"]}, "spec": {"x/y": 1}}
    ops = [
        {"op": "test", "path": "/metadata/finalizers/1", "value": "b"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "d"},
        {"op": "remove", "path": "/spec/x~1y"},
    ]
    assert json_patch_ops(doc, ops) == {"metadata": {"finalizers": ["a", "c", "d"]}, "spec": {}}
    assert doc["metadata"]["finalizers"] == ["a", "b", "c"], "the input is not changed"
    for failing in (
        [{"op": "test", "path": "/metadata/finalizers/0", "value": "b"}],
        [{"op": "remove", "path": "/metadata/finalizers/3"}],
        [{"op": "remove", "path": "/metadata/labels"}],
    ):
        with pytest.raises(Invalid):
            json_patch_ops(doc, failing)


def test_json_patch_of_the_main_resource_keeps_status_and_bumps_the_version() -> None:
    kube = FakeKube()
    kube.put(CAMPAIGNS, NAMESPACE, {"metadata": {"name": "c", "finalizers": ["a"]}, "status": {"phase": "X"}})
    ops = [{"op": "remove", "path": "/metadata/finalizers/0"}, {"op": "remove", "path": "/status"}]
    patched = kube.json_patch(CAMPAIGNS, NAMESPACE, "c", ops)
    assert patched["metadata"]["finalizers"] == [] and patched["status"] == {"phase": "X"}
    assert patched["metadata"]["resourceVersion"] == "2"
    with pytest.raises(Invalid):
        kube.json_patch(
            CAMPAIGNS, NAMESPACE, "c", [{"op": "test", "path": "/metadata/finalizers/0", "value": "a"}]
        )
    assert kube.write_log()[-1] == ("patch", "campaigns", "c", 422)
    with pytest.raises(NotFound):
        kube.json_patch(CAMPAIGNS, NAMESPACE, "gone", ops)


def test_fake_enforces_preconditions_and_bumps_versions() -> None:
    kube = FakeKube()
    created = kube.create(
        SHARDS, NAMESPACE, {"metadata": {"name": "s"}, "spec": {}, "status": {"phase": "X"}}
    )
    assert "status" not in created
    with pytest.raises(AlreadyExists):
        kube.create(SHARDS, NAMESPACE, {"metadata": {"name": "s"}})
    patched = kube.patch(
        SHARDS, NAMESPACE, "s", {"status": {"phase": "Pending"}}, resource_version="1", subresource="status"
    )
    assert patched["status"] == {"phase": "Pending"} and patched["metadata"]["resourceVersion"] != "1"
    with pytest.raises(Conflict):
        kube.patch(SHARDS, NAMESPACE, "s", {"status": {}}, resource_version="1", subresource="status")
    unchanged = kube.patch(SHARDS, NAMESPACE, "s", {"status": {"phase": "Done"}})
    assert unchanged["status"] == {"phase": "Pending"}, "the main resource ignores status"


def test_status_writes_change_only_status_and_main_writes_merge_metadata() -> None:
    kube = FakeKube()
    kube.create(CAMPAIGNS, NAMESPACE, {"metadata": {"name": "c", "labels": {"a": "1"}}, "spec": {"x": 1}})
    kube.patch(
        CAMPAIGNS, NAMESPACE, "c", {"spec": {"x": 2}, "status": {"phase": "Running"}}, subresource="status"
    )
    stored = kube.obj(CAMPAIGNS, NAMESPACE, "c")
    assert stored is not None and stored["spec"] == {"x": 1} and stored["status"] == {"phase": "Running"}
    kube.patch(CAMPAIGNS, NAMESPACE, "c", {"metadata": {"labels": {"a": None, "b": "2"}, "uid": "forged"}})
    stored = kube.obj(CAMPAIGNS, NAMESPACE, "c")
    assert stored is not None and stored["metadata"]["labels"] == {"b": "2"}
    assert stored["metadata"]["uid"] == "uid-c", "server-owned metadata stays"
    kube.patch(CAMPAIGNS, NAMESPACE, "c", {"spec": {"y": 3}}, subresource="status")
    assert kube.obj(CAMPAIGNS, NAMESPACE, "c")["status"] == {"phase": "Running"}  # type: ignore[index]


def test_create_names_from_generate_name_and_returns_the_stored_object() -> None:
    kube = FakeKube()
    first = kube.create(JOBS, NAMESPACE, {"metadata": {"generateName": "w-"}, "spec": {}})
    second = kube.create(JOBS, NAMESPACE, {"metadata": {"generateName": "w-"}, "spec": {}})
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert first["metadata"]["namespace"] == NAMESPACE and first["metadata"]["resourceVersion"]


def test_replace_and_delete_check_the_resource_version() -> None:
    kube = FakeKube()
    lease = kube.create(LEASES, NAMESPACE, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    kube.put(LEASES, NAMESPACE, lease)  # another writer
    with pytest.raises(Conflict):
        kube.replace(LEASES, NAMESPACE, "l", {**lease, "spec": {"holderIdentity": "b"}})
    current = kube.get(LEASES, NAMESPACE, "l")
    kube.replace(LEASES, NAMESPACE, "l", {**current, "spec": {"holderIdentity": "b"}})
    with pytest.raises(Conflict):
        kube.delete(LEASES, NAMESPACE, "l", resource_version=current["metadata"]["resourceVersion"])
    kube.delete(LEASES, NAMESPACE, "l")
    with pytest.raises(NotFound):
        kube.delete(LEASES, NAMESPACE, "l")
    assert kube.writes_to("leases", ok=False) == [
        ("replace", "leases", "l", 409),
        ("delete", "leases", "l", 409),
        ("delete", "leases", "l", 404),
    ]


def test_selectors_seeded_versions_hooks_and_recorded_calls() -> None:
    kube = FakeKube()
    for name, labels in (("a", {"c": "x", "r": "w"}), ("b", {"c": "x"}), ("d", {"c": "y", "r": "w"})):
        kube.add(JOBS, {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels}})
    kube.add(SHARDS, {"metadata": {"name": "s", "namespace": NAMESPACE, "resourceVersion": "100"}})
    kube.add(EVENTS, {"metadata": {"name": "e", "namespace": NAMESPACE}, "regarding": {"name": "s"}})
    assert [j["metadata"]["name"] for j in kube.list(JOBS, NAMESPACE, label_selector="c=x,r=w")] == ["a"]
    assert [j["metadata"]["name"] for j in kube.list(JOBS, NAMESPACE, label_selector="r,c!=x")] == ["d"]
    assert [
        e["metadata"]["name"] for e in kube.list(EVENTS, NAMESPACE, fieldSelector="regarding.name=s")
    ] == ["e"]
    assert kube.list(EVENTS, NAMESPACE, fieldSelector="regarding.name=t") == []
    seen: list[tuple[str, str]] = []

    def refuse(fake: FakeKube, verb: str, resource: object, name: str) -> None:
        seen.append((verb, name))
        raise ApiError(503, "ServiceUnavailable", "down")

    kube.before.append(refuse)
    with pytest.raises(ApiError):
        kube.patch(SHARDS, NAMESPACE, "s", {"spec": {}}, resource_version="100")
    kube.before.clear()
    patched = kube.patch(SHARDS, NAMESPACE, "s", {"spec": {"a": 1}}, resource_version="100")
    assert int(patched["metadata"]["resourceVersion"]) > 100, "versions continue above the seeded ones"
    assert seen == [("patch", "s")]
    assert kube.write_log() == [("patch", "shards", "s", 503), ("patch", "shards", "s", 200)]
    kube.fail = lambda call: NotFound(404, "NotFound", "gone") if call.method == "GET" else None
    with pytest.raises(NotFound):
        kube.get(SHARDS, NAMESPACE, "s")
    assert isinstance(kube.calls[-1], Call) and kube.calls[-1].status == 404


def test_a_lost_answer_applies_the_write_and_answers_with_the_error() -> None:
    from tests.fakekube import gateway_timeout

    kube = FakeKube()
    kube.put(LEASES, NAMESPACE, {"metadata": {"name": "a"}, "spec": {"holderIdentity": "w"}})
    answered = kube.lose_answers(lambda call: call.plural == "leases", gateway_timeout, times=1, skip=1)
    kube.patch(LEASES, NAMESPACE, "a", {"spec": {"holderIdentity": "x"}})  # skipped: answered
    with pytest.raises(ApiError) as error:
        kube.patch(LEASES, NAMESPACE, "a", {"spec": {"holderIdentity": "y"}})
    assert error.value.status == 504 and error.value.ambiguous
    assert (kube.obj(LEASES, NAMESPACE, "a") or {})["spec"]["holderIdentity"] == "y", "applied all the same"
    kube.patch(LEASES, NAMESPACE, "a", {"spec": {"holderIdentity": "z"}})  # only `times` of them
    assert [call.status for call in answered] == [504]
    assert kube.write_log()[-2:] == [("patch", "leases", "a", 504), ("patch", "leases", "a", 200)]
