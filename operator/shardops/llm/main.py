"""`shardops llm`: the worker command that turns each item into one chat completion.

It runs under `shardops worker` like any user command (the JSONL protocol: $SHARDOPS_ITEMS_FILE in,
one line per item appended to $SHARDOPS_RESULTS_FILE, $SHARDOPS_ERROR_FILE on failure) and reads its
settings from $SHARDOPS_LLM_CONFIG, which the runtime fills from the Campaign's spec.worker.llm.
Calls are sequential: a shard is one request at a time, so maxConcurrency is the concurrency.
With SHARDOPS_PERSISTENT=1 (spec.worker.persistent, on by default for this command) one process
serves shard after shard (`serve`): one interpreter start and its imports per worker slot, not per shard.

With format chat a result is {content, finishReason, model, usage} (and json, the parsed content,
when responseFormat asks for JSON); with format openai-batch it is the upstream's answer as it came
(api.openai_batch.batch_result: status code, request id, body). Its cost is the usage times the
price table (or the token count without one), and its tokens (input, cachedInput, output) go on the
results line too, so the runtime sums them into the shard's status.

An item that fails on its own (ITEM_ERROR_CLASSES: a 400/413/422 for its request, a template field
it lacks, an answer that does not match the schema, a batch line that is not one) gets an error line
instead of a result (api/item_errors.py) and the next item goes on. Any other failure ends the
attempt: the items before it keep their results, and the error file says the class (see
upstream.py), the source, the item and, for a 429, how long to wait (retryAfterSeconds, which
becomes the shard's notBefore).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from shardops import __version__
from shardops.api.enums import ITEM_ERROR_CLASSES, ErrorClass, LlmRequestFormat
from shardops.api.llm import (
    API_KEY_ENV,
    CONFIG_ENV,
    COOLDOWN_FILE_ENV,
    LlmSpec,
    ModelPrice,
    source_api_key_env,
)
from shardops.api.money import money_text
from shardops.api.openai_batch import BATCH_ENDPOINTS, batch_line_problem, batch_result
from shardops.api.worker import PERSISTENT_ENV
from shardops.clock import utcnow
from shardops.llm.pacing import (
    Pacer,
    Share,
    cooldown_until,
    jittered,
    part_of_remaining,
    share_in,
    state_path,
)
from shardops.llm.render import RenderError, RequestTemplate
from shardops.llm.upstream import (
    CHAT_PATH,
    CallFailure,
    Completion,
    Reply,
    Upstream,
    parse_completion,
    parse_duration,
    parse_reply,
    reply_usage,
)
from shardops.logic.failures import EXIT_TEMPFAIL

EXIT_FAILED = 1
# How often a worker without a share of its shared Source looks again (the runtime rewrites the file
# at each heartbeat; a local file read, no API call).
SHARE_POLL_SECONDS = 1.0
_SNIPPET = 200


@dataclass(frozen=True)
class Settings:
    """What $SHARDOPS_LLM_CONFIG carries: the llm block, each source's rate limit, maxConcurrency."""

    llm: LlmSpec
    max_concurrency: int
    rate_limits: Mapping[str, Mapping[str, float]]
    # Sources paced to the campaign's share of a shared Source (the cooldown file's `share`).
    shared_sources: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        raw = env.get(CONFIG_ENV)
        if not raw:
            raise CallFailure(
                ErrorClass.INVALID_INPUT,
                f"${CONFIG_ENV} is not set: shardops llm runs under shardops worker, for a Campaign whose "
                "spec.worker.llm describes the requests",
            )
        value = json.loads(raw)
        return cls(
            LlmSpec.model_validate(value["llm"]),
            int(value["maxConcurrency"]),
            value.get("rateLimits", {}),
            frozenset(value.get("sharedSources", [])),
        )

    def share(self, source: str | None) -> Share:
        limit = self.rate_limits.get(source or "", {})
        return Share.of(limit.get("requestsPerMinute"), limit.get("tokensPerMinute"), self.max_concurrency)


