"""One chat completion over HTTP, and what its failures mean in shardops' retry classes.

| upstream answer | class | retried |
| --- | --- | --- |
| 429 (Retry-After, retry-after-ms, x-ratelimit-reset-*: the shard's notBefore) | rate-limited | yes |
| 429 with code insufficient_quota (the account is out of credit) | unauthorized | no |
| 408, 504, a request over timeoutSeconds | timeout | yes |
| other 5xx, connection refused or reset, a 200 whose body is not a completion | unavailable | yes |
| 401, 403 (the message names the Secret of the key) | unauthorized | no |
| 404, or code model_not_found (unknown model or wrong baseUrl) | not-found | no |
| 400, 413, 422 (context length included), with the provider's message | invalid-input | no |
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from shardops.api.enums import ErrorClass
from shardops.proxies import pool_for

_SNIPPET = 300
CHAT_PATH = "/chat/completions"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


class CallFailure(Exception):
    """An item that got no usable answer: its class, message and the wait the upstream asked for
    (a call that failed here, or a reply or template the command refused)."""

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        retry_after: float | None = None,
        reply: Reply | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.retry_after = retry_after
        # The upstream's answer when it gave one (an openai-batch item keeps it), and its error code.
        self.reply = reply
        self.code = code

    def about(self, where: str) -> CallFailure:
        """The same failure with `where` (the item) in front of its message."""
        return CallFailure(
            self.error_class, f"{where}: {self.message}", self.retry_after, self.reply, self.code
        )


@dataclass(frozen=True)
class Reply:
    """One HTTP answer of the upstream, as it came."""

    status: int
    data: bytes
    headers: Mapping[str, str]

    @property
    def request_id(self) -> str | None:
        lower = {k.lower(): v for k, v in self.headers.items()}
        return lower.get("x-request-id") or lower.get("request-id")

    def json_body(self) -> Any:
        """The body parsed as JSON, or its text when it is not JSON (kept either way, never dropped)."""
        try:
            return json.loads(self.data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self.data[:_SNIPPET].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Completion:
    content: str | None
    finish_reason: str | None
    model: str | None
    usage: dict[str, Any]
    headers: Mapping[str, str]

    # Chat and completions name tokens prompt_/completion_tokens, the Responses API input_/output_tokens.
    @property
    def prompt_tokens(self) -> int:
        return _count(self.usage.get("prompt_tokens", self.usage.get("input_tokens")))

    @property
    def completion_tokens(self) -> int:
        return _count(self.usage.get("completion_tokens", self.usage.get("output_tokens")))

    @property
    def cached_tokens(self) -> int:
        details = self.usage.get("prompt_tokens_details", self.usage.get("input_tokens_details"))
        return _count(details.get("cached_tokens")) if isinstance(details, dict) else 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_duration(text: str | None) -> float | None:
    """Seconds in a rate-limit header: `12`, `1.5`, `20ms`, `6m0s`, `1h2m3.5s` (OpenAI's form)."""
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def _header_wait(value: str | None, now: dt.datetime) -> float | None:
    """A wait from a header that is a duration or a date (HTTP-date or RFC 3339)."""
    seconds = parse_duration(value)
    if seconds is not None or value is None:
        return seconds
    when: dt.datetime | None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        try:
            when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max((when - now).total_seconds(), 0.0)


def rate_limit_wait(headers: Mapping[str, str], now: dt.datetime) -> float | None:
    """How long a 429 asks to wait: the longest of retry-after-ms, Retry-After, and the reset of each
    x-ratelimit budget that is used up (remaining 0). None when the headers say nothing."""
    lower = {k.lower(): v for k, v in headers.items()}
    waits: list[float] = []
    millis = parse_duration(lower.get("retry-after-ms"))
    if millis is not None:
        waits.append(millis / 1000)
    after = _header_wait(lower.get("retry-after"), now)
    if after is not None:
        waits.append(after)
    for budget in ("requests", "tokens"):
        remaining = parse_duration(lower.get(f"x-ratelimit-remaining-{budget}"))
        reset = _header_wait(lower.get(f"x-ratelimit-reset-{budget}"), now)
        if reset is not None and (remaining is None or remaining < 1):
            waits.append(reset)
    return max(waits) if waits else None


def classify_status(status: int, code: str | None) -> ErrorClass:
    if code == "insufficient_quota":
        return ErrorClass.UNAUTHORIZED
    if code == "model_not_found" or status in (404, 410):
        return ErrorClass.NOT_FOUND
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status in (408, 504):
        return ErrorClass.TIMEOUT
    if status in (401, 403):
        return ErrorClass.UNAUTHORIZED
    if status >= 500:
        return ErrorClass.UNAVAILABLE
    if 400 <= status < 500:
        return ErrorClass.INVALID_INPUT
    return ErrorClass.UNKNOWN


def provider_error(body: bytes) -> tuple[str, str | None]:
    """The provider's own message and code from an error body ({"error": {"message", "code"}}), or the
    body's first bytes when it has none."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, dict) and error.get("message"):
        code = error.get("code") or error.get("type")
        return str(error["message"]), None if code is None else str(code)
    if isinstance(error, str) and error:
        return error, None
    if isinstance(value, dict) and isinstance(value.get("detail"), str):  # vLLM / FastAPI style
        return value["detail"], None
    text = body[:_SNIPPET].decode("utf-8", errors="replace").strip()
    return text or "(empty body)", None


def parse_completion(body: bytes, headers: Mapping[str, str]) -> Completion:
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    choices = value.get("choices") if isinstance(value, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        snippet = body[:_SNIPPET].decode("utf-8", errors="replace")
        raise CallFailure(ErrorClass.UNAVAILABLE, f"malformed response, not a chat completion: {snippet!r}")
    assert isinstance(value, dict)
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    usage = value.get("usage")
    if not isinstance(usage, dict):
        raise CallFailure(
            ErrorClass.UNAVAILABLE,
            "response has no usage (prompt_tokens, completion_tokens): its cost cannot be counted",
        )
    content = message.get("content")
    return Completion(
        content=content if isinstance(content, str) else None,
        finish_reason=choice.get("finish_reason"),
        model=value.get("model") if isinstance(value.get("model"), str) else None,
        usage=usage,
        headers=headers,
    )


def parse_reply(reply: Reply) -> Completion:
    """The usage of a 200 answer of any batch endpoint (chat, completions, embeddings, responses),
    kept as the body has it; the body itself is the result. A body that is not a JSON object, or has
    no usage to count its cost by, is a broken answer (unavailable: retried)."""
    try:
        value = json.loads(reply.data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    usage = value.get("usage") if isinstance(value, dict) else None
    if not isinstance(usage, dict):
        snippet = reply.data[:_SNIPPET].decode("utf-8", errors="replace")
        raise CallFailure(
            ErrorClass.UNAVAILABLE,
            f"response is not a JSON object with usage, so its cost cannot be counted: {snippet!r}",
        )
    assert isinstance(value, dict)
    model = value.get("model")
    return Completion(None, None, model if isinstance(model, str) else None, usage, reply.headers)


@dataclass(frozen=True)
class Usage:
    """The tokens an answer used, in all and split into prompt and completion."""

    total: int = 0
    prompt: int = 0
    completion: int = 0


def reply_usage(reply: Reply) -> Usage:
    """The tokens a 200 answer used, for pacing (none when its body says none)."""
    try:
        completion = parse_reply(reply)
    except CallFailure:
        return Usage()
    return Usage(completion.total_tokens, completion.prompt_tokens, completion.completion_tokens)


@dataclass
class Upstream:
    """The endpoint of one source: POST <baseUrl>/chat/completions, no retries of its own (the
    shard's retries are the scheduler's), one connection pool for the shard's sequential calls."""

    base_url: str
    api_key: str | None
    source_label: str
    key_origin: str | None
    timeout: float
    user_agent: str

    def __post_init__(self) -> None:
        # Through HTTPS_PROXY/HTTP_PROXY unless NO_PROXY names the endpoint's host.
        self.pool = pool_for(self.url, retries=False, timeout=urllib3.Timeout(total=self.timeout))

    @property
    def url(self) -> str:
        return self.url_of(CHAT_PATH)

    def url_of(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    def complete(self, body: Mapping[str, Any], now: dt.datetime) -> Completion:
        reply = self.post(CHAT_PATH, body, now)
        return parse_completion(reply.data, reply.headers)

    def post(self, path: str, body: Mapping[str, Any], now: dt.datetime) -> Reply:
        """POST `body` to <baseUrl><path>: the 200 answer as it came, else CallFailure (with the reply)."""
        headers = {"Content-Type": "application/json", "User-Agent": self.user_agent}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.url_of(path)
        where = f"{self.source_label} ({url})"
        try:
            response = self.pool.request(
                "POST", url, body=json.dumps(body).encode(), headers=headers, preload_content=True
            )
        except (urllib3.exceptions.TimeoutError, TimeoutError):
            raise CallFailure(
                ErrorClass.TIMEOUT, f"no answer from {where} within timeoutSeconds {self.timeout:g}"
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise CallFailure(ErrorClass.UNAVAILABLE, f"cannot reach {where}: {error}") from None
        reply = Reply(response.status, response.data, dict(response.headers.items()))
        if response.status != 200:
            raise self._error(reply, response.reason, now)
        return reply

    def _error(self, reply: Reply, reason: str | None, now: dt.datetime) -> CallFailure:
        status, headers = reply.status, reply.headers
        message, code = provider_error(reply.data)
        error_class = classify_status(status, code)
        text = f"{status} {reason or ''}".strip() + f" from {self.source_label}: {message.rstrip('.')}"
        if error_class is ErrorClass.UNAUTHORIZED and code != "insufficient_quota":
            text += (
                f"; the API key from {self.key_origin} was refused: check that Secret"
                if self.key_origin
                else "; no API key was sent: set spec.worker.llm.apiKeySecret"
            )
        if error_class is ErrorClass.NOT_FOUND:
            text += "; check the model name and baseUrl"
        wait = rate_limit_wait(headers, now) if error_class is ErrorClass.RATE_LIMITED else None
        return CallFailure(error_class, text, wait, reply, code)
