"""Files of the Batch API: an upload checked line by line into a spool on disk, then stored in the
namespace's S3 area under its content's sha256; input, output and error files read back as pages of
lines. Every function here blocks: the app runs them on its executor.

Memory is bounded by one chunk and one line (`MAX_ITEM_LINE_BYTES`), the duplicate check's
custom_ids (a dict up to `store.inputs.CUSTOM_IDS_IN_MEMORY`, then a SQLite file beside the spool
with a bounded page cache) and the S3 transfer's parts in flight (`store.s3.UPLOAD_PARTS_IN_FLIGHT`
of `UPLOAD_PART_BYTES`): flat in the file's lines. The spool is a file because the key is the
content's digest, known only at the end, and because S3 needs the size (or a multipart upload)
before the first byte goes.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import IO, Any

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.items import MAX_ITEMS_OBJECT_BYTES
from shardops.api.openai_batch import file_line
from shardops.batchapi.objects import FILES_AREA, ApiProblem, input_key
from shardops.k8s.api import KubeClient
from shardops.state import results
from shardops.store.inputs import InputCheck
from shardops.store.installation import Stores
from shardops.store.items import campaign_items
from shardops.store.s3 import S3Store

LINES_PER_PAGE = 1000  # lines read per executor call while streaming a file back
# The largest file the operator takes as a campaign's items: a larger upload is refused as it streams.
MAX_UPLOAD_BYTES = MAX_ITEMS_OBJECT_BYTES


class Upload:
    """One upload in progress: chunks in (`feed`), checked lines and their digest to the spool."""

    def __init__(self, filename: str, shard_size: int, spool_dir: str | None = None) -> None:
        self.filename = filename
        self.check = InputCheck(filename, shard_size, batch=True, spool_dir=spool_dir)
        self.digest = hashlib.sha256()
        self.size = 0
        self._pending = b""
        self.spool: IO[bytes] = tempfile.TemporaryFile(dir=spool_dir)  # noqa: SIM115 (closed by close)

    def feed(self, chunk: bytes) -> None:
        """The next bytes; ApiProblem 400 naming the line at the first wrong one, 413 past the size
        a campaign's items object may have."""
        self.digest.update(chunk)
        self.size += len(chunk)
        if self.size > MAX_UPLOAD_BYTES:
            raise ApiProblem(
                413,
                f"{self.filename} is over {MAX_UPLOAD_BYTES} bytes: split it into several batches.",
                param="file",
            )
        self.spool.write(chunk)
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        for line in lines:
            self._line(line)

    def finish(self) -> None:
        if self._pending:
            self._line(self._pending)
            self._pending = b""
        if self.check.items == 0:
            raise ApiProblem(
                400, f"{self.filename} holds no requests: write one batch line per line.", param="file"
            )
        self.spool.seek(0)

    def _line(self, raw: bytes) -> None:
        try:
            self.check.add(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ApiProblem(
                400, f"{self.filename} line {self.check.lines + 1}: not UTF-8 text.", param="file"
            ) from None
        except ValueError as error:
            raise ApiProblem(400, f"{error}", param="file") from None

    def close(self) -> None:
        """Delete the spool and the duplicate check's file (both in the spool directory)."""
        self.spool.close()
        self.check.close()


def store_upload(store: S3Store, upload: Upload) -> str:
    """Store the checked upload in the namespace's area (skipped when those bytes are there); its digest."""
    digest = upload.digest.hexdigest()
    store.upload_once(
        input_key(store.input_prefix(FILES_AREA), digest),
        upload.spool,
        "application/x-ndjson",
        {"filename": upload.filename},
    )
    return digest


def stored_input(store: S3Store, digest: str) -> dict[str, Any] | None:
    """The uploaded file's size and metadata; None when the namespace's area has no such file."""
    return store.head(input_key(store.input_prefix(FILES_AREA), digest))


def input_lines(store: S3Store, digest: str) -> Iterator[str]:
    """The uploaded file's lines, each ending in a newline (the last one too)."""
    for line in store.open_lines(input_key(store.input_prefix(FILES_AREA), digest)):
        yield line if line.endswith("\n") else line + "\n"


def result_lines(kube: KubeClient, store: S3Store, campaign: Campaign, errors: bool) -> Iterator[str]:
    """A batch's output file (`errors` False) or error file, a JSONL line each, from its result
    store in item order: one stored result read per Done shard, as `kubectl campaign results`. The
    Campaign is read again with its Shards (the one given was read before them)."""
    campaign, shards = results.campaign_and_shards(kube, campaign.namespace, campaign.name)
    finished = results.finished_shards(
        campaign.name,
        results.work_shards(shards),
        campaign.current_status.folded,
        results.ledger_of(store, campaign),
    )
    for _, line in results.done_lines(
        results.read_verified(store), finished, lambda: campaign_items(kube, campaign, store)
    ):
        shown: JSON = file_line(line, "custom_id", batch=True)
        if (shown["error"] is not None) == errors:
            yield results.json_line(shown) + "\n"


def pages(lines: Iterable[str], size: int = LINES_PER_PAGE) -> Callable[[], Sequence[str]]:
    """The next `size` lines on each call (an empty page at the end): what the app asks its executor
    for while it streams a file, so a file of any size is read a page at a time."""
    iterator = iter(lines)
    return lambda: list(islice(iterator, size))


def batch_store(stores: Stores, campaign: Campaign) -> S3Store:
    """The batch's result store with the service's credentials: only the installation's own store
    (a campaign moved elsewhere holds its own keys, which this service never has)."""
    location = campaign.current_status.result_store
    store = stores.s3_of(campaign.namespace, location) if location is not None else None
    if store is None:
        raise ApiProblem(
            409,
            f"batch {campaign.name} has no result store this service reads (it needs the "
            "installation's S3 store).",
        )
    return store
