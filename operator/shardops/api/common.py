"""Building blocks shared by the Campaign and Shard models.

Spec models forbid unknown fields (a typo in a manifest must fail loudly, as it does on the API
server in strict mode); status models ignore them, so an operator that was rolled back can
still read a status written by a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel

from shardops.api.money import (
    MONEY_DESCRIPTION,
    MONEY_MAX_MAGNITUDE,
    MONEY_PATTERN,
    money_text,
    parse_money,
)
from shardops.api.names import API_GROUP_VERSION
from shardops.api.rules import CelRule

# One item of work: a JSON object of any shape, kept verbatim by the CRD
# (x-kubernetes-preserve-unknown-fields) because only the user's command interprets it.
# Objects, not any JSON value: the API server's CEL cannot see a list whose elements have no
# type, and `has(spec.items)` must compile for the items/itemsFrom rule. Objects also leave room
# for keys shardops reads, such as an item's `source`.
Item = dict[str, Any]

# A JSON object as the API server and the stores send it: what the k8s, store, state and entry
# layers pass around before (or instead of) parsing it into a model.
JSON = dict[str, Any]

# Kubernetes resource quantities as users write them: `cpu: 1` and `cpu: "500m"`. The CRD takes
# both (int-or-string, like core/v1); the model stores the string so consumers see one type.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _int_to_str(value: object) -> object:
    # bool is an int subclass; `cpu: true` is a mistake, not a quantity.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_int_to_str),
    StringConstraints(pattern=QUANTITY_PATTERN),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]

# Money: see shardops.api.money (exact decimals, written canonically, read from numbers or strings).
# Untyped in the CRD (number or string), where the API server still applies each value check to the
# values of its kind: `pattern` to a string, `minimum`/`maximum` to a number. So a word or a negative
# amount is refused at admission, by the CRD alone; CEL cannot see an untyped field (no rule here).
MONEY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-preserve-unknown-fields": True,
    "pattern": MONEY_PATTERN,
    "minimum": 0,
    "maximum": 10**MONEY_MAX_MAGNITUDE,
    "exclusiveMaximum": True,
    "description": MONEY_DESCRIPTION,
}
Money = Annotated[
    Decimal,
    BeforeValidator(parse_money),
    PlainSerializer(money_text, return_type=str, when_used="json"),
    WithJsonSchema(MONEY_SCHEMA),
]

# DNS-1123 subdomain: what Kubernetes accepts as an object name (ConfigMaps, Shards, ...).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX = 253
SOURCE_NAME_MAX = 63
# Source names end up in metric labels and events, so they follow label-value syntax.
SOURCE_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
SourceName = Annotated[str, Field(min_length=1, max_length=SOURCE_NAME_MAX, pattern=SOURCE_NAME_PATTERN)]

# Condition shapes copied from metav1.Condition so `kubectl wait --for=condition=...` and
# generic tooling understand ours.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

ConditionStatus = Literal["True", "False", "Unknown"]


def truncating(limit: int) -> Callable[[object], object]:
    """A before-validator that cuts long strings to `limit` characters.

    Error text comes from user commands and remote APIs, and can be megabytes; a status write
    must not fail (and lose the shard's state) because of it.
    """
    marker = "...[truncated]"

    def cut(value: object) -> object:
        if isinstance(value, str) and len(value) > limit:
            return value[: limit - len(marker)] + marker
        return value

    return cut


def keeping_last(limit: int) -> Callable[[object], object]:
    """A before-validator that keeps the newest `limit` entries of a list (bounded history)."""

    def trim(value: object) -> object:
        if isinstance(value, list) and len(value) > limit:
            return value[-limit:]
        return value

    return trim


def keeping_first(limit: int) -> Callable[[object], object]:
    """A before-validator that keeps the first `limit` entries (bounded name lists)."""

    def trim(value: object) -> object:
        if isinstance(value, list) and len(value) > limit:
            return value[:limit]
        return value

    return trim


def without_inline_items(body: Mapping[str, Any]) -> tuple[dict[str, Any], int] | None:
    """`body` with spec.items replaced by [] and how many there were; None when spec.items is not
    an inline list. The lean parses of Campaign and Shard (their `parse_items_counted`) share it."""
    spec = body.get("spec")
    items = spec.get("items") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(items, list):
        return None
    lean = {key: value for key, value in body.items() if key != "spec"}
    lean["spec"] = {key: value for key, value in spec.items() if key != "items"} | {"items": []}
    return lean, len(items)


def plain(value: Any) -> Any:
    """Deep-copy kopf's Body/Spec/Status views (Mappings, not dicts) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def schema_default(model: type[ApiModel]) -> dict[str, Any]:
    """`json_schema_extra` giving a sub-object field its defaults as the CRD `default:`.

    The whole object, not `{}`: the API server checks a default against the CEL rules of its
    node without applying the nested defaults first.
    """
    return {"default": model().to_dict()}


def keyed_list(key: str) -> dict[str, Any]:
    """`json_schema_extra` of a list whose entries are one per `key` (listType map): the API server
    merges them by it and refuses two entries with the same key."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


def cel_rules(*rules: CelRule) -> dict[str, Any]:
    """`json_schema_extra` that carries CEL rules into the generated CRD next to this model."""
    return {"x-kubernetes-validations": [rule.schema() for rule in rules]}


class ApiModel(BaseModel):
    """Base of every shardops API model: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
    )

    def to_dict(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, JSON types, unset fields absent."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class SpecModel(ApiModel):
    """Desired state written by users: unknown fields are errors."""


class StatusModel(ApiModel):
    """Observed state written by shardops: unknown fields are ignored for version skew."""

    model_config = ConfigDict(extra="ignore")

    def to_merge_patch(self) -> dict[str, Any]:
        """Like `to_dict` but with explicit nulls, which a JSON merge patch needs to clear a field
        (for example `owner` when a lease is released)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


class TokenCounts(StatusModel):
    """Tokens a model call used, as the provider's usage reported them: prompt tokens (input), the
    part of them served from the provider's cache (cachedInput, counted in input too) and completion
    tokens (output). Reported per item by a command (the built-in LLM worker does), summed per shard
    over its attempts and per campaign."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    input: int = Field(
        default=0, ge=0, description="Prompt tokens (usage.prompt_tokens), cached ones included."
    )
    cached_input: int = Field(
        default=0,
        ge=0,
        description=(
            "Prompt tokens served from the provider's cache (usage.prompt_tokens_details.cached_tokens)."
        ),
    )
    output: int = Field(default=0, ge=0, description="Completion tokens (usage.completion_tokens).")

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(
            input=self.input + other.input,
            cached_input=self.cached_input + other.cached_input,
            output=self.output + other.output,
        )

    def at_least(self, other: TokenCounts) -> TokenCounts:
        """Kind by kind the larger of the two: a campaign's counts never go down (a deleted Shard
        cannot un-use tokens)."""
        return TokenCounts(
            input=max(self.input, other.input),
            cached_input=max(self.cached_input, other.cached_input),
            output=max(self.output, other.output),
        )

    @property
    def used(self) -> bool:
        return bool(self.input or self.cached_input or self.output)

    def describe(self) -> str:
        return f"{self.input} input ({self.cached_input} cached), {self.output} output"


