"""`kubectl campaign apply -f CAMPAIGN.yaml --items FILE`: start a campaign from a local JSONL file.

Uploads FILE (JSONL, or gzip-compressed JSONL when it ends in .gz) to the S3 store, content-
addressed under `<prefix>/<namespace>/inputs/<campaign>/<sha256>.jsonl[.gz]` (an upload of the
same bytes is skipped), sets `spec.itemsFrom.object` to it (bucket included, so it does not
matter which bucket the campaign's results go to), and creates the Campaign, or updates its spec
when it exists. Every line is checked before anything is uploaded, with the same line-numbered
errors the operator gives. The store is the manifest's `spec.resultStore.s3` with `--bucket` /
`--s3-endpoint` / `--prefix` over it; credentials from AWS_* in the environment, else from the
manifest's credentialsSecret (read with your own RBAC).
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from shardops.api.campaign import CampaignSpec
from shardops.api.common import JSON
from shardops.api.enums import LlmRequestFormat, StoreType
from shardops.api.store import DEFAULT_S3_PREFIX, ResultStoreStatus
from shardops.cli.campaign_client import EXIT_OK, EXIT_USAGE, CliError, bad_state, no_access
from shardops.cli.campaign_results import user_s3_store
from shardops.cli.command import Context
from shardops.k8s.api import CAMPAIGNS, AlreadyExists
from shardops.store.inputs import InputCheck
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store

_CHUNK = 1 << 20


def usage(message: str) -> CliError:
    return CliError(EXIT_USAGE, message)


def _lines(path: Path) -> Iterator[str]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        yield from handle


def check_items(path: Path, shard_size: int, batch: bool = False) -> int:
    """The number of items in FILE; CliError at the first line that is not a JSON object, or at the
    first shard (`shard_size` items) too big for its Shard: the operator would refuse the campaign.
    `batch` (llm format openai-batch): also at the first line that is not an OpenAI batch input line
    or repeats an earlier line's custom_id (kept in a temporary SQLite file past
    `CUSTOM_IDS_IN_MEMORY` of them, deleted on return)."""
    with InputCheck(str(path), shard_size, batch) as check:
        try:
            for line in _lines(path):
                check.add(line)
        except ValueError as error:
            raise bad_state(f"{error}: nothing was uploaded") from None
        except (OSError, EOFError) as error:
            raise bad_state(
                f"{path}: not readable as JSONL{' (gzip)' if path.name.endswith('.gz') else ''}: {error}"
            ) from None
    if check.items == 0:
        raise bad_state(f"{path} holds no items: write one JSON object per line")
    return check.items


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _location(ctx: Context, spec: JSON) -> ResultStoreStatus:
    own = ((spec.get("resultStore") or {}).get("s3")) or {}
    args = ctx.args
    bucket = args.bucket or own.get("bucket")
    if not bucket:
        raise usage(
            "--items needs the S3 bucket to upload to: give --bucket, or set spec.resultStore.s3.bucket "
            "in the manifest"
        )
    return ResultStoreStatus(
        type=StoreType.S3,
        endpoint=args.s3_endpoint or own.get("endpoint"),
        region=own.get("region"),
        bucket=bucket,
        prefix=args.prefix if args.prefix is not None else own.get("prefix", DEFAULT_S3_PREFIX),
        credentials_secret=own.get("credentialsSecret"),
    )


def upload(store: S3Store, path: Path, campaign: str) -> str:
    """Upload FILE content-addressed; its key. Skipped when an object of that key exists."""
    suffix = ".jsonl.gz" if path.name.endswith(".gz") else ".jsonl"
    key = f"{store.input_prefix(campaign)}{_digest(path)}{suffix}"
    with path.open("rb") as handle:
        store.upload_once(
            key, handle, "application/gzip" if suffix.endswith(".gz") else "application/x-ndjson"
        )
    return key


def run_apply(ctx: Context) -> int:
    args = ctx.args
    manifest = yaml.safe_load(Path(args.filename).read_text(encoding="utf-8"))
    if not isinstance(manifest, dict) or manifest.get("kind") != "Campaign":
        raise usage(f"{args.filename} is not a Campaign manifest")
    metadata = manifest.setdefault("metadata", {})
    namespace = args.namespace or metadata.get("namespace") or ctx.namespace
    name = metadata.get("name")
    if not name:
        raise usage(f"{args.filename}: metadata.name is missing")
    spec: JSON = manifest.setdefault("spec", {})
    if args.items:
        path = Path(args.items)
        # A shardSize the API server will refuse is its to name; the check then takes the default.
        shard_size = spec.get("shardSize")
        if not isinstance(shard_size, int) or shard_size < 1:
            shard_size = CampaignSpec.model_fields["shard_size"].default
        llm = (spec.get("worker") or {}).get("llm") or {}
        count = check_items(path, shard_size, batch=llm.get("format") == LlmRequestFormat.OPENAI_BATCH)
        location = _location(ctx, spec)
        try:
            store = user_s3_store(ctx, location, namespace)
            key = upload(store, path, name)
        except StoreUnavailable as error:
            raise no_access(f"cannot upload {path}: {error}") from None
        spec.pop("items", None)
        spec["itemsFrom"] = {"object": {"key": key, "bucket": location.bucket}}
        ctx.err(f"uploaded {count} item(s) from {path} to s3://{location.bucket}/{key}")
    metadata["namespace"] = namespace
    try:
        ctx.client.call(
            f"create campaign {name}", lambda: ctx.client.kube.create(CAMPAIGNS, namespace, manifest)
        )
        ctx.out(f"campaign.shardops.dev/{name} created")
    except AlreadyExists:
        ctx.client.call(
            f"patch campaign {name}",
            lambda: ctx.client.kube.patch(CAMPAIGNS, namespace, name, {"spec": spec}),
        )
        ctx.out(f"campaign.shardops.dev/{name} configured")
    return EXIT_OK
