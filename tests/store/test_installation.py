"""The S3 stores the operator uses itself (scheduler/stores.py): one client per location, and none
for a store whose credentials only the campaign's workers hold."""

from __future__ import annotations

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.store.configmap import ConfigMapStore
from shardops.store.installation import Stores
from shardops.store.s3 import S3Store
from tests.fakekube import FakeKube
from tests.fakes3 import FakeS3
from tests.schedulerkit import NAMESPACE, campaign

INSTALLATION = ResultStoreStatus(
    type=StoreType.S3, endpoint="http://127.0.0.1:1", bucket="results", credentials_secret="operator-s3"
)


def test_one_client_per_location_made_once() -> None:
    stores = Stores(INSTALLATION)
    first = stores.s3(NAMESPACE, INSTALLATION)
    assert first is not None and stores.s3(NAMESPACE, INSTALLATION) is first
    other = INSTALLATION.model_copy(update={"bucket": "elsewhere"})
    assert stores.s3(NAMESPACE, other) is not first
    assert stores.s3("other-namespace", INSTALLATION) is not first


def test_a_store_elsewhere_has_no_client_here_whatever_its_secret() -> None:
    """The installation's keys are used on the installation's store only: never with an endpoint,
    bucket, region or prefix a campaign chose (its own keys go to its workers instead)."""
    stores = Stores(INSTALLATION)
    for moved in ({"endpoint": "http://169.254.169.254"}, {"bucket": "b2"}, {"region": "r"}, {"prefix": "x"}):
        elsewhere = INSTALLATION.model_copy(update={**moved, "credentials_secret": "team-s3"})
        assert stores.s3(NAMESPACE, elsewhere) is None, moved
    own_keys = INSTALLATION.model_copy(update={"credentials_secret": "team-s3"})
    assert stores.s3(NAMESPACE, own_keys) is not None, "the installation's store, the team's own Secret"
    assert stores.s3_of(NAMESPACE, ResultStoreStatus(type=StoreType.CONFIG_MAP)) is None


def _campaign(**status: object) -> Campaign:
    body = campaign()
    body["metadata"]["namespace"] = NAMESPACE
    return Campaign.parse({**body, "status": status} if status else body)


def test_the_ledger_goes_to_the_recorded_s3_store_only() -> None:
    stores = Stores(INSTALLATION)
    client = S3Store(INSTALLATION, NAMESPACE, client=FakeS3())
    stores.use(NAMESPACE, INSTALLATION, client)
    unrecorded = _campaign()
    assert stores.ledger(unrecorded) is None, "no store recorded yet: nothing folds"
    recorded = _campaign(resultStore=INSTALLATION.to_dict())
    assert stores.ledger(recorded) is client
    configmap = _campaign(resultStore={"type": "ConfigMap"})
    assert stores.ledger(configmap) is None
    assert isinstance(stores.results(FakeKube(), configmap), ConfigMapStore)
    assert stores.results(FakeKube(), recorded) is client
