"""Talking to the API server: raw JSON calls, the watch stream, error classification, timestamps."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.cluster.kubelet.container_config import EnvResolutionError

API_TIMEOUT = (5, 30)
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"


class NotYet(Exception):
    """Something the pod needs does not exist yet but is expected to appear (retried, then fatal)."""


def rfc3339(timestamp: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(timestamp: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def call_json(method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a client method and return the JSON body as a dict (no model (de)serialization quirks)."""
    kwargs.setdefault("_request_timeout", API_TIMEOUT)
    response = method(*args, _preload_content=False, **kwargs)
    try:
        data = response.data
        return json.loads(data) if data else {}
    finally:
        with contextlib.suppress(Exception):
            response.release_conn()


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (None, 0, 408, 429) or (exc.status or 0) >= 500
    return True


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, NotYet):
        return str(exc)
    if isinstance(exc, ApiException):
        detail = ""
        with contextlib.suppress(Exception):
            detail = json.loads(exc.body or "{}").get("message", "")
        return f"{exc.status} {exc.reason}" + (f": {detail}" if detail else "")
    return f"{type(exc).__name__}: {exc}"


def read_env_source(core: client.CoreV1Api, namespace: str, kind: str, name: str) -> Mapping[str, str] | None:
    """A ConfigMap's or Secret's data as text for container environments; None when it does not exist."""
    method = core.read_namespaced_config_map if kind == "ConfigMap" else core.read_namespaced_secret
    try:
        obj = call_json(method, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise EnvResolutionError(f"reading {kind.lower()} {name!r}: {describe_error(exc)}") from exc
    if kind == "Secret":
        return {
            k: base64.b64decode(v).decode("utf-8", errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    data = dict(obj.get("data") or {})
    for key, value in (obj.get("binaryData") or {}).items():
        data.setdefault(key, base64.b64decode(value).decode("utf-8", errors="replace"))
    return data


def json_lines(response: Any) -> Iterator[dict[str, Any]]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)
