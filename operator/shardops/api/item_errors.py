"""An item that failed on its own: recorded as that item's result, so the rest of its shard completes.

A command reports one with a results line `{"key", "error": {"class", "message", "code"?}, "result"?}`
(docs/worker-command.md); the runtime stores it as the item's result in the shape `errored_result`
makes, under a key no command's own result uses. A stored errored item is never run again by a retry
of its shard (the shard resumes its unfinished items only); `kubectl campaign results --failed` lists
it, and the shard's status counts it (progress.errored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardops.api.enums import ITEM_ERROR_CLASSES, ErrorClass

# The key of an errored item's stored result: namespaced like a label, so a command's own result (any
# JSON) does not carry it by accident.
ITEM_ERROR_KEY = "shardops.dev/itemError"
# An errored item's message, cut like a shard's lastError (api.shard.ERROR_MESSAGE_MAX), since it is
# shown in the same places.
ITEM_ERROR_MESSAGE_MAX = 1024
ITEM_ERROR_CODE_MAX = 128


def errored_result(
    error_class: ErrorClass, message: str, code: str | None = None, result: Any = None
) -> dict[str, Any]:
    """The stored result of an errored item: its class, message, the provider's code when it gave one,
    and what the command reported with it (`result`: for openai-batch, the upstream's answer)."""
    error: dict[str, Any] = {"class": str(error_class), "message": message[:ITEM_ERROR_MESSAGE_MAX]}
    if code:
        error["code"] = code[:ITEM_ERROR_CODE_MAX]
    stored: dict[str, Any] = {ITEM_ERROR_KEY: error}
    if result is not None:
        stored["result"] = result
    return stored


def item_error_of(result: Any) -> Mapping[str, Any] | None:
    """The error of an errored item's stored result ({class, message, code?}), None for a result."""
    if not isinstance(result, Mapping):
        return None
    error = result.get(ITEM_ERROR_KEY)
    return error if isinstance(error, Mapping) else None


def item_error_problem(error: Any) -> str | None:
    """Why a results line's `error` is not an item error the runtime may record, or None."""
    if not isinstance(error, Mapping):
        return "error must be an object {class, message}"
    classes = ", ".join(sorted(str(c) for c in ITEM_ERROR_CLASSES))
    try:
        error_class = ErrorClass(str(error.get("class")))
    except ValueError:
        return f"error.class must be one of {classes}, got {error.get('class')!r}"
    if error_class not in ITEM_ERROR_CLASSES:
        return (
            f"error.class {error_class} cannot be an item's own error (only {classes}): a failure that holds "
            "for every item is the error file's, and fails or retries the shard"
        )
    if not isinstance(error.get("message"), str):
        return "error.message must be a string"
    if error.get("code") is not None and not isinstance(error.get("code"), str):
        return "error.code must be a string when set"
    return None
