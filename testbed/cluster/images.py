"""Locally built images: OCI archives (`make image` writes dist/shardops-image.oci.tar), what they
hold, and their root filesystems unpacked once per manifest digest for the process-kubelet's runc.

An OCI archive is a tar of an OCI image layout: index.json names the manifests (with the
`org.opencontainers.image.ref.name` annotation buildah and skopeo write), each manifest names a
config blob and layer blobs (tar, gzip-compressed or not).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# What `make image` (hack/image.sh) writes.
SHARDOPS_ARCHIVE = REPO_ROOT / "dist" / "shardops-image.oci.tar"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
DEFAULT_REGISTRY = "docker.io"


def build_shardops_image() -> str | None:
    """`make image` (hack/image.sh: a no-op when its inputs did not change), so that pods naming the
    image run today's code; returns its digest, or None (and says why on stderr) when it cannot be
    built here: those pods then run as processes.

    One build at a time per checkout: the e2e workers of `pytest -n 2` each start a cluster, and two
    builds at once would write the same dist/ files; the second finds the image up to date."""
    SHARDOPS_ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
    with (SHARDOPS_ARCHIVE.parent / ".image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(
            ["bash", str(REPO_ROOT / "hack" / "image.sh")], stdout=subprocess.PIPE, text=True, check=False
        )
    if result.returncode != 0:
        print(
            f"warning: hack/image.sh failed ({result.returncode}): pods naming the shardops image run as "
            "processes, not in runc",
            file=sys.stderr,
        )
        return None
    return result.stdout.strip().splitlines()[-1]


def rootfs_cache() -> Path:
    """Where root filesystems are unpacked, one directory per manifest digest (shared by clusters)."""
    base = (
        os.environ.get("SHARDOPS_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardops"
    )
    return Path(base) / "images" / "rootfs"


def normalize_reference(reference: str) -> str:
    """A Docker-style image reference in full: `shardops:dev` -> `docker.io/library/shardops:dev`,
    a missing tag becomes `:latest`; a digest (`@sha256:...`) is kept as it is."""
    name, at, digest = reference.partition("@")
    first, slash, _rest = name.partition("/")
    if not slash:
        name = f"{DEFAULT_REGISTRY}/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"{DEFAULT_REGISTRY}/{name}"
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + at + digest


@dataclass(frozen=True)
class LocalImage:
    """One image of an OCI archive: its names, manifest digest, config and layer blobs."""

    archive: Path
    digest: str
    names: tuple[str, ...]
    config: Mapping[str, Any]
    layers: tuple[tuple[str, str], ...]  # (blob digest, media type), lowest first
    # The image config's own `config` section: User, Env, Entrypoint, Cmd, WorkingDir.
    process: Mapping[str, Any] = field(default_factory=dict)

    @property
    def user(self) -> str:
        return str(self.process.get("User") or "")

    def matches(self, reference: str) -> bool:
        wanted = normalize_reference(reference)
        if "@" in wanted:
            return wanted.split("@", 1)[1] == self.digest
        return wanted in {normalize_reference(name) for name in self.names}


def _blob(archive: tarfile.TarFile, digest: str) -> IO[bytes]:
    algorithm, _, hexdigest = digest.partition(":")
    member = archive.extractfile(f"blobs/{algorithm}/{hexdigest}")
    if member is None:
        raise ValueError(f"blob {digest} missing from the archive")
    return member


def read_archive(path: Path) -> list[LocalImage]:
    """The images of the OCI archive at `path` (one per manifest of its index)."""
    images = []
    with tarfile.open(path) as archive:
        index = json.load(_blob_or_file(archive, "index.json"))
        for entry in index.get("manifests") or []:
            manifest = json.load(_blob(archive, entry["digest"]))
            config = json.load(_blob(archive, manifest["config"]["digest"]))
            name = (entry.get("annotations") or {}).get(REF_NAME_ANNOTATION)
            images.append(
                LocalImage(
                    archive=path,
                    digest=entry["digest"],
                    names=(name,) if name else (),
                    config=config,
                    layers=tuple((layer["digest"], layer["mediaType"]) for layer in manifest["layers"]),
                    process=config.get("config") or {},
                )
            )
    return images


def _blob_or_file(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    member = archive.extractfile(name)
    if member is None:
        raise ValueError(f"{name} missing from the archive")
    return member


def find_image(archives: Iterable[Path], reference: str) -> LocalImage | None:
    """The first image of these archives that `reference` names; None when none does."""
    for path in archives:
        if not path.is_file():
            continue
        for image in read_archive(path):
            if image.matches(reference):
                return image
    return None


def _open_layer(blob: IO[bytes], media_type: str) -> IO[bytes]:
    if media_type.endswith("+gzip") or media_type.endswith(".gzip"):
        return gzip.GzipFile(fileobj=blob)  # type: ignore[return-value]
    if media_type.endswith("+zstd"):
        raise ValueError(f"layer media type {media_type}: zstd layers are not supported")
    return blob


def unpacked_rootfs(image: LocalImage, cache_dir: Path) -> Path:
    """The image's root filesystem, unpacked once into `cache_dir/<digest>/rootfs` and reused.

    Layers are applied in order (with OCI whiteouts); ownership and modes are kept (as root).
    The directory appears complete or not at all: it is unpacked beside it and renamed.
    """
    target = cache_dir / image.digest.replace(":", "-") / "rootfs"
    if target.is_dir():
        # In use: `make image` prunes only the root filesystems no pod used for two days.
        os.utime(target.parent)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with tarfile.open(image.archive) as archive:
            for digest, media_type in image.layers:
                data = _blob(archive, digest)
                with tarfile.open(fileobj=_open_layer(data, media_type), mode="r|") as layer:
                    _apply_layer(layer, staging)
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _apply_layer(layer: tarfile.TarFile, root: Path) -> None:
    for member in layer:
        path = Path(_member_path(member.name))
        if ".." in path.parts:
            raise ValueError(f"layer entry {member.name!r} leaves the root")
        base = path.name
        if base == ".wh..wh..opq":
            for child in (root / path.parent).glob("*"):
                _remove(child)
            continue
        if base.startswith(".wh."):
            _remove(root / path.parent / base[len(".wh.") :])
            continue
        destination = root / path
        if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
            destination.unlink()
        layer.extract(member, root, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def _member_path(name: str) -> str:
    return name.removeprefix("./").lstrip("/")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def layer_names(image: LocalImage) -> set[str]:
    """Every path in the image's layers (for tests: what the image holds, without unpacking it)."""
    names: set[str] = set()
    with tarfile.open(image.archive) as archive:
        for digest, media_type in image.layers:
            stream = _open_layer(_blob(archive, digest), media_type)
            with tarfile.open(fileobj=stream, mode="r|") as layer:
                names.update(_member_path(m.name) for m in layer)
    return names
