"""The Batch API's routes on aiohttp: each handler maps a request to `objects` and `files` and
back. Nothing blocking runs on the event loop: every Kubernetes and S3 call, every line check and
every spool write goes to `Service.executor`, whose size (SHARDOPS_BATCH_API_THREADS) bounds the
calls in flight, and with them the connections to the API server and the store.

Every route but /healthz needs a tenant (`auth`): a namespace, from the caller's ServiceAccount
token alone. Batches and files are looked up in that namespace only, so another namespace's id
answers 404, as one that does not exist.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import BodyPartReader, web

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.names import cancel_patch
from shardops.api.store import ResultStoreStatus
from shardops.batchapi import files, objects
from shardops.batchapi.auth import Reviewer, Tenant
from shardops.batchapi.objects import ApiProblem, BatchDefaults, BatchRequest
from shardops.k8s.api import CAMPAIGNS, ApiError, KubeClient, NotFound
from shardops.logic.timefmt import rfc3339
from shardops.store.installation import Stores
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store

log = logging.getLogger("shardops.batchapi")
T = TypeVar("T")
UPLOAD_CHUNK = 1 << 16  # bytes of an upload read and checked per executor call


@dataclass
class Service:
    kube: KubeClient
    reviewer: Reviewer
    stores: Stores
    installation: ResultStoreStatus
    defaults: BatchDefaults
    executor: Executor
    new_name: Callable[[], str]
    now: Callable[[], dt.datetime]
    spool_dir: str | None = None

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(call, *args))

    def area(self, tenant: Tenant) -> S3Store:
        """The tenant namespace's area of the installation's store (uploads go there)."""
        store = self.stores.s3_of(tenant.namespace, self.installation)
        if store is None:
            raise ApiProblem(
                503, "The Batch API needs the installation's S3 result store (resultStore.type S3)."
            )
        return store


SERVICE = web.AppKey("service", Service)
TENANT = web.RequestKey("tenant", Tenant)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _problem(problem: ApiProblem) -> web.Response:
    return web.json_response(problem.body(), status=problem.status)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure in OpenAI's error shape: ours as they are, a store or API server that does not
    answer as 503 (the client's retry is the right move)."""
    try:
        return await handler(request)
    except ApiProblem as problem:
        return _problem(problem)
    except (StoreUnavailable, ApiError) as error:
        log.warning("%s %s: %s", request.method, request.path, error)
        return _problem(ApiProblem(503, f"Temporarily unavailable: {error}", "server_error"))


@web.middleware
async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path == "/healthz":
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise objects.unauthorized(
            "Missing bearer token: set api_key to a ServiceAccount token (kubectl create token)."
        )
    service = request.app[SERVICE]
    tenant = await service.run(service.reviewer.tenant, token.strip())
    if tenant is None:
        raise objects.unauthorized(
            "Incorrect API key: not a valid ServiceAccount token, or it may not create campaigns "
            "in its namespace."
        )
    request[TENANT] = tenant
    return await handler(request)


def _context(request: web.Request) -> tuple[Service, Tenant]:
    return request.app[SERVICE], request[TENANT]


async def _batch(service: Service, tenant: Tenant, name: str) -> Campaign:
    """The tenant's batch `name`; 404 when its namespace has no batch of that name."""
    try:
        body = await service.run(service.kube.get, CAMPAIGNS, tenant.namespace, name)
    except NotFound:
        raise objects.not_found("batch", name) from None
    campaign = Campaign.parse(body)
    if not objects.is_batch(campaign):
        raise objects.not_found("batch", name)
    return campaign


# --- files -----------------------------------------------------------------------------------------


async def create_file(request: web.Request) -> web.Response:
    service, tenant = _context(request)
    store = service.area(tenant)
    reader = await request.multipart()
    purpose: str | None = None
    stored: tuple[str, str, int] | None = None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ApiProblem(400, "A nested multipart part is not a file.", param="file")
        if part.name == "purpose":
            purpose = (await part.text()).strip()
        elif part.name == "file":
            filename = part.filename or "upload.jsonl"
            upload = files.Upload(filename, service.defaults.shard_size, service.spool_dir)
            try:
                while chunk := await part.read_chunk(UPLOAD_CHUNK):
                    await service.run(upload.feed, chunk)
                await service.run(upload.finish)
                digest = await service.run(files.store_upload, store, upload)
                stored = (digest, filename, upload.size)
            finally:
                await service.run(upload.close)
    if purpose != objects.FILE_PURPOSE:
        raise ApiProblem(400, f"purpose must be {objects.FILE_PURPOSE!r}, got {purpose!r}.", param="purpose")
    if stored is None:
        raise ApiProblem(400, "The request has no file part.", param="file")
    digest, filename, size = stored
    now = int(service.now().timestamp())
    return web.json_response(objects.file_object(objects.input_file_id(digest), size, now, filename))