def item_cost(price: ModelPrice | None, completion: Completion) -> Decimal:
    """tokens x price; without a price table, the tokens themselves."""
    if price is None:
        return Decimal(completion.total_tokens)
    return price.cost(completion.prompt_tokens, completion.cached_tokens, completion.completion_tokens)


def json_schema_of(response_format: Mapping[str, Any] | None) -> tuple[bool, Mapping[str, Any] | None]:
    """(content must be JSON, the schema it must match) for a response_format."""
    if not response_format:
        return False, None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return True, schema if isinstance(schema, Mapping) else None
    return kind == "json_object", None


def result_of(completion: Completion, response_format: Mapping[str, Any] | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "content": completion.content,
        "finishReason": completion.finish_reason,
        "model": completion.model,
        "usage": completion.usage,
    }
    wants_json, schema = json_schema_of(response_format)
    if not wants_json:
        return result
    snippet = (completion.content or "")[:_SNIPPET]
    try:
        parsed = json.loads(completion.content or "")
    except json.JSONDecodeError as error:
        raise CallFailure(
            ErrorClass.BAD_OUTPUT,
            f"responseFormat asks for JSON but the content is not JSON ({error.msg}; finish_reason "
            f"{completion.finish_reason}): {snippet!r}",
        ) from None
    if schema is not None:
        # Imported here: it costs a tenth of a second at every start, and most campaigns have no schema.
        from jsonschema import exceptions as schema_errors
        from jsonschema import validators

        validator_class = validators.validator_for(schema)
        mismatch = schema_errors.best_match(validator_class(schema).iter_errors(parsed))
        if mismatch is not None:
            raise CallFailure(
                ErrorClass.BAD_OUTPUT,
                f"the content does not match responseFormat's JSON schema at {mismatch.json_path}: "
                f"{mismatch.message}",
            )
    result["json"] = parsed
    return result


