"""Per-namespace store identities on the local SeaweedFS: what an administrator does when adding a
namespace to an installation (docs/install.md, "Adding a namespace"), done for the tests and the demo.

`provision_namespace` gives a namespace S3 keys that reach only `<bucket>/<prefix>/<namespace>/`
(SeaweedFS actions `Read|Write|List|Tagging:<bucket>/<prefix>/<namespace>/*`, matched by its
Identity.canDo as a key prefix) and puts them in the namespace's store Secret (`shardops-store`):
the workers of that namespace get only these, the installation's admin keys stay with the operator.

The identities live in the cluster's `-s3.config` file (lifecycle.py writes the admin one there);
SeaweedFS reads it again on SIGHUP, and a provision returns only once the new keys answer a real
request, so no sleep stands in for the reload.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubernetes import client

from shardops.api.store import DEFAULT_S3_PREFIX, DEFAULT_STORE_SECRET
from testbed.cluster import lifecycle

# SeaweedFS's actions; Admin (bucket creation, every key) is never given to a namespace.
NAMESPACE_ACTIONS = ("Read", "Write", "List", "Tagging")


def area(bucket: str, prefix: str, namespace: str) -> str:
    """`<bucket>/<prefix>/<namespace>/`: the one place a namespace's keys reach."""
    stripped = prefix.strip("/")
    return f"{bucket}/{stripped}/{namespace}/" if stripped else f"{bucket}/{namespace}/"


def identity(
    name: str, access_key: str, secret_key: str, bucket: str, prefix: str, namespace: str
) -> dict[str, Any]:
    """A SeaweedFS identity whose every action is limited to the namespace's area."""
    scope = area(bucket, prefix, namespace)
    return {
        "name": name,
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": [f"{action}:{scope}*" for action in NAMESPACE_ACTIONS],
    }


def provision_namespace(
    api: client.ApiClient,
    namespace: str,
    *,
    directory: Path = lifecycle.DEFAULT_DIR,
    store: lifecycle.ObjectStore | None = None,
    prefix: str = DEFAULT_S3_PREFIX,
    secret: str = DEFAULT_STORE_SECRET,
    timeout: float = 30.0,
) -> lifecycle.ObjectStore:
    """Keys for `namespace` that reach only its area of the local SeaweedFS of the cluster in
    `directory`, and the namespace's store Secret holding them (replaced if there); the scoped store
    (same endpoint and bucket, the namespace's keys). Provisioning again (another prefix) adds an
    identity: the Secret then holds the newest keys."""
    admin = store or lifecycle.running_object_store(directory)
    if admin is None:
        raise RuntimeError(f"no local SeaweedFS in {directory}: provision_namespace needs the testbed's S3")
    digest = hashlib.sha256(area(admin.bucket, prefix, namespace).encode()).hexdigest()[:10]
    scoped = replace(
        admin,
        access_key_id=f"NS{digest.upper()}{secrets.token_hex(3).upper()}",
        secret_access_key=secrets.token_urlsafe(30),
    )
    name = f"ns-{namespace}-{digest}"
    with _locked(directory / "s3-identities.json") as config:
        document = json.loads(config.read_text())
        kept = [i for i in document.get("identities", []) if i.get("name") != name]
        kept.append(
            identity(name, scoped.access_key_id, scoped.secret_access_key, admin.bucket, prefix, namespace)
        )
        _write_atomically(config, json.dumps({**document, "identities": kept}, indent=2))
        _reload(directory)
    _wait_usable(scoped, prefix, namespace, timeout)
    put_store_secret(api, namespace, secret, scoped)
    return scoped


@contextmanager
def _locked(path: Path) -> Iterator[Path]:
    """`path`, with no other provision (another test process) editing it meanwhile."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomically(path: Path, text: str) -> None:
    """A whole new file under the name: SeaweedFS never reads half of one."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.chmod(temporary, 0o600)
    temporary.replace(path)


def _reload(directory: Path) -> None:
    """SIGHUP to the cluster's SeaweedFS: it reads its -s3.config file again."""
    marker = f"{lifecycle.MARKER_ENV}={directory}".encode()
    for pid in lifecycle.leftovers(directory):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if command and command[0].endswith(b"/weed") and marker in environ:
            os.kill(pid, signal.SIGHUP)
            return
    raise RuntimeError(f"the SeaweedFS of the cluster in {directory} is not running")


def _wait_usable(scoped: lifecycle.ObjectStore, prefix: str, namespace: str, timeout: float) -> None:
    """Until the new keys list their own area (SeaweedFS reloads its identities asynchronously)."""
    from botocore.exceptions import ClientError

    s3 = scoped.client()
    own = area("", prefix, namespace).lstrip("/")
    deadline = time.monotonic() + timeout
    while True:
        try:
            s3.list_objects_v2(Bucket=scoped.bucket, Prefix=own, MaxKeys=1)
            return
        except ClientError as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not take the identity of {namespace}: {error}") from None
        time.sleep(0.2)  # polling a condition with a deadline, not a synchronization by time


def put_store_secret(api: client.ApiClient, namespace: str, name: str, scoped: lifecycle.ObjectStore) -> None:
    """The Secret `name` in `namespace` holding `scoped`'s keys, created or replaced (the keys of a
    namespace, or the installation's in the operator's namespace)."""
    core = client.CoreV1Api(api)
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name),
        string_data={
            "AWS_ACCESS_KEY_ID": scoped.access_key_id,
            "AWS_SECRET_ACCESS_KEY": scoped.secret_access_key,
        },
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except client.ApiException as error:
        if error.status != 409:
            raise
        core.replace_namespaced_secret(name, namespace, body)
