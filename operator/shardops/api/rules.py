"""Cross-field rules, each written once and enforced twice.

The pydantic validators (operator, worker, kubectl plugin, tests) and the CRD's CEL
`x-kubernetes-validations` (the API server, at `kubectl apply` time) must reject the same
objects with the same words: users see whichever fires first, and the e2e suite matches both
against one `# expect:` substring in `tests/data/invalid/`. So the message text lives here and
nowhere else; the models raise `rule.message` and attach `rule.schema()` to their JSON schema.

Messages name the field by its path from the object root and say how to fix it. They stay
plain ASCII without double quotes, because the API server and kubectl quote and escape them.

Transition rules (reading `oldSelf`) run on updates only and have no pydantic twin: a model sees one
object, not the change. They hold the campaign's inputs still once shards were cut from them.

CEL sees the object after the API server applied the schema defaults, so a rule may read a
field that has a `default:` (leaseSeconds, backoff.*) without `has()`; fields without a
default (lists, optional settings) are guarded with `has()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shardops.api.names import DNS_LABEL_MAX


@dataclass(frozen=True)
class CelRule:
    """One validation rule: its CEL form for the CRD and the message both forms report."""

    rule: str
    message: str
    # Relative to the node carrying the rule; the API server then reports the error on that
    # field instead of on the whole object, like pydantic's error location does.
    field_path: str | None = None

    def schema(self) -> dict[str, str]:
        """The `x-kubernetes-validations` entry for this rule."""
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        return entry


ITEMS_XOR_ITEMS_FROM: Final = CelRule(
    rule="has(self.items) != has(self.itemsFrom)",
    message=(
        "set exactly one of spec.items or spec.itemsFrom: items lists the work inline, "
        "itemsFrom names a ConfigMap key holding one JSON item per line"
    ),
)

ITEMS_FROM_ONE_SOURCE: Final = CelRule(
    rule="has(self.object) != (has(self.configMapName) || has(self.key))",
    message=(
        "spec.itemsFrom names two sources: keep either spec.itemsFrom.object (a JSONL object in "
        "the result store) or spec.itemsFrom.configMapName with spec.itemsFrom.key"
    ),
)

ITEMS_FROM_CONFIGMAP_KEY: Final = CelRule(
    rule="has(self.configMapName) == has(self.key)",
    message="spec.itemsFrom.configMapName and spec.itemsFrom.key go together: set both",
)

# The operator fills in the installation's store credentials only for the installation's own store:
# a campaign that points the store elsewhere (another endpoint, bucket, region or prefix) brings its
# own keys, or the operator's would sign requests to a place its author chose (docs/security.md).
STORE_OVERRIDE_NEEDS_CREDENTIALS: Final = CelRule(
    rule=(
        "has(self.credentialsSecret) || "
        "!(has(self.endpoint) || has(self.bucket) || has(self.region) || has(self.prefix))"
    ),
    message=(
        "spec.resultStore.s3 moves the store (endpoint, bucket, region or prefix) without credentials: "
        "set spec.resultStore.s3.credentialsSecret to a Secret of this namespace whose keys reach that "
        "store, or remove the override to use the installation's store and your namespace's area of it"
    ),
)

HEARTBEAT_UNDER_HALF_LEASE: Final = CelRule(
    rule="!has(self.heartbeatSeconds) || self.heartbeatSeconds * 2 < self.leaseSeconds",
    message=(
        "spec.heartbeatSeconds must be less than half of spec.leaseSeconds so a lease survives "
        "one missed heartbeat; lower heartbeatSeconds, raise leaseSeconds, or leave "
        "heartbeatSeconds unset to use leaseSeconds/3"
    ),
    field_path=".heartbeatSeconds",
)

# A source that refers to a shared Source takes its limits from there: a second limit on the campaign's
# entry would say one thing and do another (the operator hands out the Source's limit in shares).
SOURCE_REF_OWNS_LIMITS: Final = CelRule(
    rule="!has(self.sourceRef) || !has(self.rateLimit)",
    message=(
        "spec.sources[].rateLimit cannot be set with spec.sources[].sourceRef: the referenced Source or "
        "ClusterSource holds the limits and the operator gives this campaign its share; remove rateLimit"
    ),
    field_path=".rateLimit",
)

SOURCE_NAMES_UNIQUE: Final = CelRule(
    rule="!has(self.sources) || self.sources.all(a, self.sources.exists_one(b, b.name == a.name))",
    message="spec.sources[].name must be unique; rename or remove the duplicate source",
    field_path=".sources",
)

FALLBACK_DECLARED: Final = CelRule(
    rule=(
        "!has(self.sources) || self.sources.all(s, !has(s.fallback) || "
        "self.sources.exists(t, t.name == s.fallback))"
    ),
    message=(
        "spec.sources[].fallback must name a source declared in spec.sources; "
        "declare that source or remove the fallback"
    ),
    field_path=".sources",
)

FALLBACK_NOT_SELF: Final = CelRule(
    rule="!has(self.fallback) || self.fallback != self.name",
    message=(
        "spec.sources[].fallback must name a different source than the one it is set on; "
        "point it at another source or remove it"
    ),
    field_path=".fallback",
)

DEFAULT_SOURCE_DECLARED: Final = CelRule(
    rule=(
        "!has(self.defaultSource) || "
        "(has(self.sources) && self.sources.exists(s, s.name == self.defaultSource))"
    ),
    message=(
        "spec.defaultSource must name a source declared in spec.sources; "
        "declare that source or remove defaultSource"
    ),
    field_path=".defaultSource",
)

# Not a CRD CEL rule: amounts are number-or-string, untyped in the CRD, where its CEL cannot see them.
# The chart's campaign-budget admission policy (dynamic values there) refuses it with these words
# (tests/chart/test_chart.py holds them equal); without the chart, or for two amounts closer than a
# double tells apart, the model checks it and the operator reports it (Ready=False, InvalidSpec).
BUDGET_PER_SHARD_WITHIN_LIMIT: Final = (
    "spec.budget.maxPerShard must not exceed spec.budget.limit; lower maxPerShard or raise limit"
)

BACKOFF_BASE_WITHIN_CAP: Final = CelRule(
    rule="self.baseSeconds <= self.capSeconds",
    message=(
        "spec.backoff.baseSeconds must not exceed spec.backoff.capSeconds; "
        "lower baseSeconds or raise capSeconds"
    ),
    field_path=".baseSeconds",
)

WORK_SHARD_HAS_ITEMS: Final = CelRule(
    rule="self.shardClass == 'finalize' || has(self.items) || has(self.itemRange)",
    message=(
        "a work shard needs spec.items or spec.itemRange; set one of them, or set spec.shardClass to finalize"
    ),
)

ITEM_RANGE_ORDERED: Final = CelRule(
    rule="self.start <= self.end",
    message="spec.itemRange.start must not exceed spec.itemRange.end (end is exclusive); swap them",
    field_path=".start",
)

LLM_ENDPOINTS_UNIQUE: Final = CelRule(
    rule="!has(self.sources) || self.sources.all(a, self.sources.exists_one(b, b.name == a.name))",
    message="spec.worker.llm.sources[].name must be unique; merge the entries of the same source",
    field_path=".sources",
)

LLM_FORMAT_FIELDS: Final = CelRule(
    rule=(
        "self.format == 'openai-batch' ? (!has(self.messages) || size(self.messages) == 0) && "
        "!has(self.temperature) && !has(self.maxTokens) && !has(self.responseFormat) && "
        "!has(self.extraBody) : has(self.messages) && size(self.messages) > 0"
    ),
    message=(
        "spec.worker.llm.messages is required with format chat, and with format openai-batch "
        "messages, temperature, maxTokens, responseFormat and extraBody must be unset: each item's body "
        "is the request, sent as written"
    ),
)

LLM_ENDPOINTS_DECLARED: Final = CelRule(
    rule=(
        "!has(self.worker.llm) || !has(self.worker.llm.sources) || self.worker.llm.sources.all(e, "
        "has(self.sources) && self.sources.exists(s, s.name == e.name))"
    ),
    message=(
        "spec.worker.llm.sources[].name must name a source declared in spec.sources; "
        "declare that source or remove its llm entry"
    ),
    field_path=".worker.llm.sources",
)

LLM_PRICES_COVER_MODELS: Final = CelRule(
    rule=(
        "!has(self.prices) || size(self.prices) == 0 || "
        "(self.prices.exists(p, p.model == self.model && !has(p.source)) && "
        "(!has(self.sources) || self.sources.all(e, !has(e.model) || "
        "self.prices.exists(p, p.model == e.model && (!has(p.source) || p.source == e.name)))))"
    ),
    message=(
        "spec.worker.llm.prices must price every model the worker calls: llm.model in an entry without "
        "source, each llm.sources[].model in an entry for that source or without source; add the price, "
        "or remove the table to count cost in tokens"
    ),
    field_path=".prices",
)


def _unchanged(field: str, because: str) -> CelRule:
    """spec.<field> stays as it was created (set or unset, and its value): a transition rule on the
    spec, so adding or removing the field is caught too (a rule on the field itself runs only when
    both the old and the new object have it)."""
    return CelRule(
        rule=(
            f"has(self.{field}) == has(oldSelf.{field}) && "
            f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
        ),
        message=(
            f"spec.{field} cannot change after the campaign is created: {because}; to run other "
            "inputs, delete the Campaign and apply it again, or apply it under a new name"
        ),
        field_path=f".{field}",
    )


# A Campaign's name is the value of the label that selects its Shards (label values stop at 63
# characters) and the start of its workers' Job names, where the API server alone would take any
# DNS subdomain of up to 253: such a campaign could then cut no shard at all.
CAMPAIGN_NAME_MAX: Final = DNS_LABEL_MAX
CAMPAIGN_NAME_FITS_A_LABEL: Final = CelRule(
    rule=f"size(self.metadata.name) <= {CAMPAIGN_NAME_MAX}",
    message=(
        f"metadata.name of a Campaign has at most {CAMPAIGN_NAME_MAX} characters: it becomes the label "
        "value that selects the campaign's Shards and the start of its workers' Job names; choose a "
        "shorter name"
    ),
)

# The inputs of a campaign that its shards, their item ranges and idempotency keys were cut from: a
# change mid-campaign would skip or repeat items while the campaign reports Succeeded. The chart's
# campaign-inputs admission policy names the same fields (tests/chart/test_chart.py holds them equal), for
# installations whose CRDs predate these rules (Helm never upgrades a chart's CRDs).
# spec.worker and spec.finalize (image, command, env, resultsVersion) are in the keys too but stay
# editable: a change there keys only the shards cut after it and skips or repeats no item, and
# fixing a broken image on a live campaign is a change to allow.
IMMUTABLE_CAMPAIGN_INPUTS: Final[Mapping[str, CelRule]] = {
    "items": _unchanged("items", "its shards were cut from them"),
    "itemsFrom": _unchanged("itemsFrom", "its shards were cut from the items it names"),
    "shardSize": _unchanged("shardSize", "its shards were already cut with the old size"),
}