def read_items(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


@dataclass
class Call:
    """The shard's one source: its endpoint, price, template and pace."""

    settings: Settings
    source: str | None
    env: Mapping[str, str]
    rng: random.Random = field(default_factory=random.Random)
    wall_clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        llm = self.settings.llm
        endpoint = llm.endpoint(self.source)
        assert endpoint.model is not None and endpoint.base_url is not None
        self.model = endpoint.model
        own = next((e for e in llm.sources if e.name == self.source and e.api_key_secret), None)
        key_env = source_api_key_env(own.name) if own is not None else API_KEY_ENV
        secret = endpoint.api_key_secret
        api_key = self.env.get(key_env, "").strip() or None
        label = f"source {self.source}" if self.source else "the endpoint"
        if secret is not None and api_key is None:
            raise CallFailure(
                ErrorClass.UNAUTHORIZED,
                f"no API key for {label}: {secret.describe()} is missing or empty in the campaign's "
                f"namespace (the worker pod reads it into ${key_env}); create it with kubectl create "
                f"secret generic {secret.name} --from-literal={secret.key}=...",
            )
        pod = self.env.get("POD_NAME", "")
        self.upstream = Upstream(
            base_url=endpoint.base_url,
            api_key=api_key,
            source_label=label,
            key_origin=secret.describe() if secret else None,
            timeout=llm.timeout_seconds,
            user_agent=f"shardops-llm/{__version__} ({pod or 'local'})",
        )
        self.price = llm.price(self.source, self.model)
        self.batch = llm.format is LlmRequestFormat.OPENAI_BATCH
        try:
            self.template = None if self.batch else RequestTemplate(llm, self.model)
        except RenderError as error:
            raise CallFailure(ErrorClass.INVALID_INPUT, str(error)) from None
        share = self.settings.share(self.source)
        campaign = self.env.get("SHARDOPS_CAMPAIGN", "")
        path = state_path(pod, campaign, self.source or "") if share.limited or pod else None
        self.pacer = Pacer(share, path)
        # The campaign's share of a shared Source (requests, tokens per minute) once the runtime wrote
        # it: what part of a provider's remaining budget is this campaign's (_tighten).
        self.share_rates: tuple[float | None, float | None] = (None, None)
        cooldown = self.env.get(COOLDOWN_FILE_ENV)
        self.cooldown_path = Path(cooldown) if cooldown else None

    def answer(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The results line of one item: its result, or its own error (ITEM_ERROR_CLASSES); any
        other failure is raised, and ends the attempt."""
        where = f"item {line.get('index')}"
        completion: Completion | None = None
        try:
            path, body = self._request(line)
            reply = self._send(path, body)
            completion = parse_reply(reply) if self.batch else parse_completion(reply.data, reply.headers)
            self._tighten(completion.headers, completion.total_tokens)
            result = (
                batch_result(reply.status, reply.request_id, reply.json_body())
                if self.batch
                else result_of(completion, self.settings.llm.response_format)
            )
        except CallFailure as failure:
            if failure.error_class not in ITEM_ERROR_CLASSES:
                raise failure.about(where) from None
            # An answer refused after it came (off the schema) was paid for all the same.
            return {**self._errored(line, failure.about(where)), **self._spent(completion)}
        return {"key": line["key"], "result": result, **self._spent(completion)}

    def _spent(self, completion: Completion | None) -> dict[str, Any]:
        """The cost and tokens of an answer, for its results line (none without an answer)."""
        if completion is None:
            return {}
        return {
            # A decimal string: the results line's cost is read exactly (docs/worker-command.md).
            "cost": money_text(item_cost(self.price, completion)),
            "tokens": {
                "input": completion.prompt_tokens,
                "cachedInput": min(completion.cached_tokens, completion.prompt_tokens),
                "output": completion.completion_tokens,
            },
        }

    def _request(self, line: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The path (under baseUrl) and body of an item's request."""
        item = line.get("item")
        if not self.batch:
            assert self.template is not None
            try:
                return CHAT_PATH, self.template.render(item, int(line.get("index", 0)), str(line.get("key")))
            except RenderError as error:
                raise CallFailure(ErrorClass.INVALID_INPUT, str(error)) from None
        problem = batch_line_problem(item)
        if problem is not None:
            raise CallFailure(ErrorClass.INVALID_INPUT, f"not an OpenAI batch input line: {problem}")
        assert isinstance(item, Mapping)
        # The body as written, but for its model: the source's serves the request (and is priced).
        return BATCH_ENDPOINTS[item["url"]], {**item["body"], "model": self.model}

    def _send(self, path: str, body: Mapping[str, Any]) -> Reply:
        self._heed_share()
        self._heed_cooldown()
        started = self.pacer.wait()
        try:
            reply = self.upstream.post(path, body, utcnow())
        except CallFailure as error:
            if error.retry_after is not None:
                self.pacer.hold_pod_until(self.pacer.clock() + jittered(error.retry_after, self.rng.random()))
            raise
        usage = reply_usage(reply)
        self.pacer.spent(started, usage.total, usage.prompt, usage.completion)
        return reply

    def _errored(self, line: Mapping[str, Any], failure: CallFailure) -> dict[str, Any]:
        """The results line of an item that failed on its own; a batch line keeps the upstream's answer."""
        error: dict[str, Any] = {"class": str(failure.error_class), "message": failure.message}
        if failure.code:
            error["code"] = failure.code
        errored: dict[str, Any] = {"key": line["key"], "error": error}
        if self.batch and failure.reply is not None:
            reply = failure.reply
            errored["result"] = batch_result(reply.status, reply.request_id, reply.json_body())
        return errored

    def _heed_share(self) -> None:
        """A shared Source: pace to the campaign's current share of it; with none yet (or 0), wait for
        one, reading the file the runtime refreshes at every heartbeat."""
        if self.source is None or self.source not in self.settings.shared_sources:
            return
        while True:
            share = share_in(self.cooldown_path)
            if share is not None and all(rate is None or rate > 0 for rate in share):
                requests, tokens, input_tokens, output_tokens = share
                self.share_rates = (requests, tokens)
                self.pacer.share = Share.of(
                    requests, tokens, self.settings.max_concurrency, input_tokens, output_tokens
                )
                return
            self.pacer.sleep(SHARE_POLL_SECONDS)

    def _heed_cooldown(self) -> None:
        """Another worker's 429 with Retry-After on this source (the runtime keeps it in the cooldown
        file): no request before it is over, plus this worker's jitter."""
        until = cooldown_until(self.cooldown_path)
        if until is None:
            return
        wait = until - self.wall_clock()
        if wait > 0:
            self.pacer.hold_until(self.pacer.clock() + jittered(wait, self.rng.random()))

    def _tighten(self, headers: Mapping[str, str], tokens: int) -> None:
        """x-ratelimit-remaining-requests/-tokens with their resets: what is left of the provider's
        window, shared by the campaign's workers, spreads over the time to the reset. Tokens count in
        requests the size of this one: R tokens left are R / tokens requests' worth. On a shared
        Source the campaigns share the key's budget too: each takes its share's part of what is left
        (part_of_remaining), so the provider's word slows every campaign on the key, not one."""
        lower = {k.lower(): v for k, v in headers.items()}
        workers = self.settings.max_concurrency
        share_requests, share_tokens = self.share_rates
        remaining_requests = parse_duration(lower.get("x-ratelimit-remaining-requests"))
        if remaining_requests is not None:
            self.pacer.tighten(
                part_of_remaining(
                    remaining_requests,
                    share_requests,
                    parse_duration(lower.get("x-ratelimit-limit-requests")),
                ),
                parse_duration(lower.get("x-ratelimit-reset-requests")),
                workers,
            )
        remaining_tokens = parse_duration(lower.get("x-ratelimit-remaining-tokens"))
        if remaining_tokens is not None:
            ours = part_of_remaining(
                remaining_tokens, share_tokens, parse_duration(lower.get("x-ratelimit-limit-tokens"))
            )
            self.pacer.tighten(
                ours / max(tokens, 1),
                parse_duration(lower.get("x-ratelimit-reset-tokens")),
                workers,
            )


def write_error(path: str | None, failure: CallFailure, source: str | None) -> None:
    if not path:
        return
    error: dict[str, Any] = {"class": str(failure.error_class), "message": failure.message}
    if source:
        error["source"] = source
    if failure.retry_after is not None:
        error["retryAfterSeconds"] = failure.retry_after
    Path(path).write_text(json.dumps(error), encoding="utf-8")


def run(env: Mapping[str, str] | None = None, stderr: TextIO = sys.stderr) -> int:
    env = os.environ if env is None else env
    source = env.get("SHARDOPS_SOURCE") or None
    try:
        call = Call(Settings.from_env(env), source, env)
        with open(env["SHARDOPS_RESULTS_FILE"], "a", encoding="utf-8") as results:
            for line in read_items(Path(env["SHARDOPS_ITEMS_FILE"])):
                results.write(json.dumps(call.answer(line), separators=(",", ":")) + "\n")
                results.flush()
    except CallFailure as failure:
        write_error(env.get("SHARDOPS_ERROR_FILE"), failure, source)
        print(f"shardops llm: {failure.error_class}: {failure.message}", file=stderr)
        return EXIT_TEMPFAIL if failure.error_class.retryable else EXIT_FAILED
    return 0


def serve(
    env: Mapping[str, str],
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> int:
    """The persistent protocol (spec.worker.persistent): one request line {shard, env} from stdin per
    shard, run as `run` would run it with the process's environment plus the request's, answered with
    {shard, exit} on stdout; 0 at the end of input. A request line that cannot be read ends the process
    with EXIT_FAILED: the runtime fails that shard naming the command's exit."""
    for line in iter(stdin.readline, ""):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            shard_env = {**env, **request["env"]}
        except (ValueError, KeyError, TypeError) as error:
            print(f"shardops llm: bad request line {line[:80]!r}: {error!r}", file=stderr)
            return EXIT_FAILED
        code = run(shard_env, stderr)
        stdout.write(json.dumps({"shard": request.get("shard"), "exit": code}) + "\n")
        stdout.flush()
    return 0


def main(env: Mapping[str, str] | None = None) -> int:
    """`shardops llm`: a persistent process when the runtime starts it as one, else one shard."""
    env = os.environ if env is None else env
    if env.get(PERSISTENT_ENV) == "1":
        return serve(dict(env))
    return run(env)
