"""Containers in runc, for pods whose image was built on this machine (an OCI archive, images.py).

The image's root filesystem is unpacked once per manifest digest (under the shared cache) and used
read-only by every container of that image; a container whose securityContext allows a writable
root gets an overlay over it (its upper layer under the pod's directory, new on every run). The
container shares the host's network (there is no CNI; podIP = hostIP = 127.0.0.1, as for process
pods) and gets its own mount, PID, IPC and UTS namespaces (hostname = the pod's).

What the pod spec decides (`bundle_config`, pure): argv (command/args over the image's
entrypoint/cmd, `$(VAR)` expanded), env (the image's, then the kubelet's, then the pod's), working
directory, user (runAsUser/runAsGroup over the image's numeric USER; runAsNonRoot refused for
UID 0 or a non-numeric user), supplemental groups (fsGroup, supplementalGroups), capabilities
(the container runtime default set, minus `drop` (ALL drops all), plus `add`), noNewPrivileges
(allowPrivilegeEscalation: false), readOnlyRootFilesystem, and the mounts: emptyDir volumes
(a directory per pod, mode 0777) and the service-account identity (token, ca.crt, namespace at
/var/run/secrets/kubernetes.io/serviceaccount, or wherever the pod mounts its kube-api-access
volume; the kubeconfig at KUBE_MOUNT). Other volume types are refused with the reason. Seccomp
profiles and resource limits are not applied. Readiness probes: httpGet and tcpSocket reach the
container on the host's network; an exec probe runs on the host, not inside the container.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cluster.images import LocalImage, find_image, unpacked_rootfs
from testbed.cluster.kubelet.container_config import expand

log = logging.getLogger(__name__)

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# Where a runc container finds the kubeconfig carrying its pod's token ($KUBECONFIG).
KUBE_MOUNT = "/var/run/secrets/shardops.dev/kube"
# The capabilities containerd and CRI-O give a container unless its securityContext says otherwise.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
# From `runc spec`: kernel interfaces a container must not read or write.
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
)  # fmt: skip
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


def _mount(destination: str, type_: str, source: str, *options: str) -> dict[str, Any]:
    return {"destination": destination, "type": type_, "source": source, "options": list(options)}


BASE_MOUNTS: tuple[dict[str, Any], ...] = (
    {"destination": "/proc", "type": "proc", "source": "proc"},
    _mount("/dev", "tmpfs", "tmpfs", "nosuid", "strictatime", "mode=755", "size=65536k"),
    _mount(
        "/dev/pts",
        "devpts",
        "devpts",
        "nosuid",
        "noexec",
        "newinstance",
        "ptmxmode=0666",
        "mode=0620",
        "gid=5",
    ),
    _mount("/dev/shm", "tmpfs", "shm", "nosuid", "noexec", "nodev", "mode=1777", "size=65536k"),
    _mount("/dev/mqueue", "mqueue", "mqueue", "nosuid", "noexec", "nodev"),
    _mount("/sys", "sysfs", "sysfs", "nosuid", "noexec", "nodev", "ro"),
)


class ContainerConfigError(Exception):
    """The pod spec asks for something this container cannot be started with (the reason says what)."""


@dataclass(frozen=True)
class PodPaths:
    """Host paths of one pod the container mounts."""

    service_account_dir: Path | None
    kube_dir: Path | None
    volumes_dir: Path


def image_env(image: LocalImage) -> dict[str, str]:
    pairs = (entry.partition("=") for entry in image.process.get("Env") or [])
    return {key: value for key, _, value in pairs if key}


def container_argv(spec: Mapping[str, Any], image: LocalImage, env: Mapping[str, str]) -> list[str]:
    """Kubernetes' rule: `command` replaces the image's ENTRYPOINT, `args` its CMD."""
    command = list(spec.get("command") or [])
    args = list(spec.get("args") or [])
    if command:
        argv = [*command, *args]
    else:
        argv = [*(image.process.get("Entrypoint") or []), *(args or image.process.get("Cmd") or [])]
    if not argv:
        raise ContainerConfigError(f"container {spec.get('name')!r}: no command, and image has no entrypoint")
    return [expand(str(part), env) for part in argv]


def _effective(key: str, container: Mapping[str, Any], pod: Mapping[str, Any]) -> Any:
    value = container.get(key)
    return pod.get(key) if value is None else value


def container_user(
    spec: Mapping[str, Any], pod_spec: Mapping[str, Any], image: LocalImage
) -> tuple[int, int, list[int]]:
    """(uid, gid, additional gids) the way a kubelet decides them, runAsNonRoot checked."""
    container_sc = spec.get("securityContext") or {}
    pod_sc = pod_spec.get("securityContext") or {}
    image_user, _, image_group = image.user.partition(":")
    uid = _effective("runAsUser", container_sc, pod_sc)
    if uid is None:
        if image_user and not image_user.isdigit():
            if _effective("runAsNonRoot", container_sc, pod_sc):
                raise ContainerConfigError(
                    f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                    "cannot verify user is non-root"
                )
            raise ContainerConfigError(f"image user {image_user!r} is not numeric: set runAsUser")
        uid = int(image_user or 0)
    gid = _effective("runAsGroup", container_sc, pod_sc)
    if gid is None:
        gid = int(image_group) if image_group.isdigit() else 0
    if _effective("runAsNonRoot", container_sc, pod_sc) and int(uid) == 0:
        raise ContainerConfigError("container has runAsNonRoot and image will run as root")
    extra = [int(g) for g in pod_sc.get("supplementalGroups") or []]
    if pod_sc.get("fsGroup") is not None:
        extra.append(int(pod_sc["fsGroup"]))
    return int(uid), int(gid), sorted(set(extra))


def capabilities(spec: Mapping[str, Any]) -> list[str]:
    wanted = (spec.get("securityContext") or {}).get("capabilities") or {}

    def names(key: str) -> set[str]:
        return {
            n if n.startswith("CAP_") else f"CAP_{n}" for n in (str(c).upper() for c in wanted.get(key) or [])
        }

    drop, add = names("drop"), names("add")
    kept = set() if "CAP_ALL" in drop else set(DEFAULT_CAPABILITIES) - drop
    return sorted(kept | (add - {"CAP_ALL"}))


def read_only_root(spec: Mapping[str, Any]) -> bool:
    return bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem"))


def is_service_account_volume(volume: Mapping[str, Any]) -> bool:
    """The projected volume the ServiceAccount admission plugin adds (kube-api-access-*): token,
    the cluster CA and the namespace, which the kubelet's identity files already are."""
    sources = (volume.get("projected") or {}).get("sources") or []
    return bool(sources) and any("serviceAccountToken" in source for source in sources)


