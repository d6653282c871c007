"""The built-in LLM worker's settings: `spec.worker.llm`, its request template and its price table.

A Campaign whose worker has an `llm` block runs `shardops llm` (no program of the user's): each
item becomes one request to an OpenAI-compatible endpoint. With format chat (the default) the
request is a `/chat/completions` one rendered from the templates here over the item's fields; with
format openai-batch each item is a line of an OpenAI Batch API input file (api/openai_batch.py),
sent as written to the endpoint its url names, the model replaced by the source's. The API key is
read from a Secret through the worker pod's environment; the spec names the Secret, never the key.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    Money,
    SourceName,
    SpecModel,
    cel_rules,
)
from shardops.api.enums import LlmRequestFormat

SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Templates travel to the command in one environment variable (Linux caps one at 128 KiB), with
# the rest of the block; these bounds keep the whole block well under that.
TEMPLATE_MAX = 32768
MAX_MESSAGES = 32
MAX_PRICES = 64
MAX_LLM_SOURCES = 32
URL_MAX = 2048
MODEL_NAME_MAX = 256
DEFAULT_TIMEOUT_SECONDS = 120
# The environment variable of the worker pod that carries the default API key, and the prefix of
# the per-source ones (the source name follows); fed by secretKeyRef from the named Secret.
API_KEY_ENV = "SHARDOPS_LLM_API_KEY"
SOURCE_API_KEY_ENV_PREFIX = "SHARDOPS_LLM_API_KEY_"
# The environment variable the worker runtime hands the command its settings in (JSON).
CONFIG_ENV = "SHARDOPS_LLM_CONFIG"
# The environment variable naming the file where the worker runtime keeps the cooldown of the
# shard's source (after a 429 with Retry-After anywhere in the campaign); the command reads it
# before each request.
COOLDOWN_FILE_ENV = "SHARDOPS_COOLDOWN_FILE"
# The key of that file holding the campaign's share of a shared Source ({requestsPerMinute,
# tokensPerMinute, inputTokensPerMinute, outputTokensPerMinute}, per minute for all the campaign's
# workers), which the command paces to.
COOLDOWN_FILE_SHARE_KEY = "share"
# The rates under it, in this order (the runtime writes them, the command reads them).
COOLDOWN_FILE_SHARE_RATES = (
    "requestsPerMinute",
    "tokensPerMinute",
    "inputTokensPerMinute",
    "outputTokensPerMinute",
)
TOKENS_PER_PRICE_UNIT = 1_000_000

Template = Annotated[str, Field(max_length=TEMPLATE_MAX)]


class SecretKeyRef(SpecModel):
    """A key of a Secret in the campaign's namespace."""

    name: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Secret.",
    )
    key: str = Field(
        default="api-key",
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=SECRET_KEY_PATTERN,
        description="Key in the Secret whose value is the API key. Default api-key.",
    )

    def describe(self) -> str:
        return f"Secret {self.name} key {self.key}"


class ChatMessage(SpecModel):
    """One chat message of the request; content is a template over the item's fields."""

    role: str = Field(
        min_length=1,
        max_length=64,
        description="Message role as the provider names it: system, developer, user or assistant.",
    )
    content: Template = Field(
        description=(
            "Message text, a Jinja template over the item: {{ item.question }}, {{ index }}, {{ key }}, "
            "{{ item | tojson }}. A field the item lacks is an error (invalid-input), never an empty string."
        ),
    )


