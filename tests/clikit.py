"""Builders shared by the `kubectl campaign` tests (no tests here): campaigns and shards as the API
server returns them, failures for `FakeKube.fail` (the in-memory API server is `fakekube`), and `run`,
the command run against a FakeKube with its exit code and output."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardops.api.common import JSON
from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_LABEL
from shardops.cli import campaign as cli
from shardops.cli.campaign_client import Client
from shardops.k8s.api import CAMPAIGNS, SHARDS, ApiError, Forbidden
from shardops.logic.timefmt import rfc3339
from tests.fakekube import Call, FakeKube

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def t(seconds_ago: float) -> str:
    return rfc3339(ago(seconds_ago))


def campaign_body(
    name: str = "papers",
    namespace: str = "ns",
    *,
    items: int = 4,
    shard_size: int = 1,
    status: JSON | None = None,
    annotations: Mapping[str, str] | None = None,
    resource_version: str = "100",
    **spec: Any,
) -> JSON:
    body: JSON = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Campaign",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": resource_version,
            "creationTimestamp": t(3600),
        },
        "spec": {
            "items": [{"n": i} for i in range(items)],
            "shardSize": shard_size,
            "worker": {"image": "shardops:dev", "command": ["agent"]},
            **spec,
        },
    }
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if status is not None:
        body["status"] = status
    return body


def history(
    *entries: tuple[str, str, float, int] | tuple[str, str, float, int, dict[str, Any]],
) -> list[JSON]:
    """(phase, reason, seconds ago, attempt[, extra fields]) -> status.history entries."""
    out = []
    for entry in entries:
        phase, reason, seconds, attempt = entry[:4]
        extra: dict[str, Any] = entry[4] if len(entry) > 4 else {}  # type: ignore[misc]
        out.append({"phase": phase, "at": t(seconds), "reason": reason, "attempt": attempt, **extra})
    return out


def shard_body(
    campaign: str,
    index: int,
    phase: str | None,
    *,
    namespace: str = "ns",
    attempt: int = 1,
    status: JSON | None = None,
    source: str | None = None,
    shard_class: str = "work",
    managers: Sequence[str] = ("shardops-operator",),
    uid: str | None = None,
) -> JSON:
    name = f"{campaign}-{index:05d}" if shard_class == "work" else f"{campaign}-finalize"
    spec: JSON = {
        "campaign": campaign,
        "index": index,
        "shardClass": shard_class,
        "idempotencyKey": f"key-{index}",
    }
    if shard_class == "work":
        spec["items"] = [{"n": index}]
        spec["itemRange"] = {"start": index, "end": index + 1}
    if source:
        spec["source"] = source
    body: JSON = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "Shard",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": "7",
            "labels": {CAMPAIGN_LABEL: campaign},
            "creationTimestamp": t(3000),
            "managedFields": [
                {"manager": "shardops-operator", "operation": "Update", "apiVersion": API_GROUP_VERSION},
                *(
                    {"manager": m, "operation": "Update", "subresource": "status", "time": t(60)}
                    for m in managers
                ),
            ],
        },
        "spec": spec,
    }
    if phase is not None:
        body["status"] = {"phase": phase, "attempt": attempt, **(status or {})}
    return body


def done_status(
    seconds_ago: float, *, attempt: int = 1, cost: float = 0.0, fingerprint: str = "sha256:ab"
) -> JSON:
    result = {"ref": "shardops-result-x", "fingerprint": fingerprint, "bytes": 10} if fingerprint else None
    status: JSON = {
        "cost": cost,
        "progress": {"done": 1, "total": 1},
        "history": history(
            ("Pending", "Materialized", seconds_ago + 20, 1),
            ("Running", "Claimed", seconds_ago + 10, attempt, {"owner": "w-1"}),
            ("Done", "Completed", seconds_ago, attempt, {"owner": "w-1"}),
        ),
    }
    if result:
        status["result"] = result
    return status


def forbidden(call: Call) -> BaseException:
    return Forbidden(
        403, "Forbidden", f'cannot {call.method.lower()} at {call.path}: User "bob" is forbidden'
    )


def unauthorized(call: Call) -> BaseException:
    return ApiError(401, "Unauthorized", "Unauthorized")


def dumps(body: JSON) -> str:
    return json.dumps(body)


class Run:
    """What one `kubectl campaign` run returned and printed."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def run(kube: FakeKube, *argv: str) -> Run:
    """`kubectl campaign ARGV` against `kube`, at NOW."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), make_client=lambda _: Client(kube), stdout=out, stderr=err, clock=lambda: NOW)  # type: ignore[arg-type]
    return Run(code, out.getvalue(), err.getvalue())


def cluster(*bodies: dict, **kwargs: Any) -> FakeKube:
    """A FakeKube holding these Campaign and Shard bodies."""
    kube = FakeKube(**kwargs)
    for body in bodies:
        kube.add(SHARDS if body["kind"] == "Shard" else CAMPAIGNS, body)
    return kube


def chat_completion(text: str) -> JSON:
    """A chat completion body as an upstream sends it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
