"""Lines of a tenant's input object, read with bounded memory whatever the object holds.

The object is read in chunks and split into lines as it streams, so the most one reader holds is
one line of at most MAX_ITEM_LINE_BYTES and one chunk: a single 1 GiB line is refused at its first
MiB, not buffered. A gzip object is inflated here too, chunk by chunk with a cap on each step's
output, and refused once it inflates past MAX_ITEMS_DECOMPRESSED_BYTES or faster than
MAX_GZIP_RATIO (a decompression bomb is refused a few MiB in). The limits live in api.campaign.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

from shardops.api.enums import ConditionReason
from shardops.api.items import (
    GZIP_RATIO_GRACE_BYTES,
    MAX_GZIP_RATIO,
    MAX_ITEM_LINE_BYTES,
    MAX_ITEMS_DECOMPRESSED_BYTES,
    ItemsOverLimit,
    line_too_long,
)
from shardops.k8s.campaigns import ItemsUnavailable

# How much is read (and, for gzip, inflated) at a time.
CHUNK_BYTES = 64 * 1024
_GZIP_WINDOW = 16 + zlib.MAX_WBITS  # gzip header and trailer, not raw deflate
_FIX = (
    "upload it as UTF-8 JSONL, gzip-compressed when its key ends in .gz "
    "(kubectl campaign apply --items FILE does)"
)


class NotJsonlText(ValueError):
    """An itemsFrom object that is not UTF-8 text (or not the gzip its name says): the whole object
    is wrong, not one line of it."""


class ItemsChanged(ItemsUnavailable):
    """The input behind spec.itemsFrom holds other content than when the campaign first read it
    (status.itemsPin): its shards were cut and their results keyed from the first. Not retryable:
    the input must be restored, or the work applied as a new campaign."""

    def __init__(self, where: str, pinned: str, found: str) -> None:
        super().__init__(
            ConditionReason.ITEMS_CHANGED,
            f"{where} changed after the campaign first read it (then {pinned}, now {found}): its shards "
            "were cut from the first content, so the campaign stops here rather than mix the two; "
            "restore the input, or apply the new items as a new campaign",
        )


def gunzipped(read: Callable[[int], bytes], where: str) -> Iterator[bytes]:
    """The inflated bytes of the gzip stream `read` gives (members one after another, as gzip
    allows), CHUNK_BYTES at most at a time. ItemsOverLimit past the size or ratio limits,
    NotJsonlText when it is not gzip or ends early."""
    inflater = zlib.decompressobj(_GZIP_WINDOW)
    compressed = inflated = 0
    pending = b""
    fed = False
    while True:
        if not pending:
            pending = read(CHUNK_BYTES)
            if not pending:
                break
            compressed += len(pending)
        if inflater.eof:  # the next member
            inflater = zlib.decompressobj(_GZIP_WINDOW)
        fed = True
        try:
            out = inflater.decompress(pending, CHUNK_BYTES)
        except zlib.error as error:
            raise NotJsonlText(f"{where} is not JSONL text (or not valid gzip): {error}; {_FIX}") from None
        pending = inflater.unconsumed_tail or (inflater.unused_data if inflater.eof else b"")
        inflated += len(out)
        if inflated > MAX_ITEMS_DECOMPRESSED_BYTES:
            raise ItemsOverLimit(
                where,
                f"it inflates to more than an itemsFrom object may hold (read {compressed:,} bytes of gzip)",
                MAX_ITEMS_DECOMPRESSED_BYTES,
                "split the input into several campaigns",
                unit=" bytes",
            )
        if inflated > GZIP_RATIO_GRACE_BYTES and inflated > MAX_GZIP_RATIO * compressed:
            raise ItemsOverLimit(
                where,
                f"{compressed:,} bytes of gzip inflated to {inflated:,}, more per byte than an input may "
                "(a decompression bomb?)",
                MAX_GZIP_RATIO,
                "upload the items uncompressed, or compress an input of real items",
                unit=" times",
            )
        if out:
            yield out
    if fed and not inflater.eof:
        raise NotJsonlText(
            f"{where} is not JSONL text (or not valid gzip): the gzip stream ends before its end; {_FIX}"
        )


def plain(read: Callable[[int], bytes]) -> Iterator[bytes]:
    """The bytes `read` gives, CHUNK_BYTES at a time."""
    while chunk := read(CHUNK_BYTES):
        yield chunk


def bounded_lines(chunks: Iterator[bytes], where: str, limit: int = MAX_ITEM_LINE_BYTES) -> Iterator[str]:
    """The lines of `chunks` as text, each with its newline (the last may have none);
    ItemsOverLimit (naming the line) at the first line longer than `limit` bytes (newline not
    counted), before more than `limit` + one chunk is held; NotJsonlText (naming the line) for a
    line that is not UTF-8."""
    line = bytearray()
    number = 1
    items = 0  # non-blank lines so far: the index of the item the current line holds
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if len(line) + len(piece) > limit:
                raise line_too_long(where, number, items)
            line += piece
            if end < 0:
                break
            if line.strip():
                items += 1
            line += b"\n"  # kept, as a text file's lines keep theirs
            yield _text(line, where, number)
            line.clear()
            number += 1
            start = end + 1
    if line:
        yield _text(line, where, number)


def _text(line: bytearray, where: str, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotJsonlText(
            f"{where} is not JSONL text (or not valid gzip): line {number}: {error}; {_FIX}"
        ) from None


def object_lines(read: Callable[[int], bytes], where: str, *, gzipped: bool) -> Iterator[str]:
    """The lines of an object whose body `read` gives: inflated when `gzipped`, every bound held."""
    return bounded_lines(gunzipped(read, where) if gzipped else plain(read), where)