NO_TOKENS = TokenCounts()


def controller_uid(metadata: Mapping[str, Any] | None) -> str | None:
    """The uid of the object's controller (the ownerReference with `controller: true`), or None.

    Objects that belong to a Campaign (Shards, worker Jobs) are selected by its name label, but a
    name is reused when a Campaign is deleted and applied again, and the previous one's objects
    live on until the garbage collector removes them: the controller's uid says whose they are."""
    for reference in (metadata or {}).get("ownerReferences") or []:
        if isinstance(reference, Mapping) and reference.get("controller") is True:
            uid = reference.get("uid")
            return str(uid) if uid else None
    return None


def controlled_by(metadata: Mapping[str, Any] | None, uid: str | None) -> bool:
    """Does the object belong to the owner with this `uid`? Only an object whose controller is
    another uid does not (a previous incarnation's, or another object's): one without a controller
    reference, or an owner whose uid is not known (None), is not told apart."""
    owner = controller_uid(metadata)
    return uid is None or owner is None or owner == uid


class ObjectMeta(ApiModel):
    """The parts of Kubernetes object metadata that shardops reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(default=None, description="Object name, unique in its namespace.")
    namespace: str | None = Field(default=None, description="Namespace of the object.")
    uid: str | None = Field(default=None, description="Unique id assigned by the API server.")
    generation: int | None = Field(
        default=None, description="Spec version, incremented by the API server on every spec change."
    )
    resource_version: str | None = Field(
        default=None, description="Opaque version used for optimistic concurrency on updates."
    )
    labels: dict[str, str] | None = Field(default=None, description="Labels of the object.")
    annotations: dict[str, str] | None = Field(default=None, description="Annotations of the object.")
    creation_timestamp: AwareDatetime | None = Field(
        default=None, description="When the API server created the object (RFC 3339)."
    )
    deletion_timestamp: AwareDatetime | None = Field(
        default=None, description="Set when deletion was requested (RFC 3339)."
    )
    owner_references: list[dict[str, Any]] | None = Field(
        default=None, description="Owners; deleting an owner garbage-collects this object."
    )
    finalizers: list[str] | None = Field(
        default=None, description="Finalizers that must be removed before the object is deleted."
    )

    def controlled_by(self, uid: str | None) -> bool:
        """`controlled_by` of these metadata (the ownerReferences as the API server has them)."""
        return controlled_by({"ownerReferences": self.owner_references}, uid)


class Condition(StatusModel):
    """A condition in exactly the shape of metav1.Condition."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="Condition type in CamelCase, for example Ready or Stalled.",
    )
    status: ConditionStatus = Field(description="Whether the condition holds: True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The metadata.generation the condition was computed from.",
    )
    last_transition_time: AwareDatetime = Field(
        description="When status last changed (RFC 3339); unchanged while status stays the same.",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="Machine-readable CamelCase reason for the last transition, for example BudgetExhausted.",
    )
    message: str = Field(
        max_length=32768,
        description="Human-readable details of the last transition; may be empty.",
    )

    def same_state(self, other: Condition) -> bool:
        """True when `other` would not be a transition (same status, reason and message)."""
        return (self.status, self.reason, self.message) == (other.status, other.reason, other.message)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Conditions with `new` put in place of the one of the same type, as meta.SetStatusCondition does.

    The lastTransitionTime of the existing condition is kept when the status did not change, so
    the time says when the condition became what it is rather than when it was last rewritten.
    """
    result: list[Condition] = []
    replaced = False
    for current in conditions:
        if current.type != new.type:
            result.append(current)
            continue
        replaced = True
        if current.status == new.status:
            new = new.model_copy(update={"last_transition_time": current.last_transition_time})
        result.append(new)
    if not replaced:
        result.append(new)
    return result


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of the given type, or None."""
    return next((c for c in conditions if c.type == type_), None)


