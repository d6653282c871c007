from __future__ import annotations

import re

import pytest

from shardops.logic.idempotency import canonical_json, fingerprint, idempotency_key, item_subkey, key_label

LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_canonical_json_is_sorted_compact_and_utf8() -> None:
    assert canonical_json({"b": 1, "a": ["é", None, True]}) == '{"a":["é",null,true],"b":1}'


def test_numbers_have_one_spelling() -> None:
    assert canonical_json([1.0, -0.0, 0.1, 2.5e-8, 1e300]) == "[1,0,0.1,2.5e-08,1e+300]"
    assert fingerprint({"x": 1}) == fingerprint({"x": 1.0})


@pytest.mark.parametrize("bad", [{1: "a"}, float("nan"), float("inf"), {"a": {1, 2}}, b"raw"])
def test_what_json_cannot_say_exactly_is_refused(bad: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        canonical_json(bad)


def test_fingerprint_shape_and_stability_under_key_order() -> None:
    a = fingerprint({"q": "x", "n": [1, 2]})
    assert a == fingerprint({"n": [1, 2], "q": "x"})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a)


def test_key_is_stable_and_changes_with_any_input() -> None:
    base = idempotency_key("camp", {"items": [1, 2]}, ["agent", "--fast"])
    assert base == idempotency_key("camp", {"items": [1, 2.0]}, ("agent", "--fast"))
    assert base != idempotency_key("camp2", {"items": [1, 2]}, ["agent", "--fast"])
    assert base != idempotency_key("camp", {"items": [2, 1]}, ["agent", "--fast"])
    assert base != idempotency_key("camp", {"items": [1, 2]}, ["agent"])
    assert idempotency_key("c", {}, "run it") != idempotency_key("c", {}, ["r", "u", "n", " ", "i", "t"])


def test_key_takes_the_worker_identity_canonically() -> None:
    worker = {"image": "img:1", "command": ["agent"], "env": {"A": "1", "B": "2"}}
    base = idempotency_key("camp", [1], worker)
    reordered = {"env": {"B": "2", "A": "1"}, "command": ["agent"], "image": "img:1"}
    assert base == idempotency_key("camp", [1], reordered)
    assert base != idempotency_key("camp", [1], {**worker, "image": "img:2"})
    assert base != idempotency_key("camp", [1], {**worker, "env": {"A": "1", "B": "3"}})


def test_label_form_is_63_chars_and_valid() -> None:
    label = key_label(idempotency_key("camp", {"a": 1}, ["x"]))
    assert len(label) == 63
    assert LABEL.fullmatch(label)
    with pytest.raises(ValueError):
        key_label("md5:abc")


def test_item_subkey_is_the_item_fingerprint() -> None:
    assert item_subkey({"id": 7, "text": "hi"}) == fingerprint({"text": "hi", "id": 7})
    assert item_subkey({"id": 7}) != item_subkey({"id": 8})