def volume_mounts(
    spec: Mapping[str, Any], pod_spec: Mapping[str, Any], paths: PodPaths
) -> list[dict[str, Any]]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    mounts: list[dict[str, Any]] = []
    identity_mounted = False
    for mount in spec.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ContainerConfigError(f"volumeMount {mount['name']!r}: no such volume in the pod")
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise ContainerConfigError(f"volumeMount {mount['name']!r}: subPath is not supported")
        if is_service_account_volume(volume):
            if paths.service_account_dir is None:
                continue
            source = paths.service_account_dir
            identity_mounted = identity_mounted or mount["mountPath"] == SA_MOUNT
        elif "emptyDir" in volume:
            source = paths.volumes_dir / mount["name"]
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise ContainerConfigError(
                f"volume {mount['name']!r} ({', '.join(kinds)}): the process-kubelet's runc containers "
                "mount emptyDir volumes and the service-account token only"
            )
        options = ["rbind", "ro" if mount.get("readOnly") else "rw", "nosuid", "nodev"]
        mounts.append(_mount(mount["mountPath"], "bind", str(source), *options))
    if paths.service_account_dir is not None and not identity_mounted:
        mounts.append(_mount(SA_MOUNT, "bind", str(paths.service_account_dir), "rbind", "ro"))
    if paths.kube_dir is not None:
        mounts.append(_mount(KUBE_MOUNT, "bind", str(paths.kube_dir), "rbind", "ro"))
    return mounts