class ResourceModel(ApiModel):
    """Common behaviour of the top-level Campaign and Shard resources."""

    # The kind a subclass models; `kind` must say exactly this.
    KIND: ClassVar[str]

    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    api_version: str = Field(default=API_GROUP_VERSION, description=f"Always {API_GROUP_VERSION}.")

    @field_validator("api_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != API_GROUP_VERSION:
            raise ValueError(f"apiVersion must be {API_GROUP_VERSION}, not {value}")
        return value

    @field_validator("kind", check_fields=False)
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value != cls.KIND:
            raise ValueError(f"kind must be {cls.KIND}, not {value}")
        return value

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> Self:
        """Validate an object as kopf or the kubernetes client hands it over (dict or kopf.Body)."""
        return cls.model_validate(plain(body))

    @property
    def name(self) -> str:
        """metadata.name, or "" before the API server named the object."""
        return self.metadata.name or ""

    @property
    def namespace(self) -> str:
        """metadata.namespace, or "" when not set."""
        return self.metadata.namespace or ""

    @property
    def generation(self) -> int:
        """metadata.generation, or 0 for an object not stored yet."""
        return self.metadata.generation or 0

    @property
    def created_at(self) -> datetime | None:
        """metadata.creationTimestamp."""
        return self.metadata.creation_timestamp
