"""Readiness probes (httpGet, tcpSocket, exec) and their success/failure thresholds."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.cluster.kubelet.host import HOST_IP


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container.get('name')!r} has no port named {port!r}")


@dataclass
class ProbeTracker:
    probe: dict[str, Any]
    next_at: float
    successes: int = 0
    failures: int = 0
    ready: bool = False

    def record(self, ok: bool) -> None:
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.probe.get("successThreshold") or 1):
                self.ready = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.probe.get("failureThreshold") or 3):
                self.ready = False


def run_probe(
    probe: Mapping[str, Any], container: Mapping[str, Any], env: Mapping[str, str], cwd: str
) -> bool:
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = resolve_port(get.get("port", 80), container)
            host = get.get("host") or HOST_IP
            path = get.get("path") or "/"
            connection: http.client.HTTPConnection
            if str(get.get("scheme", "HTTP")).upper() == "HTTPS":
                # Like the kubelet: probes do not verify the serving certificate.
                context = ssl._create_unverified_context()
                connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                headers.setdefault("User-Agent", "kube-probe/process-kubelet")
                connection.request("GET", path, headers=headers)
                return 200 <= connection.getresponse().status < 400
            finally:
                connection.close()
        if "tcpSocket" in probe:
            tcp = probe["tcpSocket"]
            port = resolve_port(tcp.get("port", 0), container)
            with socket.create_connection((tcp.get("host") or HOST_IP, port), timeout=timeout):
                return True
        if "exec" in probe:
            command = list((probe["exec"] or {}).get("command") or [])
            result = subprocess.run(
                command, env=dict(env), cwd=cwd, timeout=timeout, capture_output=True, check=False
            )
            return result.returncode == 0
    except (OSError, ValueError, subprocess.SubprocessError, http.client.HTTPException):
        return False
    # grpc and unknown probe kinds: treat the container as ready rather than never.
    return True
