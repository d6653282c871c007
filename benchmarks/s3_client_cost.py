"""CPU of the worker's S3 work, boto3 against the thin client (`shardops.store.s3wire`), side by side
on one S3 server: building the client in a fresh process, and the four calls a shard makes (its item
results LIST, its committed result GET, its attempt PUT, its pointer PUT) through `S3Store`.

    SHARDOPS_S3_ENDPOINT=http://127.0.0.1:PORT SHARDOPS_S3_ACCESS_KEY_ID=... \\
    SHARDOPS_S3_SECRET_ACCESS_KEY=... SHARDOPS_S3_BUCKET=... .venv/bin/python -m benchmarks.s3_client_cost

Each client is measured in its own process (imports cached by neither), 3 times; medians printed.
Not part of `make bench`: it answers one question (what the thin client saves per worker and per
shard) and needs only an S3 server, e.g. the one `make e2e` or `make bench` starts.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import statistics
import subprocess
import sys

SHARDS = 300
REPEATS = 3


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(kind: str) -> dict[str, float]:
    """In this process: CPU seconds to import and build the `kind` client, and per shard's calls."""
    os.environ["AWS_ACCESS_KEY_ID"] = os.environ["SHARDOPS_S3_ACCESS_KEY_ID"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = os.environ["SHARDOPS_S3_SECRET_ACCESS_KEY"]
    from shardops.api.enums import StoreType
    from shardops.api.store import ResultStoreStatus
    from shardops.store.records import ResultMeta
    from shardops.store.s3 import S3Store, boto3_client_for, client_for

    location = ResultStoreStatus(
        type=StoreType.S3,
        bucket=os.environ["SHARDOPS_S3_BUCKET"],
        endpoint=os.environ["SHARDOPS_S3_ENDPOINT"],
        region=os.environ.get("SHARDOPS_S3_REGION") or "us-east-1",
    )
    start = _cpu()
    client = boto3_client_for(location) if kind == "boto3" else client_for(location)
    built = _cpu() - start
    store = S3Store(location, f"bench-s3-{secrets.token_hex(4)}", client=client)
    start = _cpu()
    for index in range(SHARDS):
        key = f"key-{index}"
        store.read_items(key, ["item"])
        store.read_result(key)
        meta = ResultMeta(campaign="bench", shard=f"s-{index}", owner="bench", attempt=1, token=1)
        stored, _ = store.store_result(key, json.dumps({"results": [{"n": index}]}), meta, 1)
        store.commit(key, stored)
    per_shard = (_cpu() - start) / SHARDS
    store.delete_prefix(store._root())
    return {"build": built, "per_shard": per_shard}


def main() -> None:
    if len(sys.argv) == 2:
        print(json.dumps(measure(sys.argv[1])))
        return
    for kind in ("boto3", "wire"):
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.s3_client_cost", kind],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            for _ in range(REPEATS)
        ]
        build = statistics.median(run["build"] for run in runs)
        per_shard = statistics.median(run["per_shard"] for run in runs)
        print(
            f"{kind:>6}: import and build the client {build * 1000:.0f} ms CPU; "
            f"a shard's four calls {per_shard * 1000:.2f} ms CPU (median of {REPEATS}, {SHARDS} shards each)"
        )


if __name__ == "__main__":
    main()
