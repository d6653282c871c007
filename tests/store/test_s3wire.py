"""The thin S3 client: its signatures are botocore's for the same request, its URLs address the
bucket the way boto3 does, its errors and retries have boto3's shapes. (e2e/test_s3_wire.py runs it
against SeaweedFS.)"""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError, EndpointConnectionError

from shardops.api.enums import StoreType
from shardops.api.store import ResultStoreStatus
from shardops.store.s3 import client_for
from shardops.store.s3wire import (
    EMPTY_SHA256,
    MAX_ATTEMPTS,
    Credentials,
    WireS3,
    error_code,
    object_url,
    signed_headers,
)

NOW = datetime(2026, 12, 2, 21, 0, 0, tzinfo=UTC)


def _botocore_authorization(
    method: str, url: str, headers: dict[str, str], body: bytes, credentials: Credentials
) -> str:
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    auth = S3SigV4Auth(
        BotoCredentials(credentials.access_key_id, credentials.secret_access_key, credentials.session_token),
        "s3",
        "eu-west-1",
    )
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        auth.add_auth(request)
    return str(request.headers["Authorization"])


@pytest.mark.parametrize(
    ("method", "key", "query", "headers", "body", "credentials"),
    [
        pytest.param(
            "PUT",
            "ns/attempts/k é+1/t3.json",
            {},
            {"content-type": "application/json", "x-amz-meta-fingerprint": "ab12", "if-none-match": "*"},
            b'{"a": 1}',
            Credentials("AKID", "secret/key+x"),
            id="conditional-put-with-metadata-and-odd-key",
        ),
        pytest.param(
            "GET",
            "",
            {"list-type": "2", "prefix": "ns/items/a b/", "continuation-token": "a+b/c=="},
            {},
            b"",
            Credentials("AKID", "secret", "session-token"),
            id="list-with-continuation-and-session-token",
        ),
        pytest.param(
            "POST",
            "",
            {"delete": ""},
            {"content-type": "application/xml", "content-md5": "1B2M2Y8AsgTpgAmY7PhCfg=="},
            b"<Delete/>",
            Credentials("AKID", "secret"),
            id="delete-objects",
        ),
    ],
)
def test_the_signature_is_botocores_for_the_same_request(
    method: str,
    key: str,
    query: dict[str, str],
    headers: dict[str, str],
    body: bytes,
    credentials: Credentials,
) -> None:
    url = object_url("http://127.0.0.1:8333", "eu-west-1", "results", key, query)
    payload = hashlib.sha256(body).hexdigest()
    ours = signed_headers(method, url, headers, payload, credentials, "eu-west-1", NOW)
    assert ours["authorization"] == _botocore_authorization(method, url, headers, body, credentials)
    assert ours["x-amz-date"] == "20261202T210000Z" and ours["host"] == "127.0.0.1:8333"


def test_a_different_secret_gives_a_different_signature() -> None:
    url = object_url(None, "us-east-1", "results", "a.json")
    one = signed_headers("GET", url, {}, EMPTY_SHA256, Credentials("AKID", "one"), "us-east-1", NOW)
    two = signed_headers("GET", url, {}, EMPTY_SHA256, Credentials("AKID", "two"), "us-east-1", NOW)
    assert one["authorization"] != two["authorization"]


def test_urls_are_path_style_under_an_endpoint_and_the_buckets_host_on_aws() -> None:
    assert (
        object_url("http://127.0.0.1:9000/", "r", "b", "ns/x y.json")
        == "http://127.0.0.1:9000/b/ns/x%20y.json"
    )
    assert object_url(None, "eu-west-1", "b", "k") == "https://b.s3.eu-west-1.amazonaws.com/k"
    # A dotted name would not match the certificate of a virtual host.
    assert object_url(None, "eu-west-1", "b.c", "k") == "https://s3.eu-west-1.amazonaws.com/b.c/k"
    assert object_url("http://h", "r", "b", "", {"prefix": "a/", "list-type": "2"}) == (
        "http://h/b/?list-type=2&prefix=a%2F"
    )


def test_the_error_code_is_the_xml_code_else_the_status() -> None:
    body = b"<?xml version='1.0'?><Error><Code>PreconditionFailed</Code><Message>m</Message></Error>"
    assert error_code(412, body) == "PreconditionFailed"
    assert error_code(404, b"") == "404"
    assert error_code(502, b"<html>bad gateway</html>") == "502"


