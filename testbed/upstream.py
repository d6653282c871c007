"""An OpenAI-compatible test upstream: real HTTP on loopback, faults on demand, and a request log.

`POST /v1/chat/completions` answers like a provider (`POST /v1/embeddings` too, plainly):
`{id, model, choices: [{message, finish_reason}], usage: {prompt_tokens, completion_tokens,
total_tokens, prompt_tokens_details: {cached_tokens}}}`, with usage a pure function of the request
(so a test can recompute every cost). What it does is set on `LlmServer.behaviour` (latency, a
share of 429s with Retry-After, 500s, the API key it accepts, its models) or asked for by a
request: a user message containing `FAULT:<name>` gets

| name | answer |
| --- | --- |
| `400` | 400 invalid_request_error with a provider message |
| `context` | 400 context_length_exceeded |
| `500` | 500 server error |
| `429` | 429 with Retry-After |
| `timeout` | an answer after `behaviour.slow_seconds` (longer than the client's timeout) |
| `malformed` | 200 with a body that is not a completion |
| `notjson` | 200 whose content is not JSON |
| `schema` | 200 whose content is JSON missing the schema's required field |

`behaviour.faults_fixed` turns those faults off (the upstream fixed). Every request is logged
(`requests()`): monotonic and wall time, status, model, user agent, the user message, the usage it
was charged and the Retry-After it was told.

Run alone: `python -m testbed.upstream` (prints its base URL; port chosen free), for trying `shardops llm`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def batch_line(custom_id: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> dict[str, Any]:
    """One line of an OpenAI batch input file: a request to `url` with `body`, named `custom_id`."""
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_body(content: str, model: str = "gpt-4o-mini", max_tokens: int = 16) -> dict[str, Any]:
    """A chat completion request of one user message (`FAULT:<name>` in it asks for a fault)."""
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


@dataclass
class Behaviour:
    latency_seconds: float = 0.0
    rate_limited_share: float = 0.0  # this share of requests, drawn from a seeded generator, gets 429
    retry_after: str = "2"
    error_share: float = 0.0  # this share gets 500
    api_key: str | None = None  # None: any key (or none) is accepted
    models: tuple[str, ...] = ("test-model", "test-small")
    slow_seconds: float = 5.0
    cached_tokens: int = 0  # reported as usage.prompt_tokens_details.cached_tokens (<= prompt tokens)
    seed: int = 1
    # The fault fixed: `FAULT:<name>` requests are answered like any other (a retry of the errored
    # items then succeeds, and the log shows how many requests it made).
    faults_fixed: bool = False


@dataclass(frozen=True)
class LoggedRequest:
    monotonic: float
    wall: float
    status: int
    model: str | None
    user_agent: str
    content: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    retry_after: str | None = None


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Usage is deterministic: one token per whitespace-separated word of every message, plus 3."""
    return 3 + sum(len(str(m.get("content", "")).split()) for m in messages)


def answer_text(user: str) -> str:
    return f"answer: {user[::-1]}"


def completion_tokens(text: str) -> int:
    return max(1, len(text.split()))


