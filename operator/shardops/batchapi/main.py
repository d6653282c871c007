"""`shardops batch-api`: the Batch API service. Settings from the environment (prefix SHARDOPS_:
the installation's store as the operator reads it, and SHARDOPS_BATCH_API_*), then the clients
and the aiohttp server until SIGTERM."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shardops.api.enums import SourceKind
from shardops.batchapi.app import Service, build_app
from shardops.batchapi.auth import Reviewer
from shardops.batchapi.objects import BatchDefaults
from shardops.k8s.api import Kube
from shardops.store.installation import InstallationStore, Stores

log = logging.getLogger("shardops.batchapi")


class BatchApiSettings(InstallationStore):
    model_config = SettingsConfigDict(env_prefix="SHARDOPS_", extra="ignore")

    batch_api_host: str = Field(default="0.0.0.0", description="Address the service listens on.")
    batch_api_port: int = Field(default=8080, ge=1, le=65535, description="Port the service listens on.")
    batch_api_source_kind: SourceKind = Field(
        default=SourceKind.CLUSTER_SOURCE, description="Kind of the Source every batch's requests go through."
    )
    batch_api_source_name: str = Field(
        description="Name of that Source or ClusterSource (chart: batchAPI.sourceRef)."
    )
    batch_api_worker_image: str = Field(description="Worker image of every batch's Campaign.")
    batch_api_shard_size: int = Field(
        default=50, ge=1, le=10_000, description="Requests per shard of a batch."
    )
    batch_api_max_concurrency: int = Field(
        default=4, ge=1, description="Shards of one batch running at once."
    )
    batch_api_threads: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "Executor threads: the Kubernetes and S3 calls and upload checks in flight at once (each "
            "holds at most one connection); requests past it wait their turn."
        ),
    )
    batch_api_review_seconds: float = Field(
        default=30.0,
        ge=0,
        le=600,
        description="How long a token's reviews are reused (revocation takes this long).",
    )
    batch_api_review_entries: int = Field(
        default=1024, ge=1, description="Most tokens whose reviews are kept."
    )
    batch_api_spool_dir: str | None = Field(
        default=None, description="Directory of upload spools; unset: the temp dir."
    )
    log_level: str = Field(default="INFO")


def service_of(settings: BatchApiSettings) -> Service:
    executor = ThreadPoolExecutor(settings.batch_api_threads, thread_name_prefix="batch-api")
    kube = Kube.from_environment("shardops-batch-api", connections=settings.batch_api_threads)
    installation = settings.result_store_location()
    return Service(
        kube=kube,
        reviewer=Reviewer(
            lambda path, body: kube.request("POST", path, body=body),
            ttl_seconds=settings.batch_api_review_seconds,
            max_entries=settings.batch_api_review_entries,
        ),
        stores=Stores(installation),
        installation=installation,
        defaults=BatchDefaults(
            source_kind=str(settings.batch_api_source_kind),
            source_name=settings.batch_api_source_name,
            worker_image=settings.batch_api_worker_image,
            shard_size=settings.batch_api_shard_size,
            max_concurrency=settings.batch_api_max_concurrency,
        ),
        executor=executor,
        new_name=lambda: f"batch-{uuid.uuid4().hex[:16]}",
        now=lambda: dt.datetime.now(dt.UTC),
        spool_dir=settings.batch_api_spool_dir,
    )


def run() -> int:
    from aiohttp import web

    settings = BatchApiSettings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    service = service_of(settings)
    log.info("batch API on %s:%d", settings.batch_api_host, settings.batch_api_port)
    web.run_app(build_app(service), host=settings.batch_api_host, port=settings.batch_api_port, print=None)
    return 0