class _Pool:
    """Answers the client's requests from a script; each entry is a status and body, or an error."""

    def __init__(self, script: list[tuple[int, bytes] | Exception]) -> None:
        self.script = script
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        self.requests.append((method, url, dict(kwargs["headers"])))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        status, body = step
        return urllib3.HTTPResponse(
            body=io.BytesIO(body),
            status=status,
            headers={"x-amz-meta-fingerprint": "ab", "content-length": str(len(body))},
            preload_content=kwargs["preload_content"],
        )


def _client(script: list[tuple[int, bytes] | Exception]) -> tuple[WireS3, _Pool, list[float]]:
    slept: list[float] = []
    client = WireS3(
        "http://127.0.0.1:1", "us-east-1", Credentials("a", "b"), clock=lambda: NOW, sleep=slept.append
    )
    pool = _Pool(script)
    client._pool = pool  # type: ignore[assignment]
    return client, pool, slept


def test_server_errors_and_throttling_are_retried_then_answered() -> None:
    slow_down = b"<Error><Code>SlowDown</Code></Error>"
    client, pool, slept = _client([(503, b""), (400, slow_down), (200, b"")])
    assert client.put_object(Bucket="b", Key="k", Body=b"x", IfNoneMatch="*") == {"ETag": None}
    assert len(pool.requests) == 3 and len(slept) == 2
    assert all(0 <= s <= 2.0 for s in slept)
    assert pool.requests[0][2]["if-none-match"] == "*"


def test_a_failed_precondition_is_a_client_error_and_not_retried() -> None:
    client, pool, _ = _client([(412, b"<Error><Code>PreconditionFailed</Code></Error>")])
    with pytest.raises(ClientError) as failure:
        client.put_object(Bucket="b", Key="k", Body=b"x", IfNoneMatch="*")
    assert failure.value.response["Error"]["Code"] == "PreconditionFailed"
    assert len(pool.requests) == 1


def test_nothing_answering_is_an_endpoint_error_after_every_attempt() -> None:
    client, pool, slept = _client([urllib3.exceptions.NewConnectionError(None, "refused")] * MAX_ATTEMPTS)  # type: ignore[arg-type]
    with pytest.raises(EndpointConnectionError, match=r"127\.0\.0\.1:1"):
        client.get_object(Bucket="b", Key="k")
    assert len(pool.requests) == MAX_ATTEMPTS and len(slept) == MAX_ATTEMPTS - 1


def test_a_listing_page_reads_keys_truncation_and_the_next_token() -> None:
    page = (
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>b</Name><Prefix>p/</Prefix><IsTruncated>true</IsTruncated>"
        b"<Contents><Key>p/a</Key><Size>1</Size></Contents><Contents><Key>p/b</Key></Contents>"
        b"<NextContinuationToken>tok+/=</NextContinuationToken></ListBucketResult>"
    )
    client, pool, _ = _client([(200, page)])
    answer = client.list_objects_v2(Bucket="b", Prefix="p/", ContinuationToken="prev")
    assert answer == {
        "Contents": [{"Key": "p/a"}, {"Key": "p/b"}],
        "IsTruncated": True,
        "NextContinuationToken": "tok+/=",
    }
    assert pool.requests[0][1] == "http://127.0.0.1:1/b/?continuation-token=prev&list-type=2&prefix=p%2F"


def test_static_keys_get_the_thin_client_and_none_get_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    location = ResultStoreStatus(type=StoreType.S3, bucket="b", endpoint="http://127.0.0.1:1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    explicit = client_for(location, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    assert isinstance(explicit, WireS3) and explicit.credentials == Credentials("a", "b")
    assert not isinstance(client_for(location), WireS3)  # the default chain: boto3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "envkey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    from_env = client_for(location)
    assert isinstance(from_env, WireS3) and from_env.credentials.access_key_id == "envkey"


def test_an_objects_body_reads_to_its_last_line_through_a_text_wrapper() -> None:
    lines = [f"line {i}\n" for i in range(100)]
    client, _, _ = _client([(200, "".join(lines).encode())])
    answer = client.get_object(Bucket="b", Key="k.jsonl")
    assert answer["ContentLength"] == len("".join(lines)) and answer["Metadata"] == {"fingerprint": "ab"}
    assert list(io.TextIOWrapper(answer["Body"], encoding="utf-8")) == lines
