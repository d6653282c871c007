"""OpenAI Batch API files as shardops sees them: input lines as items, results as output/error lines.

An input line is `{"custom_id", "method": "POST", "url", "body"}` (the OpenAI Batch API's request
input). With spec.worker.llm.format openai-batch each such line is one item, as written: custom_id is
what the user keys on (unique in the input; shardops' own per-item key stays the item's fingerprint),
url picks the endpoint, body is the request. The built-in worker stores each answer as
`batch_result` shapes it (the upstream's status code, request id and body, verbatim), and
`output_line` / `error_line` turn a stored result into a line of OpenAI's output or error file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from shardops.api.common import Item
from shardops.api.item_errors import item_error_of

# The endpoints a batch line may name, each with its path under the Source's baseUrl (which ends in
# the version, /v1, as for the chat format).
BATCH_ENDPOINTS: Mapping[str, str] = {
    "/v1/chat/completions": "/chat/completions",
    "/v1/completions": "/completions",
    "/v1/embeddings": "/embeddings",
    "/v1/responses": "/responses",
}
CUSTOM_ID_MAX = 512
BATCH_LINE_FIELDS = frozenset({"custom_id", "method", "url", "body"})


def batch_line_problem(item: Any) -> str | None:
    """Why `item` is not an OpenAI batch input line shardops can send, or None."""
    if not isinstance(item, Mapping):
        return f"a batch line must be a JSON object, got {type(item).__name__}"
    unknown = sorted(set(item) - BATCH_LINE_FIELDS)
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}: a batch line has custom_id, method, url and body"
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= CUSTOM_ID_MAX:
        return f"custom_id must be a string of 1 to {CUSTOM_ID_MAX} characters"
    if item.get("method") != "POST":
        return f"method must be POST, got {item.get('method')!r}"
    if item.get("url") not in BATCH_ENDPOINTS:
        return f"url must be one of {', '.join(BATCH_ENDPOINTS)}, got {item.get('url')!r}"
    if not isinstance(item.get("body"), Mapping):
        return "body must be a JSON object (the request)"
    return None


class FirstLines(Protocol):
    """Where a duplicate check keeps the line each custom_id was first seen on."""

    def first_line(self, custom_id: str, number: int) -> int:
        """The line `custom_id` was first seen on: `number` (now recorded) when it is new."""
        ...


class FirstLinesInMemory:
    """A dict as large as the input read: for inputs bounded anyway (inline or ConfigMap items)."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}

    def first_line(self, custom_id: str, number: int) -> int:
        return self.lines.setdefault(custom_id, number)


class CustomIds:
    """The custom_ids of an input seen so far, to refuse the second line of one. What they are kept
    in is `first_lines` (a dict unless given: store.inputs gives files one bounded in memory); the
    check runs where an input is checked whole (the CLI, a service's upload, the operator's inline
    and ConfigMap items), never in the operator's per-shard path."""

    def __init__(self, first_lines: FirstLines | None = None) -> None:
        self.first_lines = first_lines if first_lines is not None else FirstLinesInMemory()

    def check(self, item: Item, number: int, where: str) -> None:
        """ValueError naming `where`, the line and the problem (shape, or a custom_id seen before)."""
        problem = batch_line_problem(item)
        if problem is not None:
            raise ValueError(f"{where} line {number}: {problem}")
        custom_id = str(item["custom_id"])
        first = self.first_lines.first_line(custom_id, number)
        if first != number:
            raise ValueError(
                f"{where} line {number}: custom_id {custom_id!r} is already the custom_id of line {first}; "
                "each request needs its own"
            )


def check_batch_lines(items: Iterable[Item], where: str) -> None:
    """Every line a sendable batch line, each custom_id once (ValueError naming the first wrong line)."""
    seen = CustomIds()
    for number, item in enumerate(items, start=1):
        seen.check(item, number, where)


def batch_result(status_code: int, request_id: str | None, body: Any) -> dict[str, Any]:
    """What the built-in worker stores for a batch line's answer: the upstream's, verbatim."""
    return {"statusCode": status_code, "requestId": request_id, "body": body}


def _response(result: Any, fallback_request_id: str) -> dict[str, Any] | None:
    if not isinstance(result, Mapping) or "statusCode" not in result:
        return None
    return {
        "status_code": result["statusCode"],
        "request_id": result.get("requestId") or fallback_request_id,
        "body": result.get("body"),
    }


def is_error_line(result: Any) -> bool:
    """Whether a stored result belongs in the error file (an errored item) or the output file."""
    return item_error_of(result) is not None


def output_line(line_id: str, custom_id: str, result: Any, request_id: str) -> dict[str, Any]:
    """A line of OpenAI's output file for an answered item (`request_id` when the upstream sent none)."""
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": _response(result, request_id),
        "error": None,
    }


def error_line(line_id: str, custom_id: str, result: Any, request_id: str) -> dict[str, Any]:
    """A line of OpenAI's error file for an errored item: error {code, message}, and the upstream's
    response (status code and body) when it answered. code is the provider's (context_length_exceeded,
    ...) when it gave one, else shardops' error class (invalid-input, bad-output)."""
    error = item_error_of(result) or {}
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": _response(result.get("result") if isinstance(result, Mapping) else None, request_id),
        "error": {"code": error.get("code") or error.get("class"), "message": error.get("message", "")},
    }


def file_line(line: Mapping[str, Any], field: str, batch: bool) -> dict[str, Any]:
    """One line of OpenAI's batch output file (or, for an errored item, of its error file) for a
    finished item's line (state.results.done_lines: index, key, item, result, shard). `batch`: the
    campaign's items are OpenAI batch lines, whose results hold the upstream's status code and body;
    otherwise the body is the item's result and custom_id the item's `field`. ValueError when the item
    has no such field."""
    item = line.get("item")
    if not isinstance(item, Mapping) or field not in item:
        raise ValueError(f"item {line['index']} (shard {line['shard']}) has no field {field!r} for custom_id")
    line_id, custom_id, result = f"{line['shard']}-{line['index']}", str(item[field]), line["result"]
    if is_error_line(result):
        return error_line(line_id, custom_id, result, line["key"])
    if not batch:
        result = batch_result(200, None, result)
    return output_line(line_id, custom_id, result, line["key"])