@dataclass
class LlmServer:
    behaviour: Behaviour = field(default_factory=Behaviour)
    _log: list[LoggedRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.behaviour.seed)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status, headers, body = server.handle(self.path, dict(self.headers.items()), raw)
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # The client may have given up (its timeout): that is the point of FAULT:timeout.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="llmserver", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> LlmServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    # --- the endpoint ------------------------------------------------------------------------------

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, str], bytes]:
        started, wall = time.monotonic(), time.time()
        b = self.behaviour
        agent = headers.get("User-Agent", "")
        if path.endswith("/embeddings"):
            return self._embeddings(started, wall, agent, raw)
        try:
            request = json.loads(raw)
            messages = request["messages"]
            model = request.get("model")
        except (json.JSONDecodeError, KeyError, TypeError):
            return self._reply(
                started, wall, 400, None, agent, "", _error("invalid JSON body", "invalid_request_error")
            )
        user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        fault = user.split("FAULT:", 1)[1].split()[0] if "FAULT:" in user and not b.faults_fixed else None

        def reply(status: int, body: Any, extra: dict[str, str] | None = None, **usage: int) -> Any:
            return self._reply(started, wall, status, model, agent, user, body, extra or {}, **usage)

        if not path.endswith("/chat/completions"):
            return reply(404, _error(f"no route {path}", "invalid_request_error"))
        if b.api_key is not None and headers.get("Authorization") != f"Bearer {b.api_key}":
            return reply(401, _error("Incorrect API key provided.", "invalid_api_key"))
        if model not in b.models:
            return reply(404, _error(f"The model `{model}` does not exist.", "model_not_found"))
        if b.latency_seconds:
            time.sleep(b.latency_seconds)
        if fault == "timeout":
            time.sleep(b.slow_seconds)
        draw = self._draw()
        if fault == "429" or draw < b.rate_limited_share:
            return reply(
                429,
                _error("Rate limit reached for requests.", "rate_limit_exceeded"),
                {"Retry-After": b.retry_after},
            )
        if fault == "500" or (b.rate_limited_share <= draw < b.rate_limited_share + b.error_share):
            return reply(
                500, _error("The server had an error while processing your request.", "server_error")
            )
        if fault == "400":
            return reply(400, _error("Invalid value for 'temperature': too hot.", "invalid_value"))
        if fault == "context":
            return reply(
                400,
                _error("This model's maximum context length is 8 tokens.", "context_length_exceeded"),
            )
        if fault == "malformed":
            return self._reply(started, wall, 200, model, agent, user, None, raw_body=b'{"choices": "oops"')
        format_type = (request.get("response_format") or {}).get("type")
        if fault == "notjson":
            content = "Sure! Here is the JSON you asked for"
        elif fault == "schema":
            content = json.dumps({"unexpected": True})
        elif format_type in ("json_object", "json_schema"):
            content = json.dumps({"answer": answer_text(user), "words": len(user.split())})
        else:
            content = answer_text(user)
        prompt = prompt_tokens(messages)
        completion = completion_tokens(content)
        cached = min(b.cached_tokens, prompt)
        body = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(wall),
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        return reply(200, body, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)

    def _embeddings(
        self, started: float, wall: float, agent: str, raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """`POST /v1/embeddings`: one vector (its length the input's words) per input, usage in tokens."""
        request = json.loads(raw)
        inputs = request.get("input")
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs or []]
        tokens = sum(len(t.split()) for t in texts)
        body = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": [0.5] * max(len(t.split()), 1)}
                for i, t in enumerate(texts)
            ],
            "model": request.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return self._reply(
            started, wall, 200, request.get("model"), agent, " ".join(texts), body, prompt_tokens=tokens
        )

    def _reply(
        self,
        started: float,
        wall: float,
        status: int,
        model: str | None,
        agent: str,
        user: str,
        body: Any,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
        **usage: int,
    ) -> tuple[int, dict[str, str], bytes]:
        # Every answer names its request, as OpenAI's x-request-id does (a batch output line keeps it).
        headers = {"x-request-id": f"req-{len(self._log) + 1}", **(headers or {})}
        self._record(
            LoggedRequest(
                started, wall, status, model, agent, user, retry_after=headers.get("Retry-After"), **usage
            )
        )
        return status, headers, raw_body if raw_body is not None else json.dumps(body).encode()


# A response_format whose schema the server's JSON answers ({"answer", "words"}) satisfy and the
# `FAULT:schema` answer does not.
ANSWER_SCHEMA_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}, "words": {"type": "integer"}},
            "required": ["answer", "words"],
        },
    },
}


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


@contextmanager
def llm_server(behaviour: Behaviour | None = None) -> Iterator[LlmServer]:
    server = LlmServer(behaviour or Behaviour()).start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-limited-share", type=float, default=0.0)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    server = LlmServer(Behaviour(rate_limited_share=args.rate_limited_share, api_key=args.api_key)).start()
    print(server.base_url, json.dumps(asdict(server.behaviour)), flush=True)
    server.thread.join()


if __name__ == "__main__":
    main()
