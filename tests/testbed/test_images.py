"""Locally built images (testbed/cluster/images.py): an OCI archive read, found by reference, and its
layers unpacked in order, OCI whiteouts applied, once per digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

from testbed.cluster.images import find_image, read_archive, unpacked_rootfs


def _tar(files: dict[str, bytes | None]) -> bytes:
    """A layer: name -> content (None: a directory)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.size, info.mode = len(content), 0o644
                archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _archive(path: Path, layers: list[bytes], name: str) -> str:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    config = blob(json.dumps({"config": {"User": "65532:65532", "Entrypoint": ["app"]}}).encode())
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(gzip.compress(layers[0]))},
            *({"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer)} for layer in layers[1:]),
        ],
    }
    manifest_ref = blob(json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest_ref,
                "annotations": {"org.opencontainers.image.ref.name": name},
            }
        ],
    }
    files: dict[str, bytes | None] = {
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
        "index.json": json.dumps(index).encode(),
    }
    files.update({f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()})
    path.write_bytes(_tar(files))
    return str(manifest_ref["digest"])


def test_archive_read_found_and_unpacked_with_whiteouts(tmp_path: Path) -> None:
    base = _tar(
        {"etc": None, "etc/keep": b"kept", "etc/gone": b"x", "opt": None, "opt/old": b"old", "bin": None}
    )
    top = _tar({"etc/.wh.gone": b"", "opt/.wh..wh..opq": b"", "opt/new": b"new", "bin/app": b"#!"})
    archive = tmp_path / "image.oci.tar"
    digest = _archive(archive, [base, top], "registry.example.com/app:1")

    (image,) = read_archive(archive)
    assert image.digest == digest and image.user == "65532:65532"
    assert find_image([tmp_path / "missing.tar", archive], "registry.example.com/app:1") == image
    assert find_image([archive], "registry.example.com/app:2") is None

    rootfs = unpacked_rootfs(image, tmp_path / "cache")
    assert rootfs == tmp_path / "cache" / digest.replace(":", "-") / "rootfs"
    assert (rootfs / "etc" / "keep").read_bytes() == b"kept"
    assert not (rootfs / "etc" / "gone").exists(), "a whiteout removes the lower file"
    assert sorted(p.name for p in (rootfs / "opt").iterdir()) == ["new"], "an opaque whiteout empties the dir"
    assert (rootfs / "bin" / "app").read_bytes() == b"#!"
    assert not list(rootfs.rglob(".wh.*"))
    (rootfs / "etc" / "keep").write_bytes(b"changed")
    assert unpacked_rootfs(image, tmp_path / "cache") == rootfs
    assert (rootfs / "etc" / "keep").read_bytes() == b"changed", "unpacked once per digest, then reused"
