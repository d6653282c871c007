"""Removing one finalizer: only that entry goes, a list that moved meanwhile is read again."""

from __future__ import annotations

import pytest

from shardops.k8s.api import CAMPAIGNS, Invalid, Resource
from shardops.k8s.finalizers import REMOVAL_ROUNDS, removal_patch, remove_finalizer
from tests.fakekube import FakeKube

NAMESPACE = "ns"
OLD = "shardops.dev/kopf-finalizer"


def test_removal_patch_tests_each_entry_before_removing_it_highest_index_first() -> None:
    assert removal_patch(["a", OLD, "b", OLD], OLD) == [
        {"op": "test", "path": "/metadata/finalizers/3", "value": OLD},
        {"op": "remove", "path": "/metadata/finalizers/3"},
        {"op": "test", "path": "/metadata/finalizers/1", "value": OLD},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert removal_patch(["a", "b"], OLD) == [] and removal_patch([], OLD) == []


def _campaign(kube: FakeKube, finalizers: list[str]) -> None:
    kube.put(CAMPAIGNS, NAMESPACE, {"metadata": {"name": "c", "finalizers": finalizers}, "spec": {}})


def _finalizers(kube: FakeKube) -> list[str]:
    stored = kube.obj(CAMPAIGNS, NAMESPACE, "c")
    assert stored is not None
    return list(stored["metadata"]["finalizers"])


def test_only_that_finalizer_goes_and_the_others_stay_in_order() -> None:
    kube = FakeKube()
    _campaign(kube, ["example.com/first", OLD, "example.com/last"])
    seen = kube.get(CAMPAIGNS, NAMESPACE, "c")
    assert remove_finalizer(kube, CAMPAIGNS, NAMESPACE, "c", OLD, body=seen) is True
    assert _finalizers(kube) == ["example.com/first", "example.com/last"]
    assert kube.writes_to("campaigns") == [("patch", "campaigns", "c", 200)]
    # Idempotent: once it is gone nothing is written, and a missing object is not an error.
    assert remove_finalizer(kube, CAMPAIGNS, NAMESPACE, "c", OLD) is False
    assert remove_finalizer(kube, CAMPAIGNS, NAMESPACE, "absent", OLD) is False
    assert len(kube.writes()) == 1


def test_a_finalizer_added_between_read_and_patch_is_kept() -> None:
    kube = FakeKube()
    _campaign(kube, [OLD])
    seen = kube.get(CAMPAIGNS, NAMESPACE, "c")

    added: list[str] = []

    def another_controller(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        if verb == "patch" and not added:
            added.append("example.com/new")
            _campaign(fake, [*added, OLD])

    kube.before.append(another_controller)
    assert remove_finalizer(kube, CAMPAIGNS, NAMESPACE, "c", OLD, body=seen) is True
    assert _finalizers(kube) == ["example.com/new"]
    # The first patch (index 0 of what was read) failed its test; the second used the new list.
    assert [entry[3] for entry in kube.writes_to("campaigns", ok=False)] == [422]


def test_a_list_that_keeps_moving_gives_up_after_the_rounds_with_the_error() -> None:
    kube = FakeKube()
    _campaign(kube, [OLD])

    def always_moving(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        if verb == "patch":
            _campaign(fake, ["example.com/moving", *_finalizers(fake)])

    kube.before.append(always_moving)
    with pytest.raises(Invalid):
        remove_finalizer(kube, CAMPAIGNS, NAMESPACE, "c", OLD)
    assert len(kube.writes_to("campaigns", ok=False)) == REMOVAL_ROUNDS
    assert OLD in _finalizers(kube), "nothing of anyone else's was lost either"
