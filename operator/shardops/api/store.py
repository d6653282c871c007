"""Where a campaign's results live (S3 or ConfigMaps) and how long they are kept."""

from __future__ import annotations

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from shardops.api import rules
from shardops.api.common import (
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_PATTERN,
    SpecModel,
    StatusModel,
    cel_rules,
)
from shardops.api.enums import StoreType

# S3 bucket naming rules (lowercase, digits, dots, hyphens; 3-63 characters).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"

PREFIX_PATTERN = r"^[A-Za-z0-9!_.*'()/-]*$"

DEFAULT_S3_PREFIX = "shardops"

# The Secret of each namespace whose keys that namespace's workers get (chart value
# resultStore.namespaceSecret): keys that reach only the namespace's area of the store.
DEFAULT_STORE_SECRET = "shardops-store"

# The ConfigMap store's ceiling: two ConfigMaps of results (and a small pointer) per shard in etcd,
# which has a 2 GiB default quota for the whole cluster and keeps every object in the API server's
# memory. Beyond this many work shards a campaign needs an S3 store.
CONFIGMAP_STORE_MAX_SHARDS = 1000

# Ten years: longer is "forever", which is what leaving the retention unset says.
MAX_RETENTION_SECONDS = 10 * 365 * 24 * 3600


class S3Location(SpecModel):
    """An S3-compatible bucket (AWS S3, GCS interoperability, Ceph RGW, R2, SeaweedFS, ...)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(rules.STORE_OVERRIDE_NEEDS_CREDENTIALS))

    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description=(
            "URL of the S3 API, for example http://seaweedfs.storage:8333. Default: the installation's "
            "(chart value resultStore.s3.endpoint); unset there too: AWS S3 of the region."
        ),
    )
    region: str | None = Field(
        default=None, max_length=64, description="Region to sign requests for. Default: the installation's."
    )
    bucket: str | None = Field(
        default=None,
        min_length=3,
        max_length=63,
        pattern=BUCKET_PATTERN,
        description="Bucket that holds results (it must exist). Default: the installation's.",
    )
    prefix: str | None = Field(
        default=None,
        max_length=512,
        pattern=PREFIX_PATTERN,
        description=(
            "Key prefix of every object shardops writes. Default: the installation's, "
            f'else "{DEFAULT_S3_PREFIX}".'
        ),
    )
    credentials_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "Secret in the campaign's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "given to workers as environment variables; required with an endpoint, bucket, region or "
            "prefix of your own. Default: the namespace's store Secret (chart value "
            f"resultStore.namespaceSecret, {DEFAULT_STORE_SECRET}), whose keys reach only this "
            "namespace's area."
        ),
    )

    @model_validator(mode="after")
    def _override_brings_credentials(self) -> S3Location:
        moved = (self.endpoint, self.bucket, self.region, self.prefix)
        if self.credentials_secret is None and any(value is not None for value in moved):
            raise ValueError(rules.STORE_OVERRIDE_NEEDS_CREDENTIALS.message)
        return self


class ResultStoreSpec(SpecModel):
    """Where this campaign keeps its results; unset fields take the installation's settings."""

    type: StoreType | None = Field(
        default=None,
        description=(
            "S3 (an object store: any result volume) or ConfigMap (zero dependencies, for small "
            f"campaigns: at most {CONFIGMAP_STORE_MAX_SHARDS} work shards and results under 900 KiB "
            "each). Default: the installation's (chart value resultStore.type)."
        ),
    )
    s3: S3Location | None = Field(default=None, description="Overrides of the installation's S3 settings.")
    retention_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETENTION_SECONDS,
        description=(
            "How long the campaign's stored results are kept after it finished (S3 store): the "
            "operator then deletes them, its ledger and uploaded inputs, once no Campaign of this "
            "name exists in the namespace (a re-applied one reuses them; its own finish restarts "
            "the clock). Default: the installation's (chart value resultStore.retentionSeconds); "
            "unset there too: kept until `kubectl campaign purge`. ConfigMap results are kept "
            "until purged."
        ),
    )


def retention_of(spec: ResultStoreSpec | None, installation: int | None) -> int | None:
    """The campaign's result retention: its own, else the installation's (None: until purged)."""
    own = spec.retention_seconds if spec is not None else None
    return own if own is not None else installation


class ResultStoreStatus(StatusModel):
    """The result store a campaign uses, fixed when the operator first sees it: later changes of
    the installation's defaults do not split one campaign's results across stores."""

    type: StoreType = Field(description="S3 or ConfigMap.")
    endpoint: str | None = Field(default=None, description="S3 API URL; unset: AWS S3.")
    region: str | None = Field(default=None, description="Region requests are signed for.")
    bucket: str | None = Field(default=None, description="Bucket of the results.")
    prefix: str = Field(default=DEFAULT_S3_PREFIX, description="Key prefix of every object.")
    credentials_secret: str | None = Field(
        default=None, description="Secret workers get S3 credentials from; unset: the default chain."
    )

    def area(self, namespace: str) -> str:
        """The key prefix of `namespace`'s area, `<prefix>/<namespace>/`: every object a campaign of
        that namespace writes is under it, and its namespace's store credentials reach only it."""
        prefix = self.prefix.strip("/")
        return f"{prefix}/{namespace}/" if prefix else f"{namespace}/"

    def same_store(self, other: ResultStoreStatus) -> bool:
        """Whether `other` is this store (endpoint, region, bucket and prefix), whatever its Secret."""
        fields = ("endpoint", "region", "bucket")
        return all(getattr(self, f) == getattr(other, f) for f in fields) and (
            self.prefix.strip("/") == other.prefix.strip("/")
        )


def resolve_result_store(spec: ResultStoreSpec | None, installation: ResultStoreStatus) -> ResultStoreStatus:
    """The campaign's store: its own settings over the installation's, field by field.

    `installation` carries the installation's S3 settings whatever its default type, so a campaign
    may choose S3 on an installation whose default is ConfigMap.
    """
    kind = (spec.type if spec is not None else None) or installation.type
    if kind is StoreType.CONFIG_MAP:
        return ResultStoreStatus(type=kind)
    own = (spec.s3 if spec is not None else None) or S3Location()
    return ResultStoreStatus(
        type=kind,
        endpoint=own.endpoint or installation.endpoint,
        region=own.region or installation.region,
        bucket=own.bucket or installation.bucket,
        prefix=own.prefix if own.prefix is not None else installation.prefix,
        credentials_secret=own.credentials_secret or installation.credentials_secret,
    )