async def _file(service: Service, tenant: Tenant, file_id: str) -> tuple[JSON, Callable[[], Iterable[str]]]:
    """The file object of `file_id` and its lines (read when called); 404 outside the namespace."""
    ref = objects.parse_file_id(file_id)
    if ref.kind == "input" and ref.digest is not None:
        store = service.area(tenant)
        digest = ref.digest
        head = await service.run(files.stored_input, store, digest)
        if head is None:
            raise objects.not_found("file", file_id)
        filename = (head.get("Metadata") or {}).get("filename", f"{file_id}.jsonl")
        found = objects.file_object(file_id, int(head.get("ContentLength") or 0), 0, filename)
        return found, lambda: files.input_lines(store, digest)
    campaign = await _batch(service, tenant, ref.batch or "")
    if objects.batch_object(campaign)["output_file_id"] is None:
        raise objects.not_found("file", file_id)  # given out only once the batch finished
    store = files.batch_store(service.stores, campaign)
    created = objects.batch_object(campaign)["created_at"]
    found = objects.file_object(file_id, None, created, f"{file_id}.jsonl", "batch_output")
    errors = ref.kind == "errors"
    return found, lambda: files.result_lines(service.kube, store, campaign, errors)


async def get_file(request: web.Request) -> web.Response:
    service, tenant = _context(request)
    found, _ = await _file(service, tenant, request.match_info["file_id"])
    return web.json_response(found)


async def file_content(request: web.Request) -> web.StreamResponse:
    service, tenant = _context(request)
    _, lines = await _file(service, tenant, request.match_info["file_id"])
    next_page = await service.run(lambda: files.pages(lines()))
    # The first page before the answer starts: a store that fails at once is still a 503.
    page = await service.run(next_page)
    response = web.StreamResponse(headers={"Content-Type": "application/jsonl"})
    await response.prepare(request)
    while page:
        await response.write("".join(page).encode("utf-8"))
        page = await service.run(next_page)
    await response.write_eof()
    return response


# --- batches ---------------------------------------------------------------------------------------


async def create_batch(request: web.Request) -> web.Response:
    service, tenant = _context(request)
    try:
        body = await request.json()
    except ValueError:
        raise ApiProblem(400, "The request body is not JSON.") from None
    batch = BatchRequest.parse(body)
    ref = objects.parse_file_id(batch.input_file_id)
    store = service.area(tenant)
    if ref.digest is None or await service.run(files.stored_input, store, ref.digest) is None:
        raise objects.not_found("file", batch.input_file_id)
    campaign = objects.batch_campaign(
        service.new_name(),
        tenant.namespace,
        batch,
        objects.input_key(store.input_prefix(objects.FILES_AREA), ref.digest),
        store.bucket,
        service.defaults,
    )
    created = await service.run(service.kube.create, CAMPAIGNS, tenant.namespace, campaign)
    log.info(
        "batch %s/%s created from %s", tenant.namespace, campaign["metadata"]["name"], batch.input_file_id
    )
    return web.json_response(objects.batch_object(Campaign.parse(created)))


async def get_batch(request: web.Request) -> web.Response:
    service, tenant = _context(request)
    campaign = await _batch(service, tenant, request.match_info["batch_id"])
    return web.json_response(objects.batch_object(campaign))


async def list_batches(request: web.Request) -> web.Response:
    """One page, newest first. Bounded by the namespace's batch Campaigns (one labelled list: the
    API server cannot order by creation, so the page is cut here; finished Campaigns go when their
    owners delete them or retention does)."""
    service, tenant = _context(request)
    limit = objects.page_limit(request.query.get("limit"))
    bodies = await service.run(service.kube.list, CAMPAIGNS, tenant.namespace, f"{objects.BATCH_LABEL}=true")
    campaigns = [Campaign.parse(body) for body in bodies]
    return web.json_response(objects.batch_page(campaigns, request.query.get("after"), limit))


async def cancel_batch(request: web.Request) -> web.Response:
    """The recorded cancel (as kubectl campaign cancel): no new claims; running shards finish."""
    service, tenant = _context(request)
    campaign = await _batch(service, tenant, request.match_info["batch_id"])
    if objects.batch_status(campaign) in ("completed", "failed", "cancelled", "cancelling"):
        return web.json_response(objects.batch_object(campaign))
    patched = await service.run(
        service.kube.patch, CAMPAIGNS, tenant.namespace, campaign.name, cancel_patch(rfc3339(service.now()))
    )
    log.info("batch %s/%s cancelled", tenant.namespace, campaign.name)
    return web.json_response(objects.batch_object(Campaign.parse(patched)))


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(service: Service) -> web.Application:
    app = web.Application(middlewares=[openai_errors, authenticated], client_max_size=1 << 20)
    app[SERVICE] = service
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
    return app
