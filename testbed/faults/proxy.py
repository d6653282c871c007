"""A loopback HTTPS proxy in front of kube-apiserver that injects API faults: throttling (429 with
Retry-After), server errors (500, 503), latency spikes, and writes the API server applied whose
answer is lost (answered 504, or the connection closed) — the ambiguous outcome. docs/faults.md,
"API faults through a proxy", says what a scenario injects and what it counts.

    with ApiProxy(upstream, ca, cert, key, seed=13) as proxy:   # started: proxy.url
        proxy.set_rates(FaultRates(throttled=0.04, ...))         # from now on
        ...
        traffic = proxy.traffic()                                # every exchange, counted

It terminates TLS with a serving certificate the cluster CA signed (testbed/cluster/pki.py,
`proxy_cert`), so a kubeconfig that trusts the cluster CA verifies it, and forwards each request
on its own upstream TLS connection to kube-apiserver (verified with the same CA). Identity passes
through: a bearer token (a pod's service-account token) is forwarded as it came. The proxy asks no
client certificate, so a client that authenticates with one reaches the API server anonymous:
point only token users at it (the process-kubelet's pods: their namespace's
`e2e.shardops.dev/api-server` annotation, testbed/cluster/kubelet/identity.py).

Faults are drawn per request from one seeded generator (`choose`: one draw each, whatever the
rates, so a seed fixes the sequence of faults). Refusals (429, 500, 503) are answered without
forwarding — nothing reached the API server, as when its max-in-flight filter or a load balancer
refuses; a spike waits before forwarding; a dropped answer is drawn for mutating requests only
(POST, PUT, PATCH, DELETE): the request is forwarded, the API server's whole answer read (so the
write is applied or refused there), then the client gets a 504 Status or a closed connection
instead. A watch is answered as it comes: refused or delayed at its start like any request, then
streamed chunk by chunk as the API server sends it, never cut or altered mid-way.

Every exchange is recorded (`Exchange`: when, which client, what, which fault, what was answered);
`Traffic` counts them: requests per second in all and per client, faults by kind, and whether a
client that was told Retry-After sent the same request again sooner.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import enum
import json
import random
import ssl
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Headers of one connection, not of the request: never forwarded as they came.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)
HEAD_LIMIT = 1 << 20
READ_SIZE = 64 * 1024
# An upstream connection idle this long is not reused: the API server may be closing it.
UPSTREAM_IDLE_SECONDS = 30.0
REASONS = {
    429: ("Too Many Requests", "TooManyRequests"),
    500: ("Internal Server Error", "InternalError"),
    502: ("Bad Gateway", "BadGateway"),
    503: ("Service Unavailable", "ServiceUnavailable"),
    504: ("Gateway Timeout", "Timeout"),
    501: ("Not Implemented", "NotImplemented"),
}


class Fault(enum.StrEnum):
    NONE = "none"
    THROTTLED = "429"
    ERROR_500 = "500"
    UNAVAILABLE = "503"
    SPIKE = "latency spike"
    # Forwarded, answered by the API server, and that answer replaced by a 504 / a closed connection.
    DROPPED_504 = "answer dropped (504)"
    DROPPED_CLOSE = "answer dropped (connection closed)"

    @property
    def dropped(self) -> bool:
        return self in (Fault.DROPPED_504, Fault.DROPPED_CLOSE)

    @property
    def refused(self) -> bool:
        """Answered by the proxy without forwarding."""
        return self in (Fault.THROTTLED, Fault.ERROR_500, Fault.UNAVAILABLE)


@dataclass(frozen=True)
class FaultRates:
    """The chance of each fault per request. `dropped` applies to mutating requests only (a read
    drawn for it passes untouched), and `dropped_close_share` of the drops close the connection
    instead of answering 504. The other rates apply to every request, watches included (only at
    their start). The rates (without the share) add up to at most 1: one draw picks one fault."""

    throttled: float = 0.0
    error_500: float = 0.0
    unavailable: float = 0.0
    spike: float = 0.0
    dropped: float = 0.0
    dropped_close_share: float = 0.5
    spike_seconds: float = 1.0
    # Whole seconds: what the API server's own 429s carry (HTTP allows only an integer or a date).
    retry_after_seconds: int = 1

    def __post_init__(self) -> None:
        rates = (self.throttled, self.error_500, self.unavailable, self.spike, self.dropped)
        if any(not 0.0 <= r <= 1.0 for r in (*rates, self.dropped_close_share)):
            raise ValueError(f"rates must be within [0, 1]: {self}")
        if sum(rates) > 1.0 + 1e-9:
            raise ValueError(f"rates add up to {sum(rates):.3f} > 1: {self}")
        if self.spike_seconds < 0 or self.retry_after_seconds < 0:
            raise ValueError(f"negative delay: {self}")

    def describe(self) -> str:
        def pct(rate: float) -> str:
            return f"{rate * 100:g} %"

        return (
            f"429 {pct(self.throttled)} (Retry-After {self.retry_after_seconds} s), "
            f"500 {pct(self.error_500)}, 503 {pct(self.unavailable)}, "
            f"{self.spike_seconds:g} s spikes {pct(self.spike)}, "
            f"answers of writes dropped {pct(self.dropped)} "
            f"({pct(self.dropped_close_share)} of them by closing the connection)"
        )


NO_FAULTS = FaultRates()


def choose(draw: float, rates: FaultRates, mutating: bool) -> Fault:
    """The fault for a request, from one uniform draw in [0, 1): each kind owns a slice of that
    interval as wide as its rate, in a fixed order; the rest is no fault."""
    edge = 0.0
    for fault, rate in (
        (Fault.THROTTLED, rates.throttled),
        (Fault.ERROR_500, rates.error_500),
        (Fault.UNAVAILABLE, rates.unavailable),
        (Fault.SPIKE, rates.spike),
    ):
        if draw < edge + rate:
            return fault
        edge += rate
    if draw < edge + rates.dropped:
        if not mutating:
            return Fault.NONE
        # Where the draw fell inside the drop slice picks how the answer is lost.
        within = (draw - edge) / rates.dropped
        return Fault.DROPPED_CLOSE if within < rates.dropped_close_share else Fault.DROPPED_504
    return Fault.NONE


# --- who is asking ------------------------------------------------------------------------------


def token_claims(authorization: str | None) -> dict[str, Any]:
    """The claims of a bearer JWT, unverified ({} for anything else): the API server verifies the
    token; the proxy only names who sent it."""
    if not authorization or not authorization.lower().startswith("bearer "):
        return {}
    parts = authorization.split(" ", 1)[1].strip().split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def client_of(authorization: str | None, user_agent: str | None) -> str:
    """A client's identity for counting: the pod its service-account token is bound to (else the
    token's subject, else "anonymous"), and the product of its user agent — one process can hold
    several clients (the operator's own API client and kopf's)."""
    claims = token_claims(authorization)
    bound = claims.get("kubernetes.io") if isinstance(claims.get("kubernetes.io"), dict) else {}
    assert isinstance(bound, dict)
    pod = bound.get("pod") if isinstance(bound.get("pod"), dict) else {}
    assert isinstance(pod, dict)
    if pod.get("name"):
        who = f"{bound.get('namespace')}/{pod['name']}"
    else:
        who = str(claims.get("sub") or "anonymous")
    product = (user_agent or "").split("/", 1)[0].split(" ", 1)[0] or "unknown"
    return f"{who} {product}"


# --- what happened ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request and what the client got. Times are the proxy's monotonic clock."""

    at: float  # the request's head arrived
    answered: float  # the answer's head went out (or the connection was closed)
    client: str
    method: str
    target: str  # path and query, as requested
    watch: bool
    fault: Fault
    status: int  # what the client got; 0: the connection was closed instead
    # What the API server answered, when the request was forwarded (None: it was not, or no answer).
    upstream_status: int | None
    retry_after: int | None = None

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def key(self) -> tuple[str, str, str]:
        """The same request, sent again: client, method and target."""
        return self.client, self.method, self.target


