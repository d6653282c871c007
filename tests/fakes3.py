"""An in-memory S3 for unit tests (e2e tests use a real one, SeaweedFS): the calls the result
store makes, with S3's answers."""

from __future__ import annotations

import hashlib
import io
from typing import Any

from botocore.exceptions import ClientError, EndpointConnectionError


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "op")


class FakeS3:
    """The S3 calls the store makes, with S3's answers: 412 on a conditional write of an existing
    key, NoSuchKey, NoSuchBucket, pages of at most `page` keys."""

    def __init__(self, bucket: str = "results", page: int = 2) -> None:
        self.bucket = bucket
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.page = page
        self.down = False
        self.calls: list[str] = []
        self.transfer_configs: list[Any] = []  # the Config of each upload_fileobj

    def _check(self, bucket: str, call: str) -> None:
        self.calls.append(call)
        if self.down:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        if bucket != self.bucket:
            raise _error("NoSuchBucket", 404)

    def put_object(
        self, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str | None = None, **kw: Any
    ) -> Any:
        self._check(Bucket, "put")
        if IfNoneMatch == "*" and Key in self.objects:
            raise _error("PreconditionFailed", 412)
        self.objects[Key] = (Body, dict(kw.get("Metadata") or {}))
        return {}

    def get_object(self, Bucket: str, Key: str, IfMatch: str | None = None) -> Any:
        self._check(Bucket, "get")
        if Key not in self.objects:
            raise _error("NoSuchKey", 404)
        body, metadata = self.objects[Key]
        etag = f'"{hashlib.md5(body).hexdigest()}"'  # as S3 names a single-part object
        if IfMatch is not None and IfMatch != etag:
            raise _error("PreconditionFailed", 412)
        return {"Body": io.BytesIO(body), "Metadata": metadata, "ETag": etag, "ContentLength": len(body)}

    def list_objects_v2(self, Bucket: str, Prefix: str, ContinuationToken: str | None = None) -> Any:
        self._check(Bucket, "list")
        names = sorted(k for k in self.objects if k.startswith(Prefix))
        start = int(ContinuationToken or 0)
        chunk = names[start : start + self.page]
        more = start + self.page < len(names)
        answer: dict[str, Any] = {"Contents": [{"Key": k} for k in chunk], "IsTruncated": more}
        if more:
            answer["NextContinuationToken"] = str(start + self.page)
        return answer

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> Any:
        self._check(Bucket, "delete")
        for entry in Delete["Objects"]:
            self.objects.pop(entry["Key"], None)
        return {}

    def head_bucket(self, Bucket: str) -> Any:
        self.calls.append("head")
        if Bucket != self.bucket:
            raise _error("404", 404)
        return {}

    def head_object(self, Bucket: str, Key: str) -> Any:
        self._check(Bucket, "head_object")
        if Key not in self.objects:
            raise _error("404", 404)
        body, metadata = self.objects[Key]
        return {"Metadata": metadata, "ContentLength": len(body)}

    def upload_fileobj(
        self,
        Fileobj: Any,
        Bucket: str,
        Key: str,
        ExtraArgs: dict[str, Any] | None = None,
        Config: Any = None,
    ) -> None:
        self._check(Bucket, "upload")
        self.transfer_configs.append(Config)
        self.objects[Key] = (Fileobj.read(), dict((ExtraArgs or {}).get("Metadata") or {}))
