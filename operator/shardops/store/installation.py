"""The installation's own result store: its settings (the chart's resultStore values, as the
operator and the Batch API service read them from their environment) and `Stores`, the clients
that use the installation's keys: one client per store location.

Creating an S3 client costs far more than a call, so each location's is made once and kept. The
operator holds the installation's credentials only, and uses them only on the installation's own
store (same endpoint, region, bucket and prefix): a store a campaign moved elsewhere (with its own
credentialsSecret, which admission requires for that) has no client here (`s3` is None), and what
needs one (the ledger fold, a zombie's stored result, counting an items object) is left to the
workers. The installation's keys are thus never combined with a place a tenant chose. The Batch
API service uses them the same way: on the installation's store, in the namespace's area only."""

from __future__ import annotations

import threading

from pydantic import Field
from pydantic_settings import BaseSettings

from shardops import store
from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.store import BUCKET_PATTERN, DEFAULT_S3_PREFIX, DEFAULT_STORE_SECRET, ResultStoreStatus
from shardops.k8s.api import KubeClient
from shardops.store import ResultStore
from shardops.store.s3 import S3Store


class InstallationStore(BaseSettings):
    """The chart's resultStore values, as SHARDOPS_RESULT_STORE and SHARDOPS_S3_* (env prefix
    SHARDOPS_, as the classes that inherit them)."""

    result_store: StoreType = Field(
        default=StoreType.CONFIG_MAP,
        description=(
            "Result store of campaigns that do not choose one (spec.resultStore.type): ConfigMap (no "
            "dependencies, small campaigns) or S3 (the SHARDOPS_S3_* settings)."
        ),
    )
    s3_endpoint: str | None = Field(
        default=None, pattern=r"^https?://[^\s]+$", description="S3 API URL; unset: AWS S3."
    )
    s3_region: str | None = Field(default=None, description="Region S3 requests are signed for.")
    s3_bucket: str | None = Field(default=None, pattern=BUCKET_PATTERN, description="Bucket of results.")
    s3_prefix: str = Field(
        default=DEFAULT_S3_PREFIX, description="Key prefix of every object shardops writes."
    )
    store_secret: str | None = Field(
        default=DEFAULT_STORE_SECRET,
        description=(
            "Secret in each campaign's namespace whose AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY the "
            "namespace's workers get: keys that reach only <bucket>/<prefix>/<namespace>/ (docs/install.md). "
            "Empty: none, workers use the default credential chain (a workload identity per namespace). "
            "The operator's own keys come from its environment and never reach a worker pod."
        ),
    )

    def result_store_location(self) -> ResultStoreStatus:
        """The installation's result store (with its S3 settings whatever the default type): what a
        campaign gets for what it leaves unset."""
        return ResultStoreStatus(
            type=self.result_store,
            endpoint=self.s3_endpoint,
            region=self.s3_region,
            bucket=self.s3_bucket,
            prefix=self.s3_prefix,
            credentials_secret=self.store_secret or None,
        )


class Stores:
    def __init__(self, installation: ResultStoreStatus) -> None:
        self.installation = installation
        self._lock = threading.Lock()
        # Bounded by the store locations in use: the installation's and those campaigns name.
        self._clients: dict[tuple[str, str], S3Store] = {}

    def s3(self, namespace: str, location: ResultStoreStatus) -> S3Store | None:
        """The S3 store at `location` with the operator's own credentials; None for any store but the
        installation's (only the campaign's workers hold credentials for it)."""
        if not location.same_store(self.installation):
            return None
        key = (namespace, location.model_dump_json())
        with self._lock:
            if key not in self._clients:
                self._clients[key] = S3Store(location, namespace)
            return self._clients[key]

    def use(self, namespace: str, location: ResultStoreStatus, client: S3Store) -> None:
        """Serve `client` for `location` (a test's S3Store on an in-memory S3)."""
        with self._lock:
            self._clients[(namespace, location.model_dump_json())] = client

    def s3_of(self, namespace: str, location: ResultStoreStatus) -> S3Store | None:
        """`s3` for an S3 location; None for any other type."""
        return self.s3(namespace, location) if location.type is StoreType.S3 else None

    def ledger(self, campaign: Campaign) -> S3Store | None:
        """Where the campaign's ledger goes: its recorded S3 store, if the operator may write it."""
        location = campaign.current_status.result_store
        return None if location is None else self.s3_of(campaign.namespace, location)

    def results(self, kube: KubeClient, campaign: Campaign) -> ResultStore | None:
        """The campaign's result store, to read a shard's stored result; None when the operator
        cannot read it (an S3 store with the campaign's own credentials)."""
        location = store.location_of(campaign)
        if location.type is StoreType.S3:
            return self.s3(campaign.namespace, location)
        return store.open_store(kube, campaign.namespace, location)
