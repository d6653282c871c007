"""A thin S3 client for the calls the result store makes on every shard: signed (AWS Signature
Version 4) HTTP over one urllib3 pool, with the answers and errors in boto3's shapes, so `S3Store`
takes either this or a boto3 client.

Why not boto3 for these: a worker process opens its store once and then makes four small calls per
shard; boto3 costs it about 0.2 CPU-s to import and build an S3 client (it loads the service model)
and 9 ms of CPU per shard for those calls, this client nothing and 3.4 ms
(`python -m benchmarks.s3_client_cost`). A campaign starts one worker per slot, and short shards
are CPU-bound, so that share counts. boto3 stays for what this client does not do: credentials from
the default chain (profiles, web identity, instance metadata) and multipart uploads
(`upload_fileobj`, used once per `kubectl campaign apply --items`).

Request building (`signed_headers`, `object_url`) is pure; `WireS3._send` is the only I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import urllib3
from botocore.exceptions import ClientError, EndpointConnectionError

from shardops.clock import utcnow
from shardops.proxies import pool_for

# AWS's own default, as boto3's for S3 when no region is configured.
DEFAULT_REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
METADATA_PREFIX = "x-amz-meta-"
# As boto3's "standard" retry mode: up to 4 tries, jittered exponential backoff capped at 20 s, on
# throttling, server errors and connection errors.
MAX_ATTEMPTS = 4
BACKOFF_CAP_SECONDS = 20.0
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRIED_CODES = frozenset({"SlowDown", "Throttling", "RequestTimeout", "InternalError", "ServiceUnavailable"})
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


def _uri_encode(text: str, safe: str = "-_.~") -> str:
    return quote(text, safe=safe)


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{_uri_encode(k)}={_uri_encode(v)}" for k, v in sorted(query.items()))


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signed_headers(
    method: str,
    url: str,
    headers: Mapping[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    now: datetime,
) -> dict[str, str]:
    """`headers` plus the Signature Version 4 ones (host, x-amz-date, x-amz-content-sha256, the
    session token if any, Authorization), every header given signed. `url` is already encoded."""
    parts = urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    out = {name.lower(): str(value).strip() for name, value in headers.items()}
    out["host"] = parts.netloc
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_sha256
    if credentials.session_token:
        out["x-amz-security-token"] = credentials.session_token
    names = sorted(out)
    pairs = sorted(tuple(pair.partition("=")[::2]) for pair in parts.query.split("&") if pair)
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            # The url's query is encoded already; the canonical form sorts the encoded pairs.
            "&".join(f"{k}={v}" for k, v in pairs),
            "".join(f"{name}:{out[name]}\n" for name in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()]
    )
    key = f"AWS4{credentials.secret_access_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


def object_url(
    endpoint: str | None, region: str, bucket: str, key: str = "", query: Mapping[str, str] = {}
) -> str:
    """Path-style under an explicit endpoint (on-premises, loopback); on AWS the bucket's own host,
    or path-style when the bucket's name has a dot (a virtual host would not match the certificate)."""
    path_key = _uri_encode(key, safe="/-_.~")
    if endpoint:
        base = f"{endpoint.rstrip('/')}/{_uri_encode(bucket)}/{path_key}"
    elif "." in bucket:
        base = f"https://s3.{region}.amazonaws.com/{_uri_encode(bucket)}/{path_key}"
    else:
        base = f"https://{bucket}.s3.{region}.amazonaws.com/{path_key}"
    return f"{base}?{canonical_query(query)}" if query else base


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(element: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [child for child in element if _local(child.tag) == name]


def _text(element: ElementTree.Element, name: str) -> str | None:
    found = _children(element, name)
    return found[0].text if found else None


def error_code(status: int, body: bytes) -> str:
    """The S3 error code of an answer: its XML <Code>, else the HTTP status (HEAD answers have no body)."""
    if body:
        try:
            code = _text(ElementTree.fromstring(body), "Code")
        except ElementTree.ParseError:
            code = None
        if code:
            return code
    return str(status)


def client_error(operation: str, status: int, body: bytes) -> ClientError:
    code = error_code(status, body)
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


class WireS3:
    """The boto3 S3 client's get_object, put_object, head_object, head_bucket, list_objects_v2 and
    delete_objects, with its argument names, answers and errors (ClientError, and
    EndpointConnectionError when nothing answered)."""

    def __init__(
        self,
        endpoint: str | None,
        region: str,
        credentials: Credentials,
        *,
        ca_bundle: str | None = None,
        fallback: Callable[[], Any] | None = None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint
        self.region = region
        self.credentials = credentials
        # Through HTTPS_PROXY/HTTP_PROXY unless NO_PROXY names the endpoint's host (on AWS the
        # regional S3 host: a NO_PROXY entry such as .amazonaws.com covers every bucket's host too).
        self._pool = pool_for(
            endpoint or f"https://s3.{region}.amazonaws.com",
            maxsize=4,
            retries=False,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS),
            ca_certs=ca_bundle,
        )
        # A boto3 client with the same settings, built on first need (multipart uploads).
        self._fallback = fallback
        self._boto: Any = None
        self._clock = clock
        self._sleep = sleep

    # --- I/O ---------------------------------------------------------------------------------------

    def _send(
        self,
        operation: str,
        method: str,
        bucket: str,
        key: str = "",
        *,
        query: Mapping[str, str] = {},
        headers: Mapping[str, str] = {},
        body: bytes = b"",
        stream: bool = False,
    ) -> Any:
        """One call, retried like boto3's standard mode; the urllib3 answer (2xx or 304), whose
        body is read unless `stream`."""
        url = object_url(self.endpoint, self.region, bucket, key, query)
        payload = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        attempt = 0
        while True:
            attempt += 1
            now = self._clock()
            signed = signed_headers(method, url, headers, payload, self.credentials, self.region, now)
            try:
                answer = self._pool.request(
                    method,
                    url,
                    body=body or None,
                    headers=signed,
                    preload_content=not stream,
                    decode_content=False,
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as error:
                if attempt < MAX_ATTEMPTS:
                    self._backoff(attempt)
                    continue
                raise EndpointConnectionError(endpoint_url=f"{url} ({error})") from error
            if 200 <= answer.status < 300:
                return answer
            data = answer.data if not stream else answer.read()
            answer.release_conn()
            retried = answer.status in RETRIED_STATUSES or error_code(answer.status, data) in RETRIED_CODES
            if retried and attempt < MAX_ATTEMPTS:
                self._backoff(attempt)
                continue
            raise client_error(operation, answer.status, data)

    def _backoff(self, attempt: int) -> None:
        self._sleep(random.random() * min(BACKOFF_CAP_SECONDS, 2.0 ** (attempt - 1)))

    # --- boto3's calls -----------------------------------------------------------------------------

    def get_object(self, Bucket: str, Key: str, IfMatch: str | None = None) -> dict[str, Any]:
        headers = {"if-match": IfMatch} if IfMatch else {}
        answer = self._send("GetObject", "GET", Bucket, Key, headers=headers, stream=True)
        # Left open at the end of the body, so an io.TextIOWrapper over it reads that end instead of
        # a closed file; a body read to its end still returns its connection to the pool.
        answer.auto_close = False
        return {
            "Body": answer,
            "Metadata": _metadata(answer.headers),
            "ContentLength": int(answer.headers.get("content-length") or 0),
            "ContentEncoding": answer.headers.get("content-encoding"),
            "ETag": answer.headers.get("etag"),
        }

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        answer = self._send("HeadObject", "HEAD", Bucket, Key)
        return {
            "Metadata": _metadata(answer.headers),
            "ContentLength": int(answer.headers.get("content-length") or 0),
        }

    def put_object(
        self,
        Bucket: str,
        Key: str,
        Body: bytes,
        ContentType: str | None = None,
        Metadata: Mapping[str, str] | None = None,
        IfNoneMatch: str | None = None,
    ) -> dict[str, Any]:
        headers = {f"{METADATA_PREFIX}{name}": value for name, value in (Metadata or {}).items()}
        if ContentType:
            headers["content-type"] = ContentType
        if IfNoneMatch:
            headers["if-none-match"] = IfNoneMatch
        answer = self._send("PutObject", "PUT", Bucket, Key, headers=headers, body=bytes(Body))
        return {"ETag": answer.headers.get("etag")}

    def head_bucket(self, Bucket: str) -> dict[str, Any]:
        self._send("HeadBucket", "HEAD", Bucket)
        return {}

    def list_objects_v2(
        self, Bucket: str, Prefix: str, ContinuationToken: str | None = None, MaxKeys: int | None = None
    ) -> dict[str, Any]:
        query = {"list-type": "2", "prefix": Prefix}
        if MaxKeys is not None:
            query["max-keys"] = str(MaxKeys)
        if ContinuationToken:
            query["continuation-token"] = ContinuationToken
        answer = self._send("ListObjectsV2", "GET", Bucket, query=query)
        root = ElementTree.fromstring(answer.data)
        page: dict[str, Any] = {
            "Contents": [{"Key": _text(entry, "Key")} for entry in _children(root, "Contents")],
            "IsTruncated": (_text(root, "IsTruncated") or "").lower() == "true",
        }
        token = _text(root, "NextContinuationToken")
        if token:
            page["NextContinuationToken"] = token
        return page

    def delete_objects(self, Bucket: str, Delete: Mapping[str, Any]) -> dict[str, Any]:
        root = ElementTree.Element("Delete")
        if Delete.get("Quiet"):
            ElementTree.SubElement(root, "Quiet").text = "true"
        for entry in Delete["Objects"]:
            ElementTree.SubElement(ElementTree.SubElement(root, "Object"), "Key").text = entry["Key"]
        body = ElementTree.tostring(root, encoding="utf-8", xml_declaration=False)
        headers = {
            "content-type": "application/xml",
            # S3 refuses a DeleteObjects without a checksum of its body.
            "content-md5": base64.b64encode(hashlib.md5(body).digest()).decode("ascii"),
        }
        answer = self._send("DeleteObjects", "POST", Bucket, query={"delete": ""}, headers=headers, body=body)
        errors = [
            {"Key": _text(entry, "Key"), "Code": _text(entry, "Code")}
            for entry in _children(ElementTree.fromstring(answer.data), "Error")
        ]
        return {"Errors": errors} if errors else {}

    def upload_fileobj(
        self,
        Fileobj: Any,
        Bucket: str,
        Key: str,
        ExtraArgs: Mapping[str, Any] | None = None,
        Config: Any = None,
    ) -> None:
        """Through boto3's transfer manager: an items file may be far larger than one PUT takes."""
        if self._fallback is None:
            raise EndpointConnectionError(endpoint_url=f"{self.endpoint} (no client for multipart uploads)")
        if self._boto is None:
            self._boto = self._fallback()
        self._boto.upload_fileobj(Fileobj, Bucket, Key, ExtraArgs=dict(ExtraArgs or {}), Config=Config)


def _metadata(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name[len(METADATA_PREFIX) :].lower(): value
        for name, value in headers.items()
        if name.lower().startswith(METADATA_PREFIX)
    }