def bundle_config(
    *,
    spec: Mapping[str, Any],
    pod_spec: Mapping[str, Any],
    image: LocalImage,
    rootfs: Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    hostname: str,
    paths: PodPaths,
) -> dict[str, Any]:
    """The OCI runtime config (config.json) of one container run."""
    uid, gid, extra_gids = container_user(spec, pod_spec, image)
    caps = capabilities(spec)
    escalation = (spec.get("securityContext") or {}).get("allowPrivilegeEscalation")
    cwd = str(spec.get("workingDir") or image.process.get("WorkingDir") or "/")
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, **({"additionalGids": extra_gids} if extra_gids else {})},
            "args": list(argv),
            "env": [f"{key}={value}" for key, value in env.items()],
            "cwd": cwd,
            # A non-root user has no effective capabilities after exec unless they are ambient;
            # containerd sets them so too (bounding, effective, permitted).
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": escalation is False,
        },
        "root": {"path": str(rootfs), "readonly": read_only_root(spec)},
        "hostname": hostname,
        "mounts": [*BASE_MOUNTS, *volume_mounts(spec, pod_spec, paths)],
        "linux": {
            # No network namespace: the host's network, as the process pods have it.
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }


class RuncRuntime:
    """The runc side of the process-kubelet: which images are local, their rootfs, bundles, runc calls."""

    def __init__(
        self, runc: str | None, state_dir: Path, archives: Sequence[Path], rootfs_cache: Path
    ) -> None:
        self.runc = runc
        self.state_dir = state_dir
        self.root = state_dir / "runc"
        self.archives = list(archives)
        self.rootfs_cache = rootfs_cache
        self._unpack_lock = threading.Lock()

    @classmethod
    def detect(cls, state_dir: Path, archives: Sequence[Path], rootfs_cache: Path) -> RuncRuntime:
        return cls(shutil.which("runc"), state_dir, archives, rootfs_cache)

    def unavailable(self) -> str | None:
        """Why containers cannot run in runc here (None when they can)."""
        if self.runc is None:
            return "runc is not installed (make tools installs it)"
        if os.geteuid() != 0:
            return "runc needs root here (the process-kubelet runs as a user)"
        return None

    def local_image(self, reference: str) -> LocalImage | None:
        return find_image(self.archives, reference) if reference else None

    def rootfs(self, image: LocalImage) -> Path:
        with self._unpack_lock:
            return unpacked_rootfs(image, self.rootfs_cache)

    def _runc(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        assert self.runc is not None
        return subprocess.run(
            [self.runc, "--root", str(self.root), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def command(self, bundle: Path, container_id: str) -> list[str]:
        assert self.runc is not None
        return [self.runc, "--root", str(self.root), "run", "--bundle", str(bundle), container_id]

    def kill(self, container_id: str, signal_name: str) -> None:
        self._runc("kill", container_id, signal_name)

    def delete(self, container_id: str) -> None:
        self._runc("delete", "--force", container_id)

    def remove_leftovers(self) -> None:
        """Containers an earlier kubelet on this state directory left running: not ours to adopt."""
        if self.unavailable() is not None:
            return
        if self.root.is_dir():
            listed = self._runc("list", "--quiet")
            for container_id in listed.stdout.split():
                self.delete(container_id)
                log.info("removed leftover runc container %s", container_id)
        for mount_point in mounts_under(self.state_dir):
            unmount(mount_point)
            log.info("unmounted leftover %s", mount_point)


def mount_overlay(lower: Path, run_dir: Path) -> Path:
    """A writable root over the shared read-only rootfs: a fresh upper layer under `run_dir`."""
    unmount(run_dir / "root")
    for name in ("upper", "work"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
        (run_dir / name).mkdir(parents=True)
    merged = run_dir / "root"
    merged.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={lower},upperdir={run_dir / 'upper'},workdir={run_dir / 'work'}"
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True, capture_output=True
    )
    return merged


def mounts_under(directory: Path) -> list[Path]:
    """Mount points below `directory` (overlay roots of containers), deepest first."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = Path(line.split()[4].replace("\\040", " "))
            if directory in point.parents:
                found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(["umount", "--lazy", str(path)], check=False, capture_output=True, timeout=30)
