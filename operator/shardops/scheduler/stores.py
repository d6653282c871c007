"""The S3 stores the operator itself reads and writes (`Stores`): one client per store location.

Creating an S3 client costs far more than a call, so each location's is made once and kept. The
operator holds the installation's credentials only, and uses them only on the installation's own
store (same endpoint, region, bucket and prefix): a store a campaign moved elsewhere (with its own
credentialsSecret, which admission requires for that) has no client here (`s3` is None), and what
needs one (the ledger fold, a zombie's stored result, counting an items object) is left to the
workers. The installation's keys are thus never combined with a place a tenant chose."""

from __future__ import annotations

import threading

from shardops import store
from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.k8s.api import SECRETS, Forbidden, KubeClient, NotFound
from shardops.store import ResultStore
from shardops.store.s3 import S3Store


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


def store_secret_problem(kube: KubeClient, campaign: Campaign, namespace_secret: str | None) -> str | None:
    """Why the campaign's workers cannot start: its S3 store's keys come from the namespace's store
    Secret (`namespace_secret`, the installation's setting), which is not in its namespace (the pods
    would sit in CreateContainerConfigError); the message names the Secret and the command that
    creates it. None when it is there, when the store uses a Secret the campaign named itself (a
    missing one is named by WorkersFailing, from its pods), or when the operator may not look."""
    location = campaign.current_status.result_store
    if location is None or location.type is not StoreType.S3 or namespace_secret is None:
        return None
    if location.credentials_secret != namespace_secret:
        return None
    namespace = campaign.namespace
    try:
        kube.get(SECRETS, namespace, namespace_secret)
        return None
    except Forbidden:
        return None
    except NotFound:
        pass
    return (
        f"Secret {namespace_secret} is missing in namespace {namespace}: the workers get their store keys "
        f"from it, so none is started. Create it with keys that reach only s3://{location.bucket}/"
        f"{location.area(namespace)} (docs/install.md, Adding a namespace): kubectl -n {namespace} "
        f"create secret generic {namespace_secret} --from-literal=AWS_ACCESS_KEY_ID=<key> "
        "--from-literal=AWS_SECRET_ACCESS_KEY=<secret>"
    )
