"""Pod processes and their files on this machine: log paths, pid files, private files, process groups."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)


def pod_log_path(state_dir: Path | str, namespace: str, pod_name: str, container: str) -> Path:
    """Where the stdout+stderr of `container` in pod `namespace/pod_name` is appended."""
    return Path(state_dir) / "logs" / namespace / pod_name / f"{container}.log"


def write_private(path: Path, data: bytes | str, mode: int = 0o600) -> None:
    """Atomic replace, so a process re-reading a refreshed token never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def process_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot: tells our process apart from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def record_process(pod_dir: Path, container: str, pid: int) -> None:
    """Note a container's process group, so that a later kubelet can stop it (kill_recorded_processes)."""
    start_ticks = process_start_time(pid) or ""
    write_private(pod_dir / "pids" / f"{container}.pid", f"{pid} {start_ticks}\n")


def forget_process(pod_dir: Path, container: str) -> None:
    with contextlib.suppress(OSError):
        (pod_dir / "pids" / f"{container}.pid").unlink()


def kill_recorded_processes(pod_dir: Path) -> None:
    """SIGKILL the process groups an earlier kubelet recorded in `pod_dir`, if still the same processes."""
    for pid_file in (pod_dir / "pids").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid_text, _, ticks = pid_file.read_text().strip().partition(" ")
            pid = int(pid_text)
            if ticks and process_start_time(pid) == ticks:
                signal_group(pid, signal.SIGKILL)
                log.info("killed leftover process group %d (%s)", pid, pid_file)
            pid_file.unlink()
