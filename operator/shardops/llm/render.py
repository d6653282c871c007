"""Requests from templates: a sandboxed Jinja environment, strict about missing fields.

The sandbox refuses attribute access to Python internals and calls of unsafe methods, so a
template (written by whoever may edit the Campaign) cannot run code in the worker. A field the
item does not have is an error naming the field, never an empty string in the prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from shardops.api.llm import LlmSpec


class RenderError(Exception):
    """A template could not be compiled or rendered; the message names the template and why."""


def _tojson(value: Any, indent: int | None = None) -> str:
    # Jinja's own tojson escapes <, > and & for HTML; a prompt wants the JSON as it is.
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=False)


def environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    return env


@dataclass
class RequestTemplate:
    """The compiled messages of an llm block; `render` turns one item into a request body."""

    llm: LlmSpec
    model: str

    def __post_init__(self) -> None:
        env = environment()
        self.templates = []
        for number, message in enumerate(self.llm.messages):
            try:
                self.templates.append(env.from_string(message.content))
            except TemplateError as error:
                raise RenderError(
                    f"spec.worker.llm.messages[{number}].content is not a valid template: {error}"
                ) from None

    def render(self, item: Any, index: int, key: str) -> dict[str, Any]:
        context = {"item": item, "index": index, "key": key}
        messages = []
        for number, (message, template) in enumerate(zip(self.llm.messages, self.templates, strict=True)):
            try:
                content = template.render(context)
            except TemplateError as error:
                fields = ", ".join(sorted(item)) if isinstance(item, dict) else type(item).__name__
                raise RenderError(
                    f"spec.worker.llm.messages[{number}].content: {error} (the item has: {fields})"
                ) from None
            messages.append({"role": message.role, "content": content})
        body: dict[str, Any] = dict(self.llm.extra_body or {})
        body.update({"model": self.model, "messages": messages})
        if self.llm.temperature is not None:
            body["temperature"] = self.llm.temperature
        if self.llm.max_tokens is not None:
            body["max_tokens"] = self.llm.max_tokens
        if self.llm.response_format is not None:
            body["response_format"] = self.llm.response_format
        return body