class TokenPrice(SpecModel):
    """What a model's tokens cost, per million, in the budget's unit (for example USD)."""

    input_per_million: Money = Field(description="Price of one million prompt tokens. Required.")
    cached_input_per_million: Money | None = Field(
        default=None,
        description=(
            "Price of one million prompt tokens the provider served from its cache "
            "(usage.prompt_tokens_details.cached_tokens). Default: inputPerMillion."
        ),
    )
    output_per_million: Money = Field(description="Price of one million completion tokens. Required.")

    def cost(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        """tokens x price: cached prompt tokens at the cached price, the rest at the input price."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = (
            self.input_per_million if self.cached_input_per_million is None else self.cached_input_per_million
        )
        total = (
            (prompt_tokens - cached) * self.input_per_million
            + cached * cached_price
            + completion_tokens * self.output_per_million
        )
        return total / TOKENS_PER_PRICE_UNIT


class ModelPrice(TokenPrice):
    """What one model costs, per million tokens, in the budget's unit (for example USD)."""

    model: str = Field(min_length=1, max_length=MODEL_NAME_MAX, description="Model name as sent in requests.")
    source: SourceName | None = Field(
        default=None,
        description="The source this price applies to. Default: every source that calls this model.",
    )


class LlmEndpoint(SpecModel):
    """Where one source's requests go: endpoint, model and key, each overriding the block's default."""

    name: SourceName = Field(description="A source declared in spec.sources.")
    base_url: str | None = Field(
        default=None,
        max_length=URL_MAX,
        pattern=r"^https?://",
        description="Base URL of this source's OpenAI-compatible API. Default: llm.baseUrl.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=MODEL_NAME_MAX,
        description="Model of this source. Default: llm.model.",
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None, description="The Secret holding this source's API key. Default: llm.apiKeySecret."
    )


class LlmSpec(SpecModel):
    """Calls to an OpenAI-compatible chat completions endpoint, one request per item, sequentially."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            rules.LLM_ENDPOINTS_UNIQUE, rules.LLM_PRICES_COVER_MODELS, rules.LLM_FORMAT_FIELDS
        )
    )

    # An explicit setting, not detected from the items: a chat campaign's items may well have fields
    # named url or body, and the format decides what the block must hold (messages or none), which
    # admission checks before a single item is read.
    format: LlmRequestFormat = Field(
        default=LlmRequestFormat.CHAT,
        description=(
            "chat: each item fills the message templates below (one chat completion per item). "
            "openai-batch: each item is a line of an OpenAI Batch API input file, {custom_id, method, url, "
            "body}; the body is sent as written to <baseUrl> + the url's path after /v1, its model "
            "replaced by the source's model, and the result keeps the upstream's status code and response "
            "body (kubectl campaign results --format openai). Default chat."
        ),
    )

    base_url: str = Field(
        max_length=URL_MAX,
        pattern=r"^https?://",
        description=(
            "Base URL of the OpenAI-compatible API, up to and including the version: "
            "https://api.openai.com/v1, http://vllm.models.svc:8000/v1, http://ollama:11434/v1, a LiteLLM "
            "proxy's URL. Requests go to <baseUrl>/chat/completions. Required."
        ),
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description=(
            "The Secret (in the campaign's namespace) whose key holds the API key, sent as "
            "Authorization: Bearer. Default: no key (local servers)."
        ),
    )
    model: str = Field(
        min_length=1, max_length=MODEL_NAME_MAX, description="Model name sent in requests. Required."
    )
    messages: list[ChatMessage] = Field(
        default_factory=list,
        max_length=MAX_MESSAGES,
        description=(
            "The chat messages of each request, templated. Required with format chat, unset with "
            "openai-batch."
        ),
    )
    temperature: float | None = Field(
        default=None, ge=0, le=2, description="Sampling temperature. Default: the provider's."
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Most completion tokens per request (max_tokens). Default: the provider's.",
    )
    response_format: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Passed through as response_format, for example {type: json_object} or {type: json_schema, "
            "json_schema: {name: answer, schema: {...}}}. With either, the content must parse as JSON and "
            "the result holds it parsed (json); with a schema it must also validate against the schema, "
            "else the shard fails with class bad-output naming the item. Default: plain text."
        ),
    )
    extra_body: dict[str, Any] | None = Field(
        default=None,
        description=(
            "More request fields passed through as is (top_p, seed, stop, ...); the fields above win. "
            "Default none."
        ),
    )
    timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        gt=0,
        le=3600,
        description="Seconds one request may take; then the shard fails with class timeout. Default 120.",
    )
    prices: list[ModelPrice] = Field(
        default_factory=list,
        max_length=MAX_PRICES,
        description=(
            "Price table: each item's cost is its tokens times its model's price, so spec.budget and "
            "maxPerShard are in money. A price for the source and model wins over one for the model alone. "
            "Default: no table, and then cost is counted in tokens (prompt + completion)."
        ),
    )
    sources: list[LlmEndpoint] = Field(
        default_factory=list,
        max_length=MAX_LLM_SOURCES,
        description=(
            "Per-source endpoint, model and key, for sources (and fallbacks) served by another provider "
            "or model. A source not listed uses baseUrl, model and apiKeySecret. Default none."
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LlmSpec:
        problems: list[str] = []
        names = [endpoint.name for endpoint in self.sources]
        if len(set(names)) != len(names):
            problems.append(rules.LLM_ENDPOINTS_UNIQUE.message)
        unpriced = self.models_without_price()
        if unpriced:
            problems.append(f"{rules.LLM_PRICES_COVER_MODELS.message} (no price: {', '.join(unpriced)})")
        if self.format is LlmRequestFormat.OPENAI_BATCH:
            chat_only = self.messages or self.response_format is not None or self.extra_body is not None
            if chat_only or self.temperature is not None or self.max_tokens is not None:
                problems.append(rules.LLM_FORMAT_FIELDS.message)
        elif not self.messages:
            problems.append(rules.LLM_FORMAT_FIELDS.message)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def endpoint(self, source: str | None) -> LlmEndpoint:
        """The endpoint for `source`, with every unset field filled from the block's defaults."""
        override = next((e for e in self.sources if e.name == source), None)
        return LlmEndpoint(
            name=source or "default",
            base_url=(override and override.base_url) or self.base_url,
            model=(override and override.model) or self.model,
            api_key_secret=(override and override.api_key_secret) or self.api_key_secret,
        )

    def price(self, source: str | None, model: str) -> ModelPrice | None:
        """The price of `model` on `source`: the source's own entry first, then the model's."""
        exact = next((p for p in self.prices if p.model == model and p.source == source), None)
        return exact or next((p for p in self.prices if p.model == model and p.source is None), None)

    def models_without_price(self) -> list[str]:
        """Models the table must price but does not (empty table: none, cost is in tokens).

        The same test as the CRD's rule: llm.model needs an entry without source (any source may
        use it), a source's own model an entry for that source or without source. So `price()`
        finds an entry for every source and model the worker can call.
        """
        if not self.prices:
            return []
        missing = [] if self.price(None, self.model) else [self.model]
        missing += [
            f"{e.name}/{e.model}" for e in self.sources if e.model and not self.price(e.name, e.model)
        ]
        return missing

    def identity(self) -> dict[str, Any]:
        """What shapes a result, for the idempotency key: the requests, not prices or timeouts.

        Changing a template or a model recomputes; changing a price, a timeout or the Secret of a
        key reuses results. The default format (chat) is left out, as before there was a format: the
        results of campaigns written before it stay theirs.
        """
        identity = self.model_dump(
            mode="json",
            by_alias=True,
            exclude_none=True,
            exclude={
                "prices": True,
                "timeout_seconds": True,
                "api_key_secret": True,
                "sources": {"__all__": {"api_key_secret"}},
            },
        )
        if self.format is LlmRequestFormat.CHAT:
            del identity["format"]
        return identity

    def api_key_env(self) -> list[tuple[str, SecretKeyRef]]:
        """The worker pod's environment variables that carry API keys, with the Secret feeding each."""
        env = [(API_KEY_ENV, self.api_key_secret)] if self.api_key_secret else []
        env += [
            (source_api_key_env(e.name), e.api_key_secret)
            for e in self.sources
            if e.api_key_secret is not None
        ]
        return env


def source_api_key_env(source: str) -> str:
    """The environment variable of a source's own API key (source names are valid variable names)."""
    return SOURCE_API_KEY_ENV_PREFIX + source
