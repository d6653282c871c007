"""Every tenant input is hostile: each bound on the items (line length, gzip size and ratio, item
counts, nesting), each refused `source`, and the pin of an itemsFrom input, met with a typed error
naming the input, the line and the limit, read with bounded memory, and reported on the campaign."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator

import pytest

from shardops.api import items as items_api
from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.items import (
    MAX_CONFIGMAP_ITEMS,
    MAX_GZIP_RATIO,
    MAX_ITEM_DEPTH,
    MAX_ITEM_LINE_BYTES,
    ItemsFrom,
    ItemsObject,
    ItemsOverLimit,
    check_inline_items,
    parse_item_line,
)
from shardops.api.store import ResultStoreStatus
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, SHARDS, Resource
from shardops.k8s.campaigns import ItemsUnavailable
from shardops.store import items as items_module
from shardops.store import lines as lines_module
from shardops.store.items import campaign_items, configmap_items, object_items
from shardops.store.lines import CHUNK_BYTES, ItemsChanged, NotJsonlText, bounded_lines, gunzipped, plain
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

LOCATION = ResultStoreStatus(type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results", prefix="p")


class Endless:
    """A body that is one line of `size` bytes, made as it is read: nothing holds it whole. Counts
    what a reader took."""

    def __init__(self, size: int, byte: bytes = b"x", head: bytes = b'{"blob": "') -> None:
        self.left, self.byte, self.head, self.taken = size, byte, head, 0

    def read(self, amount: int) -> bytes:
        if self.head:
            chunk, self.head = self.head, b""
        else:
            chunk = self.byte * min(amount, self.left)
            self.left -= len(chunk)
        self.taken += len(chunk)
        return chunk


def _deflated(lines: Iterator[bytes]) -> Iterator[bytes]:
    """gzip of `lines`, compressed as they come (the test never holds the inflated input)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for line in lines:
        if out := packer.compress(line):
            yield out
    yield packer.flush()