@dataclass(frozen=True)
class Breach:
    """A client sent a request again sooner than the Retry-After it was answered with."""

    refused: Exchange
    again: Exchange

    @property
    def gap(self) -> float:
        return self.again.at - self.refused.answered

    def __str__(self) -> str:
        return (
            f"{self.refused.client}: {self.refused.method} {self.refused.target} sent again "
            f"{self.gap:.3f} s after a 429 with Retry-After {self.refused.retry_after} s"
        )


@dataclass(frozen=True)
class Rate:
    """Requests per second over a window: the mean, and the most requests in any `span` seconds."""

    requests: int
    seconds: float
    peak: int
    span: float = 1.0

    @property
    def mean(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        peak = f"{self.peak}/s" if self.span == 1.0 else f"{self.peak} in {self.span:g} s"
        return f"{self.mean:.1f} req/s (peak {peak}, {self.requests} in {self.seconds:.0f} s)"


def busiest_window(times: Sequence[float], span: float = 1.0) -> tuple[int, int]:
    """[first, last] indexes of the most of the sorted `times` inside one window [t, t + span)."""
    best = (0, -1)
    start = 0
    for end, at in enumerate(times):
        while at - times[start] >= span:
            start += 1
        if end - start > best[1] - best[0]:
            best = (start, end)
    return best


def peak_in(times: Sequence[float], span: float = 1.0) -> int:
    """The most of the sorted `times` inside any window [t, t + span)."""
    first, last = busiest_window(times, span)
    return last - first + 1


@dataclass(frozen=True)
class Traffic:
    """The exchanges of a window, counted."""

    exchanges: Sequence[Exchange]

    def between(self, start: float, end: float) -> Traffic:
        return Traffic([e for e in self.exchanges if start <= e.at < end])

    def faults(self) -> Counter[Fault]:
        return Counter(e.fault for e in self.exchanges)

    def clients(self) -> set[str]:
        return {e.client for e in self.exchanges}

    def rate(
        self,
        client: str | None = None,
        start: float | None = None,
        end: float | None = None,
        span: float = 1.0,
    ) -> Rate:
        """Requests per second (of one client, or all) from `start` to `end` (the first and last
        request when None); the peak is the most requests in any window `span` seconds long."""
        chosen = sorted(e.at for e in self.exchanges if client is None or e.client == client)
        if not chosen:
            return Rate(0, 0.0, 0, span)
        first = chosen[0] if start is None else start
        last = chosen[-1] if end is None else end
        return Rate(len(chosen), max(last - first, 1.0), peak_in(chosen, span), span)

    def products(self) -> set[str]:
        """The kinds of client (their user agents' product: shardops-worker, kopf, ...)."""
        return {client.rsplit(" ", 1)[-1] for client in self.clients()}

    def busiest_client(self, product: str | None = None, span: float = 1.0) -> tuple[str, Rate]:
        """The client (of one product, or any) with the highest peak over `span` seconds (ties: the
        most requests)."""
        chosen = [c for c in self.clients() if product is None or c.rsplit(" ", 1)[-1] == product]
        rates = {client: self.rate(client, span=span) for client in chosen}
        if not rates:
            return "", Rate(0, 0.0, 0, span)
        client = max(rates, key=lambda c: (rates[c].peak, rates[c].requests))
        return client, rates[client]

    def busiest_span(self, client: str, span: float = 1.0) -> list[Exchange]:
        """The exchanges of `client`'s busiest `span` seconds (what made its peak)."""
        chosen = sorted((e for e in self.exchanges if e.client == client), key=lambda e: e.at)
        first, last = busiest_window([e.at for e in chosen], span)
        return chosen[first : last + 1]

    def throttled(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.fault == Fault.THROTTLED]

    def retry_after_breaches(self) -> list[Breach]:
        """Each 429 whose client sent the same request (method and target) again before its
        Retry-After ran out, counted from when the 429 was answered."""
        later: dict[tuple[str, str, str], list[Exchange]] = defaultdict(list)
        for exchange in sorted(self.exchanges, key=lambda e: e.at):
            later[exchange.key].append(exchange)
        breaches = []
        for refused in self.throttled():
            again = next((e for e in later[refused.key] if e.at > refused.at), None)
            if again is not None and again.at - refused.answered < (refused.retry_after or 0):
                breaches.append(Breach(refused, again))
        return breaches

    def retry_gaps(self) -> list[float]:
        """For each 429 the client sent again: seconds from the 429 to the same request again."""
        later: dict[tuple[str, str, str], list[Exchange]] = defaultdict(list)
        for exchange in sorted(self.exchanges, key=lambda e: e.at):
            later[exchange.key].append(exchange)
        gaps = []
        for refused in self.throttled():
            again = next((e for e in later[refused.key] if e.at > refused.at), None)
            if again is not None:
                gaps.append(again.at - refused.answered)
        return gaps

    def dropped_applied(self) -> int:
        """Dropped answers of writes the API server applied (2xx upstream)."""
        return sum(1 for e in self.exchanges if e.fault.dropped and 200 <= (e.upstream_status or 0) < 300)


# --- HTTP/1.1 on asyncio streams -----------------------------------------------------------------


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return header(self.headers, name)

    @property
    def watch(self) -> bool:
        values = parse_qs(urlsplit(self.target).query).get("watch") or []
        return any(v.lower() in ("true", "1") for v in values)

    @property
    def mutating(self) -> bool:
        return self.method in MUTATING

    @property
    def wants_close(self) -> bool:
        connection = (self.header("connection") or "").lower()
        return "close" in connection or (self.version == "HTTP/1.0" and "keep-alive" not in connection)


def header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    return next((value for key, value in headers if key.lower() == wanted), None)


def parse_head(raw: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The first line and the headers of a request's or response's head."""
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The head up to its blank line; None when the peer closed before sending one."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise ConnectionError("connection closed inside a head") from error
        return None
    except asyncio.LimitOverrunError as error:
        raise ConnectionError("head too long") from error


async def read_chunked(reader: asyncio.StreamReader, sink: Callable[[bytes], Awaitable[None]]) -> None:
    """A chunked body, each chunk handed to `sink` with its framing as it came (size line, data,
    CRLF; the last chunk with its trailers), as soon as it is read."""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            trailers = b""
            while True:
                line = await reader.readuntil(b"\r\n")
                trailers += line
                if line == b"\r\n":
                    break
            await sink(size_line + trailers)
            return
        await sink(size_line + await reader.readexactly(size + 2))


def dechunk(framed: bytes) -> bytes:
    """The data of a chunked body (its framing as `read_chunked` hands it out)."""
    data = b""
    rest = framed
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        data += rest[:size]
        rest = rest[size + 2 :]
    return data


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    head = await read_head(reader)
    if head is None:
        return None
    first, headers = parse_head(head)
    method, target, version = first.split(" ", 2)
    if (header(headers, "expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = b""
    if "chunked" in (header(headers, "transfer-encoding") or "").lower():
        parts: list[bytes] = []

        async def keep(part: bytes) -> None:
            parts.append(part)

        await read_chunked(reader, keep)
        body = dechunk(b"".join(parts))
    elif header(headers, "content-length"):
        body = await reader.readexactly(int(header(headers, "content-length") or 0))
    return Request(method, target, version, headers, body)


def request_bytes(request: Request) -> bytes:
    """The request as the proxy sends it upstream: its own headers (hop-by-hop ones dropped), the
    body with its length."""
    lines = [f"{request.method} {request.target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in request.headers if k.lower() not in HOP_BY_HOP]
    if request.body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(request.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body


def status_answer(code: int, message: str, retry_after: int | None = None) -> bytes:
    """A Status answer as the API server words its own (kind Status, reason, code)."""
    phrase, reason = REASONS[code]
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if retry_after is not None:
        status["details"] = {"retryAfterSeconds": retry_after}
    body = json.dumps(status).encode()
    head = [
        f"HTTP/1.1 {code} {phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-cache, private",
    ]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class _Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    last_used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Closed(Exception):
    """The client's connection is to be closed (after a dropped answer, or by its own request)."""


# --- the proxy ----------------------------------------------------------------------------------


class ApiProxy:
    """The proxy, served from its own thread and event loop between `start` and `stop`."""

    def __init__(
        self,
        upstream: str,
        ca_cert: Path,
        serving_cert: Path,
        serving_key: Path,
        *,
        seed: int,
        rates: FaultRates = NO_FAULTS,
        port: int = 0,
    ) -> None:
        parsed = urlsplit(upstream)
        if parsed.scheme != "https" or not parsed.hostname:
            raise ValueError(f"upstream must be an https URL: {upstream}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 443
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(str(serving_cert), str(serving_key))
        self._server_tls.set_alpn_protocols(["http/1.1"])
        self._client_tls = ssl.create_default_context(cafile=str(ca_cert))
        self._client_tls.set_alpn_protocols(["http/1.1"])
        self._rng = random.Random(seed)
        self._rates = rates
        self._port = port
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []
        self.upstream_failures = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # -- control, from any thread --

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._port}"

    @property
    def rates(self) -> FaultRates:
        return self._rates

    def set_rates(self, rates: FaultRates) -> None:
        """The rates of the requests that arrive from now on."""
        self._rates = rates

    def traffic(self) -> Traffic:
        with self._lock:
            return Traffic(list(self._exchanges))

    def start(self) -> ApiProxy:
        self._thread = threading.Thread(target=self._run, name="api-fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the API proxy did not start")
        if self._failure is not None:
            raise RuntimeError(f"the API proxy did not start: {self._failure!r}")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=15)
        thread.join(timeout=15)

    def __enter__(self) -> ApiProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the loop's thread --

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(
                    self._accept, "127.0.0.1", self._port, ssl=self._server_tls, limit=HEAD_LIMIT
                )
            )
            self._port = self._server.sockets[0].getsockname()[1]
        except BaseException as error:
            self._failure = error
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        assert self._server is not None and self._loop is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._loop.call_soon(self._loop.stop)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: _Upstream | None = None
        try:
            while True:
                request = await read_request(reader, writer)
                if request is None:
                    return
                upstream = await self._exchange(request, writer, upstream)
                if request.wants_close:
                    return
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
            return
        except asyncio.CancelledError:
            return
        finally:
            if upstream is not None:
                upstream.close()
            with contextlib.suppress(Exception):
                writer.close()
            self._tasks.discard(task)

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self._exchanges.append(exchange)

    async def _connect(self) -> _Upstream:
        reader, writer = await asyncio.open_connection(
            self.upstream_host,
            self.upstream_port,
            ssl=self._client_tls,
            server_hostname=self.upstream_host,
            limit=HEAD_LIMIT,
        )
        return _Upstream(reader, writer)

    async def _exchange(
        self, request: Request, writer: asyncio.StreamWriter, upstream: _Upstream | None
    ) -> _Upstream | None:
        """Answer one request; returns the upstream connection to keep for the next one (None: none)."""
        at = time.monotonic()
        rates = self._rates
        fault = choose(self._rng.random(), rates, request.mutating)
        client = client_of(request.header("authorization"), request.header("user-agent"))

        # Recorded as the answer goes out, before the client can have it.
        def record(status: int, upstream_status: int | None, retry_after: int | None = None) -> None:
            self._record(
                Exchange(
                    at,
                    time.monotonic(),
                    client,
                    request.method,
                    request.target,
                    request.watch,
                    fault,
                    status,
                    upstream_status,
                    retry_after,
                )
            )

        if (request.header("upgrade") or "") != "":
            record(501, None)
            writer.write(status_answer(501, "the fault proxy does not forward upgraded connections"))
            await writer.drain()
            return upstream
        if fault.refused:
            code = {Fault.THROTTLED: 429, Fault.ERROR_500: 500, Fault.UNAVAILABLE: 503}[fault]
            retry_after = rates.retry_after_seconds if fault == Fault.THROTTLED else None
            record(code, None, retry_after)
            writer.write(status_answer(code, f"injected by the fault proxy ({fault})", retry_after))
            await writer.drain()
            return upstream
        if fault == Fault.SPIKE:
            await asyncio.sleep(rates.spike_seconds)

        forwarded = await self._forward(request, upstream)
        if forwarded is None:
            self.upstream_failures += 1
            record(502, None)
            writer.write(status_answer(502, "the fault proxy got no answer from the API server"))
            await writer.drain()
            return None
        upstream, head = forwarded
        try:
            return await self._answer(request, fault, head, upstream, writer, record)
        except BaseException:
            upstream.close()
            raise

    async def _answer(
        self,
        request: Request,
        fault: Fault,
        head: bytes,
        upstream: _Upstream,
        writer: asyncio.StreamWriter,
        record: Callable[[int, int | None], None],
    ) -> _Upstream | None:
        """Relay the API server's answer whose head is `head` (or, for a dropped one, read it and
        answer otherwise); returns the upstream connection if it may carry the next request."""
        first, headers = parse_head(head)
        status = int(first.split(" ", 2)[1])
        if fault.dropped:
            keep = await self._body(request, status, headers, upstream, None)
            if fault == Fault.DROPPED_CLOSE:
                record(0, status)
                raise _Closed
            record(504, status)
            writer.write(status_answer(504, "injected by the fault proxy: the API server's answer was lost"))
            await writer.drain()
        else:
            record(status, status)
            writer.write(head)
            await writer.drain()

            async def relay(data: bytes) -> None:
                writer.write(data)
                await writer.drain()

            keep = await self._body(request, status, headers, upstream, relay)
            framed = header(headers, "content-length") is not None or "chunked" in (
                header(headers, "transfer-encoding") or ""
            )
            if not framed:
                # An answer that ended with the connection: the client's ends with it too.
                raise _Closed
        if not keep:
            upstream.close()
            return None
        upstream.last_used = time.monotonic()
        return upstream

    async def _forward(self, request: Request, upstream: _Upstream | None) -> tuple[_Upstream, bytes] | None:
        """Send the request to the API server (on the kept connection, or a new one) and read the
        head of its answer; None when no answer came (the connection is closed then)."""
        if upstream is not None and time.monotonic() - upstream.last_used > UPSTREAM_IDLE_SECONDS:
            upstream.close()
            upstream = None
        fresh = upstream is None
        try:
            if upstream is None:
                upstream = await self._connect()
            upstream.writer.write(request_bytes(request))
            await upstream.writer.drain()
            head = await read_head(upstream.reader)
            if head is None and not fresh and not request.mutating:
                # A kept connection the API server had closed: a read goes again on a new one.
                upstream.close()
                upstream = await self._connect()
                upstream.writer.write(request_bytes(request))
                await upstream.writer.drain()
                head = await read_head(upstream.reader)
            while (
                head is not None and head.startswith(b"HTTP/1.1 1") and not head.startswith(b"HTTP/1.1 101")
            ):
                head = await read_head(upstream.reader)  # an interim answer
        except (OSError, ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
            head = None
        if head is None or upstream is None:
            if upstream is not None:
                upstream.close()
            return None
        return upstream, head

    @staticmethod
    async def _body(
        request: Request,
        status: int,
        headers: list[tuple[str, str]],
        upstream: _Upstream,
        sink: Callable[[bytes], Awaitable[None]] | None,
    ) -> bool:
        """Read the answer's body from the API server, handing each piece to `sink` as it comes
        (None: read and discard). True when the upstream connection may carry another request."""

        async def discard(_: bytes) -> None:
            return None

        out = sink or discard
        reader = upstream.reader
        reusable = "close" not in (header(headers, "connection") or "").lower()
        if request.method == "HEAD" or status in (204, 304):
            return reusable
        if "chunked" in (header(headers, "transfer-encoding") or "").lower():
            await read_chunked(reader, out)
            return reusable
        length = header(headers, "content-length")
        if length is not None:
            remaining = int(length)
            while remaining:
                data = await reader.read(min(remaining, READ_SIZE))
                if not data:
                    raise ConnectionError("the API server closed inside an answer")
                remaining -= len(data)
                await out(data)
            return reusable
        while data := await reader.read(READ_SIZE):
            await out(data)
        return False


def summary(traffic: Traffic, rates: FaultRates | None = None) -> dict[str, Any]:
    """The figures a scenario prints: requests, faults by kind, rates, the busiest client, Retry-After."""
    client, busiest = traffic.busiest_client()
    gaps = traffic.retry_gaps()
    faults = traffic.faults()
    return {
        "requests": len(traffic.exchanges),
        "writes": sum(1 for e in traffic.exchanges if e.method in MUTATING),
        "watches": sum(1 for e in traffic.exchanges if e.watch),
        "rate": str(traffic.rate()),
        "busiest client": f"{client}: {busiest}",
        "faults": {str(k): v for k, v in sorted(faults.items()) if k != Fault.NONE},
        "dropped answers of applied writes": traffic.dropped_applied(),
        "429 sent again": f"{len(gaps)} (soonest {min(gaps):.2f} s)" if gaps else "0",
        "Retry-After breaches": len(traffic.retry_after_breaches()),
        **({"rates": rates.describe()} if rates else {}),
    }


def by_client(traffic: Traffic, span: float = 1.0) -> Mapping[str, Rate]:
    return {client: traffic.rate(client, span=span) for client in sorted(traffic.clients())}
