"""The Batch API service on loopback over the in-memory fakes, for tests that drive it with the
`openai` package as a user does: FakeKube for Campaigns and Shards, FakeS3 for the store, and an
API server's two review endpoints (`FakeReviews`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.batchapi.app import Service, build_app
from shardops.batchapi.auth import ACCESS_REVIEWS, TOKEN_REVIEWS, Reviewer
from shardops.batchapi.objects import BatchDefaults
from shardops.store.installation import Stores
from shardops.store.s3 import S3Store
from tests.fakekube import FakeKube
from tests.fakes3 import FakeS3

INSTALLATION = ResultStoreStatus(type=StoreType.S3, bucket="results", prefix="shardops")
DEFAULTS = BatchDefaults("ClusterSource", "team-llm", "shardops:dev", 2, 4)
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class FakeReviews:
    """TokenReview and SubjectAccessReview as an API server answers them: `tokens` maps a token to
    its ServiceAccount username; `allowed` are the (username, namespace) pairs RBAC allows."""

    def __init__(self, tokens: Mapping[str, str], allowed: set[tuple[str, str]]) -> None:
        self.tokens, self.allowed = dict(tokens), allowed
        self.calls: list[str] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(path)
        if path == TOKEN_REVIEWS:
            user = self.tokens.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": user, "groups": []}}}
        assert path == ACCESS_REVIEWS
        pair = (body["spec"]["user"], body["spec"]["resourceAttributes"]["namespace"])
        return {"status": {"allowed": pair in self.allowed}}


@dataclass
class Running:
    base_url: str
    kube: FakeKube
    s3: FakeS3
    stores: Stores
    reviews: FakeReviews

    def store(self, namespace: str) -> S3Store:
        found = self.stores.s3(namespace, INSTALLATION)
        assert found is not None
        return found


@contextmanager
def batch_api(kube: FakeKube, reviews: FakeReviews, namespaces: tuple[str, ...]) -> Iterator[Running]:
    """The service on 127.0.0.1 (a free port) in a thread of its own event loop, until the block ends."""
    s3 = FakeS3(page=1000)
    stores = Stores(INSTALLATION)
    for namespace in namespaces:
        stores.use(namespace, INSTALLATION, S3Store(INSTALLATION, namespace, client=s3))
    names = (f"batch-{n:04d}" for n in itertools.count())
    executor = ThreadPoolExecutor(2)
    service = Service(
        kube=kube,
        reviewer=Reviewer(reviews.post),
        stores=stores,
        installation=INSTALLATION,
        defaults=DEFAULTS,
        executor=executor,
        new_name=lambda: next(names),
        now=lambda: NOW,
    )
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(service))
    started = threading.Event()
    port: list[int] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(runner.addresses[0][1])
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    assert started.is_set()
    try:
        yield Running(f"http://127.0.0.1:{port[0]}/v1", kube, s3, stores, reviews)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        executor.shutdown()