class Chunks:
    """A `read(n)` over an iterator of chunks, counting the bytes handed out."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.pending, self.taken = chunks, b"", 0

    def read(self, amount: int) -> bytes:
        while len(self.pending) < amount:
            more = next(self.chunks, b"")
            if not more:
                break
            self.pending += more
        out, self.pending = self.pending[:amount], self.pending[amount:]
        self.taken += len(out)
        return out


# --- line length --------------------------------------------------------------------------------------


def test_a_gigabyte_line_is_refused_at_its_first_mebibyte_naming_line_item_and_limit() -> None:
    body = Endless(1024**3)
    reader = bounded_lines(plain(body.read), "s3://b/in.jsonl")
    with pytest.raises(ItemsOverLimit) as refused:
        next(reader)
    message = str(refused.value)
    assert "s3://b/in.jsonl line 1: item 0 alone is longer than one item may be" in message
    assert f"over the limit of {MAX_ITEM_LINE_BYTES:,} bytes" in message
    assert body.taken <= MAX_ITEM_LINE_BYTES + 2 * CHUNK_BYTES, "read no further than the limit"


def test_the_long_line_is_numbered_after_short_and_blank_ones() -> None:
    text = b'{"n": 0}\n\n{"n": 1}\n' + b"y" * (MAX_ITEM_LINE_BYTES + 1) + b"\n"
    lines = bounded_lines(plain(io.BytesIO(text).read), "w")
    assert [next(lines) for _ in range(3)] == ['{"n": 0}\n', "\n", '{"n": 1}\n']
    with pytest.raises(ItemsOverLimit, match=r"^w line 4: item 2 alone is"):
        next(lines)


def test_a_line_of_exactly_the_limit_passes_and_lines_split_across_chunks_join() -> None:
    line = b"z" * MAX_ITEM_LINE_BYTES
    assert list(bounded_lines(iter([line[:10], line[10:] + b"\nab", b"c"]), "w")) == [
        line.decode() + "\n",
        "abc",
    ]


def test_a_line_that_is_not_utf8_is_named() -> None:
    with pytest.raises(NotJsonlText, match=r"is not JSONL text .*line 2"):
        list(bounded_lines(iter([b'{"a": 1}\n{"b": "caf\xe9"}\n']), "w"))


# --- gzip -------------------------------------------------------------------------------------------------


def test_a_decompression_bomb_is_refused_after_a_few_mebibytes_naming_the_ratio() -> None:
    # 4 GiB of one repeated line, ~4 MB of gzip: inflating it all would cost minutes of the operator.
    repeated = (b'{"n": 0}\n' * 10_000 for _ in range(4 * 1024**3 // 90_000))
    body = Chunks(_deflated(repeated))
    with pytest.raises(ItemsOverLimit) as refused:
        for _ in bounded_lines(gunzipped(body.read, "s3://b/bomb.jsonl.gz"), "s3://b/bomb.jsonl.gz"):
            pass
    assert "s3://b/bomb.jsonl.gz:" in str(refused.value) and "decompression bomb" in str(refused.value)
    assert f"over the limit of {MAX_GZIP_RATIO:,} times" in str(refused.value)
    assert body.taken < 1024 * 1024, f"refused after {body.taken:,} compressed bytes"


def test_gzip_past_the_inflated_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines_module, "MAX_ITEMS_DECOMPRESSED_BYTES", 1000)
    packed = gzip.compress(b"".join(json.dumps({"n": i}).encode() + b"\n" for i in range(500)))
    with pytest.raises(ItemsOverLimit, match=r"w: it inflates to more than an itemsFrom object may hold"):
        list(gunzipped(io.BytesIO(packed).read, "w"))


def test_gzip_members_follow_each_other_and_a_cut_stream_is_named() -> None:
    packed = gzip.compress(b'{"a": 1}\n') + gzip.compress(b'{"b": 2}\n')
    assert list(bounded_lines(gunzipped(io.BytesIO(packed).read, "w"), "w")) == ['{"a": 1}\n', '{"b": 2}\n']
    with pytest.raises(NotJsonlText, match="ends before its end"):
        list(gunzipped(io.BytesIO(packed[:-12]).read, "w"))
    with pytest.raises(NotJsonlText, match="not valid gzip"):
        list(gunzipped(io.BytesIO(b'{"a": 1}\n').read, "w"))
    assert list(gunzipped(io.BytesIO(b"").read, "w")) == [], "an empty object has no items"


# --- counts and nesting -------------------------------------------------------------------------------------


def test_an_object_with_more_items_than_allowed_is_refused_naming_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(items_module, "MAX_OBJECT_ITEMS", 3)
    s3 = FakeS3()
    s3.objects["p/ns/in/many.jsonl"] = (b"".join(b'{"n": %d}\n' % i for i in range(5)), {})
    streamed = object_items(ItemsObject(key="p/ns/in/many.jsonl"), S3Store(LOCATION, NAMESPACE, client=s3))
    with pytest.raises(
        ItemsUnavailable,
        match=r"s3://results/p/ns/in/many.jsonl line 4: more items than one itemsFrom object",
    ):
        streamed.total()


def test_a_configmap_with_more_items_than_allowed_is_refused_naming_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(items_api, "MAX_CONFIGMAP_ITEMS", 2)
    source = ItemsFrom(config_map_name="q", key="items.jsonl")
    with pytest.raises(ItemsOverLimit, match=r"ConfigMap q key items.jsonl line 4: more items .* limit of 2"):
        source.parse_items('{"n": 0}\n\n{"n": 1}\n{"n": 2}\n')
    assert MAX_CONFIGMAP_ITEMS >= 10_000, "the limit leaves room for real inputs"


def test_an_item_nested_too_deep_is_refused_not_a_recursion_error() -> None:
    for deep in ('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}", '{"a": ' + "[" * 100 + "]" * 100 + "}"):
        with pytest.raises(
            ItemsOverLimit, match=rf"w line 7: the item nests deeper .* limit of {MAX_ITEM_DEPTH}"
        ):
            parse_item_line(deep, 7, "w")
    assert parse_item_line('{"a": [[{"b": 1}]]}', 1, "w") == {"a": [[{"b": 1}]]}


# --- source --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("two words", "is not a source name"),
        ("x" * 64, "is not a source name"),
        ("-dash", "is not a source name"),
        (7, "must be a string"),
        ("", "is not a source name"),
    ],
)
def test_an_item_source_no_shard_could_carry_is_refused_naming_line_and_rule(
    source: object, says: str
) -> None:
    line = json.dumps({"q": 1, "source": source})
    with pytest.raises(ValueError, match=rf"^in line 3: source.*{says}"):
        parse_item_line(line, 3, "in")
    with pytest.raises(ValueError, match=rf"^spec.items\[1\]: source.*{says}"):
        check_inline_items([{"q": 0}, {"q": 1, "source": source}])
    assert parse_item_line('{"source": "open-ai_2.eu"}', 1, "in") == {"source": "open-ai_2.eu"}


def test_a_configmap_item_with_a_refused_source_is_a_condition_and_no_shard(
    clock: Clock, kube: OperatorKube
) -> None:
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    text = '{"n": 0}\n{"n": 1, "source": "no such thing!"}\n'
    kube.put(CONFIGMAPS, NAMESPACE, {"metadata": {"name": "questions"}, "data": {"items.jsonl": text}})
    reconciler(kube, clock).reconcile(NAMESPACE, "camp")
    status = status_of(kube)
    ready = condition(status, "Ready")
    assert status["phase"] == "Invalid" and ready["reason"] == "ItemsInvalid"
    assert (
        "ConfigMap questions key items.jsonl line 2: source 'no such thing!' is not a source name"
        in ready["message"]
    )
    assert kube.list(SHARDS, NAMESPACE) == [] and kube.event_reasons("camp") == ["ItemsInvalid"]


def test_an_inline_item_with_a_refused_source_under_an_old_crd_is_a_condition(
    clock: Clock, kube: OperatorKube
) -> None:
    put_campaign(kube, campaign(items=[{"n": 0}, {"n": 1, "source": "a b"}]))
    reconciler(kube, clock).reconcile(NAMESPACE, "camp")
    ready = condition(status_of(kube), "Ready")
    assert ready["reason"] == "ItemsInvalid" and ready["message"].startswith("spec.items[1]: source 'a b'")
    assert kube.list(SHARDS, NAMESPACE) == []


# --- pinned inputs --------------------------------------------------------------------------------


def test_an_object_is_read_by_its_pinned_etag_and_a_new_version_is_refused() -> None:
    s3 = FakeS3()
    store = S3Store(LOCATION, NAMESPACE, client=s3)
    s3.objects["p/ns/in/q.jsonl"] = (b'{"n": 0}\n{"n": 1}\n', {})
    first = object_items(ItemsObject(key="p/ns/in/q.jsonl"), store)
    assert first.total() == 2 and first.pin is not None and first.pin.etag
    s3.objects["p/ns/in/q.jsonl"] = (
        b'{"n": 1}\n{"n": 0}\n',
        {},
    )  # same count, other order: results would pair wrong
    with pytest.raises(ItemsChanged) as changed:
        first[0:1]  # a later slice reopens with If-Match
    assert changed.value.reason == "ItemsChanged"
    assert "s3://results/p/ns/in/q.jsonl changed after" in changed.value.message
    again = object_items(ItemsObject(key="p/ns/in/q.jsonl"), store, pinned=first.pin)  # after a restart
    with pytest.raises(ItemsChanged):
        again.total()


def test_a_store_that_ignores_if_match_is_caught_by_comparing_the_etag() -> None:
    class IgnoresIfMatch(FakeS3):
        def get_object(self, Bucket: str, Key: str, IfMatch: str | None = None) -> object:
            return super().get_object(Bucket, Key)

    s3 = IgnoresIfMatch()
    store = S3Store(LOCATION, NAMESPACE, client=s3)
    s3.objects["k.jsonl"] = (b'{"n": 0}\n', {})
    opened = store.open_items("k.jsonl")
    list(opened.lines)
    s3.objects["k.jsonl"] = (b'{"n": 9}\n', {})
    with pytest.raises(ItemsChanged, match=f"then ETag {opened.etag}"):
        store.open_items("k.jsonl", if_match=opened.etag)


def test_a_configmap_edited_mid_run_is_refused_by_operator_and_worker(
    clock: Clock, kube: OperatorKube
) -> None:
    body = campaign()
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "questions", "key": "items.jsonl"}
    put_campaign(kube, body)
    map_ = {"metadata": {"name": "questions"}, "data": {"items.jsonl": '{"n": 0}\n{"n": 1}\n'}}
    kube.put(CONFIGMAPS, NAMESPACE, map_)
    reconciler(kube, clock).reconcile(NAMESPACE, "camp")
    pin = status_of(kube)["itemsPin"]
    assert pin["source"] == "ConfigMap questions key items.jsonl" and len(pin["sha256"]) == 64
    assert kube.list(SHARDS, NAMESPACE), "the first read cut shards"

    kube.put(CONFIGMAPS, NAMESPACE, {**map_, "data": {"items.jsonl": '{"n": 1}\n{"n": 0}\n'}})
    stored = Campaign.parse(kube.get(*_campaign_ref()))
    with pytest.raises(ItemsChanged, match=r"ConfigMap questions key items\.jsonl"):
        campaign_items(kube, stored, None)  # what the finalize worker reads
    reconciler(kube, clock.advance(5)).reconcile(NAMESPACE, "camp")  # a restarted operator reads again
    ready = condition(status_of(kube), "Ready")
    assert (status_of(kube)["phase"], ready["reason"]) == ("Invalid", "ItemsChanged")
    assert "restore the input, or apply the new items as a new campaign" in ready["message"]

    kube.put(CONFIGMAPS, NAMESPACE, map_)  # restored: read as before
    assert configmap_items(kube, stored) == [{"n": 0}, {"n": 1}]


def _campaign_ref() -> tuple[Resource, str, str]:
    return CAMPAIGNS, NAMESPACE, "camp"


def test_items_unavailable_carries_the_changed_reason() -> None:
    assert issubclass(ItemsChanged, ItemsUnavailable), "every reader that reports items reports this too"


@pytest.fixture
def kube() -> OperatorKube:
    return OperatorKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()
