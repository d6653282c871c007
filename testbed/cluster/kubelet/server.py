"""The kubelet API, the part `kubectl logs` needs: GET /containerLogs/<namespace>/<pod>/<container>.

kube-apiserver proxies `kubectl logs [-f]` here (pods/log): it dials the Node's InternalIP at
status.daemonEndpoints.kubeletEndpoint.Port over TLS, verifying this server's certificate with the
cluster CA (--kubelet-certificate-authority) and presenting its client certificate
(--kubelet-client-certificate), which this server requires to be signed by the same CA. Only
loopback is listened on.

Query parameters served: follow, tailLines, limitBytes, previous (the run before the last restart);
timestamps and sinceSeconds/sinceTime are accepted and ignored (the log files carry no times).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from testbed.cluster.kubelet.host import HOST_IP

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.2
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogSegment:
    """The bytes of one container run in its log file: [start, end), end None while it may grow."""

    path: Path
    start: int
    end: int | None
    # True while the run's process lives (a follow keeps waiting for more).
    running: Callable[[], bool]


# (namespace, pod, container, previous) -> the segment, or None when there is no such container run.
LogLookup = Callable[[str, str, str, bool], LogSegment | None]


def tail_start(data: bytes, lines: int) -> int:
    """Offset in `data` where its last `lines` lines begin (a final line without newline counts)."""
    if lines <= 0:
        return len(data)
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    position = end
    for _ in range(lines):
        position = data.rfind(b"\n", 0, position)
        if position < 0:
            return 0
    return position + 1


class KubeletServer:
    def __init__(
        self, port: int, cert: Path, key: Path, client_ca: Path, lookup: LogLookup, stop: threading.Event
    ) -> None:
        self.lookup = lookup
        self.stop = stop
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        context.load_verify_locations(cafile=str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
        server = self

        class Handler(_Handler):
            kubelet_server = server

        self.httpd = ThreadingHTTPServer((HOST_IP, port), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-api", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.thread.start()
        log.info("kubelet API on https://%s:%d", HOST_IP, self.port)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    kubelet_server: KubeletServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubelet API: " + format, *args)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            self._plain(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._plain(404, f"not served by the process-kubelet: {url.path}\n".encode())
            return
        query = urllib.parse.parse_qs(url.query)

        def flag(name: str) -> bool:
            return (query.get(name) or ["false"])[-1].lower() in ("true", "1", "")

        def number(name: str) -> int | None:
            values = query.get(name)
            return int(values[-1]) if values and values[-1].lstrip("-").isdigit() else None

        _, namespace, pod, container = parts
        segment = self.kubelet_server.lookup(namespace, pod, container, flag("previous"))
        if segment is None:
            previous = " previous" if flag("previous") else ""
            self._plain(
                404, f'no{previous} run of container "{container}" in pod "{namespace}/{pod}"\n'.encode()
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self._stream(segment, flag("follow"), number("tailLines"), number("limitBytes"))
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _stream(self, segment: LogSegment, follow: bool, tail: int | None, limit: int | None) -> None:
        position = segment.start
        remaining = limit if limit is not None and limit >= 0 else None
        with segment.path.open("rb") as handle:
            if tail is not None:
                handle.seek(segment.start)
                head = handle.read() if segment.end is None else handle.read(segment.end - segment.start)
                position = segment.start + tail_start(head, tail)
            while not self.kubelet_server.stop.is_set():
                # Read whether it runs before reading: a run that ended has written its last byte.
                running = segment.end is None and segment.running()
                handle.seek(position)
                wanted = CHUNK_BYTES if segment.end is None else min(CHUNK_BYTES, segment.end - position)
                if remaining is not None:
                    wanted = min(wanted, remaining)
                data = handle.read(max(wanted, 0))
                position += len(data)
                self._chunk(data)
                if remaining is not None:
                    remaining -= len(data)
                    if remaining <= 0:
                        return
                if data:
                    continue
                if not follow or not running:
                    return
                time.sleep(FOLLOW_POLL_SECONDS)

    def _plain(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
