"""The API fault proxy (testbed/faults/proxy.py) against a tiny local HTTPS backend standing in for
kube-apiserver: each fault happens at its rate for a seed, refusals are not forwarded, a dropped
answer's write really reached the backend, 429 carries Retry-After, watches stream through chunk by
chunk, identity headers pass as they came, and the counts (rates, clients, Retry-After) are right.

The backend and the proxy serve certificates of one throwaway cluster PKI (testbed/cluster/pki.py), so
the client verifies the proxy with the cluster CA, as a pod's kubeconfig does."""

from __future__ import annotations

import base64
import http.client
import json
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from testbed.cluster import pki as pki_mod
from testbed.faults.proxy import (
    NO_FAULTS,
    ApiProxy,
    Exchange,
    Fault,
    FaultRates,
    Rate,
    Traffic,
    choose,
    client_of,
)

WATCH_PATH = "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=1"
# How long a client waits for an answer before the test fails (a hang is a failure, not a wait).
CLIENT_TIMEOUT = 10.0


# --- the backend --------------------------------------------------------------------------------


@dataclass
class Backend:
    """What the stand-in API server received, and the gate that releases a watch's second event."""

    received: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    release_watch: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def writes(self) -> int:
        with self.lock:
            return sum(1 for method, *_ in self.received if method != "GET")


def handler_for(backend: Backend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Head and body go out in separate writes: without this, each answer waits for a delayed ACK.
        disable_nagle_algorithm = True

        def log_message(self, *_: Any) -> None:
            return None

        def _record(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with backend.lock:
                backend.received.append((self.command, self.path, dict(self.headers.items()), body))
            return body

        def _json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            self._record()
            if "watch=true" in self.path:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                self._chunk(b'{"type":"ADDED","object":{"n":1}}\n')
                # The second event only once the client has the first: a proxy that buffered the
                # stream would leave the client waiting for its first event until its timeout.
                if backend.release_watch.wait(CLIENT_TIMEOUT):
                    self._chunk(b'{"type":"MODIFIED","object":{"n":2}}\n')
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            self._json(200, {"kind": "ConfigMap", "path": self.path})

        def _write(self) -> None:
            body = self._record()
            self._json(200, {"applied": self.command, "body": body.decode()})

        do_POST = do_PUT = do_PATCH = do_DELETE = _write

    return Handler


@dataclass
class Setup:
    pki: pki_mod.Pki
    backend: Backend
    backend_url: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    pki = pki_mod.generate(tmp_path_factory.mktemp("pki"))
    backend = Backend()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(backend))
    server.daemon_threads = True
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Setup(pki, backend, f"https://127.0.0.1:{server.server_address[1]}")
    backend.release_watch.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def backend(setup: Setup) -> Backend:
    with setup.backend.lock:
        setup.backend.received.clear()
    setup.backend.release_watch.clear()
    return setup.backend


def proxy_for(setup: Setup, rates: FaultRates = NO_FAULTS, seed: int = 7) -> ApiProxy:
    return ApiProxy(
        setup.backend_url,
        setup.pki.ca_cert,
        setup.pki.proxy_cert,
        setup.pki.proxy_key,
        seed=seed,
        rates=rates,
    )


# --- a client ------------------------------------------------------------------------------------


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


TOKEN = jwt(
    {
        "sub": "system:serviceaccount:ns:shardops-worker",
        "kubernetes.io": {"namespace": "ns", "pod": {"name": "worker-1", "uid": "u"}},
    }
)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Client:
    """Sequential requests over one kept connection, verified with the cluster CA; a new
    connection after the proxy closed one."""

    def __init__(self, setup: Setup, port: int, agent: str = "shardops-worker/0.1.0 (worker-1-abc)") -> None:
        self.tls = ssl.create_default_context(cafile=str(setup.pki.ca_cert))
        self.port = port
        self.agent = agent
        self.connection: http.client.HTTPSConnection | None = None

    def _connection(self) -> http.client.HTTPSConnection:
        if self.connection is None:
            self.connection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.tls, timeout=CLIENT_TIMEOUT
            )
        return self.connection

    def call(self, method: str, path: str, body: bytes | None = None) -> Answer | None:
        """The answer, or None when the proxy closed the connection instead."""
        connection = self._connection()
        headers = {"Authorization": f"Bearer {TOKEN}", "User-Agent": self.agent}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return Answer(response.status, dict(response.getheaders()), response.read())
        except (http.client.RemoteDisconnected, ConnectionResetError):
            connection.close()
            self.connection = None
            return None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


# --- choosing faults (pure) ----------------------------------------------------------------------


def test_each_fault_owns_a_slice_as_wide_as_its_rate() -> None:
    rates = FaultRates(throttled=0.1, error_500=0.05, unavailable=0.05, spike=0.1, dropped=0.2)
    rng = random.Random(1)
    draws = 200_000
    writes = Counter(choose(rng.random(), rates, mutating=True) for _ in range(draws))
    reads = Counter(choose(rng.random(), rates, mutating=False) for _ in range(draws))
    expected = {
        Fault.THROTTLED: 0.1,
        Fault.ERROR_500: 0.05,
        Fault.UNAVAILABLE: 0.05,
        Fault.SPIKE: 0.1,
        Fault.DROPPED_CLOSE: 0.1,
        Fault.DROPPED_504: 0.1,
        Fault.NONE: 0.5,
    }
    for fault, share in expected.items():
        assert writes[fault] / draws == pytest.approx(share, abs=0.005), (fault, writes)
    # A read drawn for a drop passes untouched: no read is ever dropped.
    assert not (reads[Fault.DROPPED_CLOSE] or reads[Fault.DROPPED_504])
    assert reads[Fault.NONE] / draws == pytest.approx(0.7, abs=0.005)
    assert reads[Fault.THROTTLED] / draws == pytest.approx(0.1, abs=0.005)


def test_choose_at_the_edges() -> None:
    rates = FaultRates(throttled=0.25, dropped=0.5, dropped_close_share=0.5)
    assert choose(0.0, rates, mutating=False) == Fault.THROTTLED
    assert choose(0.2499, rates, mutating=True) == Fault.THROTTLED
    assert choose(0.25, rates, mutating=True) == Fault.DROPPED_CLOSE
    assert choose(0.5, rates, mutating=True) == Fault.DROPPED_504
    assert choose(0.75, rates, mutating=True) == Fault.NONE
    assert choose(0.5, NO_FAULTS, mutating=True) == Fault.NONE


@pytest.mark.parametrize(
    "rates",
    [
        {"throttled": 0.6, "error_500": 0.6},
        {"spike": -0.1},
        {"dropped": 1.5},
        {"dropped_close_share": 2.0},
        {"spike_seconds": -1.0},
    ],
)
def test_rates_out_of_range_are_refused(rates: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FaultRates(**rates)  # type: ignore[arg-type]


def test_client_identity_from_the_bound_token_and_the_user_agent() -> None:
    worker = client_of(f"Bearer {TOKEN}", "shardops-worker/0.1.0 (worker-1-abc)")
    assert worker == "ns/worker-1 shardops-worker"
    unbound = jwt({"sub": "system:serviceaccount:ns:default"})
    assert client_of(f"Bearer {unbound}", "kopf/1.45") == "system:serviceaccount:ns:default kopf"
    assert client_of(None, None) == "anonymous unknown"
    assert client_of("Bearer not-a-jwt", "curl/8") == "anonymous curl"
    assert client_of("Basic dXNlcjpwdw==", "") == "anonymous unknown"


# --- the proxy ------------------------------------------------------------------------------------


def test_faults_happen_at_their_rates_for_a_seed_and_only_forwarded_requests_reach_the_server(
    setup: Setup, backend: Backend
) -> None:
    rates = FaultRates(
        throttled=0.1, error_500=0.1, unavailable=0.1, spike=0.1, dropped=0.2, spike_seconds=0.0
    )
    seed, count = 13, 300
    methods = ["GET" if i % 2 else "PATCH" for i in range(count)]
    with proxy_for(setup, rates, seed) as proxy:
        client = Client(setup, proxy.port)
        answers = [
            client.call(
                method, f"/api/v1/namespaces/ns/configmaps/c{i}", b"{}" if method == "PATCH" else None
            )
            for i, method in enumerate(methods)
        ]
        client.close()
        exchanges = sorted(proxy.traffic().exchanges, key=lambda e: e.at)
    # The same seed draws the same faults, request by request.
    replay = random.Random(seed)
    expected = [choose(replay.random(), rates, method == "PATCH") for method in methods]
    assert [e.fault for e in exchanges] == expected
    counts = Counter(expected)
    # Each kind near its rate: within four standard deviations of n·p.
    for fault, n, p in [
        (Fault.THROTTLED, count, 0.1),
        (Fault.ERROR_500, count, 0.1),
        (Fault.UNAVAILABLE, count, 0.1),
        (Fault.SPIKE, count, 0.1),
        (Fault.DROPPED_504, count // 2, 0.1),
        (Fault.DROPPED_CLOSE, count // 2, 0.1),
    ]:
        assert abs(counts[fault] - n * p) <= 4 * (n * p * (1 - p)) ** 0.5, (fault, counts)
    # What each client got is what was recorded.
    statuses = {Fault.THROTTLED: 429, Fault.ERROR_500: 500, Fault.UNAVAILABLE: 503, Fault.DROPPED_504: 504}
    for answer, exchange in zip(answers, exchanges, strict=True):
        if exchange.fault == Fault.DROPPED_CLOSE:
            assert answer is None and exchange.status == 0
            continue
        assert answer is not None
        assert answer.status == exchange.status == statuses.get(exchange.fault, 200)
    # Refusals never reached the server; everything else did, drops included.
    forwarded = [e for e in exchanges if not e.fault.refused]
    assert len(backend.received) == len(forwarded)
    assert backend.writes() == sum(1 for e in forwarded if e.method == "PATCH")
    assert all(e.upstream_status == 200 for e in forwarded)


def test_a_429_carries_retry_after_and_a_status_and_is_not_forwarded(setup: Setup, backend: Backend) -> None:
    rates = FaultRates(throttled=1.0, retry_after_seconds=3)
    with proxy_for(setup, rates) as proxy:
        client = Client(setup, proxy.port)
        answer = client.call("PATCH", "/api/v1/namespaces/ns/configmaps/c", b"{}")
        client.close()
        (exchange,) = proxy.traffic().exchanges
    assert answer is not None and answer.status == 429
    assert answer.headers["Retry-After"] == "3"
    status = json.loads(answer.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "TooManyRequests", 429)
    assert status["details"] == {"retryAfterSeconds": 3}
    assert exchange.retry_after == 3 and exchange.upstream_status is None
    assert backend.received == []


@pytest.mark.parametrize(("fault", "status"), [("error_500", 500), ("unavailable", 503)])
def test_server_errors_are_answered_without_forwarding(
    setup: Setup, backend: Backend, fault: str, status: int
) -> None:
    with proxy_for(setup, FaultRates(**{fault: 1.0})) as proxy:  # type: ignore[arg-type]
        client = Client(setup, proxy.port)
        answer = client.call("POST", "/api/v1/namespaces/ns/configmaps", b"{}")
        client.close()
    assert answer is not None and answer.status == status
    assert "Retry-After" not in answer.headers
    assert backend.received == []


@pytest.mark.parametrize(("share", "fault"), [(0.0, Fault.DROPPED_504), (1.0, Fault.DROPPED_CLOSE)])
def test_a_dropped_answer_comes_after_the_server_applied_the_write(
    setup: Setup, backend: Backend, share: float, fault: Fault
) -> None:
    rates = FaultRates(dropped=1.0, dropped_close_share=share)
    with proxy_for(setup, rates) as proxy:
        client = Client(setup, proxy.port)
        answer = client.call("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", b'{"spec":{}}')
        # A read is never dropped, and the client goes on (a new connection after a close).
        read = client.call("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l")
        client.close()
        first, second = sorted(proxy.traffic().exchanges, key=lambda e: e.at)
    assert [(m, p, b) for m, p, _, b in backend.received] == [
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", b'{"spec":{}}'),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", b""),
    ]
    assert (first.fault, first.upstream_status) == (fault, 200)
    if fault == Fault.DROPPED_CLOSE:
        assert answer is None and first.status == 0
    else:
        assert answer is not None and answer.status == 504
        assert json.loads(answer.body)["reason"] == "Timeout"
    assert read is not None and read.status == 200 and second.fault == Fault.NONE
    assert proxy.traffic().dropped_applied() == 1


def test_a_spike_delays_the_answer(setup: Setup, backend: Backend) -> None:
    with proxy_for(setup, FaultRates(spike=1.0, spike_seconds=0.3)) as proxy:
        client = Client(setup, proxy.port)
        started = time.monotonic()
        answer = client.call("GET", "/api/v1/namespaces/ns/configmaps/c")
        took = time.monotonic() - started
        client.close()
    assert answer is not None and answer.status == 200
    assert took >= 0.3
    assert len(backend.received) == 1


def test_a_watch_streams_through_event_by_event_and_identity_passes_unchanged(
    setup: Setup, backend: Backend
) -> None:
    # Drops apply to writes only: even at rate 1 the watch (a read) is not touched.
    with proxy_for(setup, FaultRates(dropped=1.0)) as proxy:
        connection = http.client.HTTPSConnection(
            "127.0.0.1",
            proxy.port,
            context=ssl.create_default_context(cafile=str(setup.pki.ca_cert)),
            timeout=CLIENT_TIMEOUT,
        )
        connection.request(
            "GET", WATCH_PATH, headers={"Authorization": f"Bearer {TOKEN}", "User-Agent": "k/1"}
        )
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Transfer-Encoding") == "chunked"
        # The first event arrives while the backend still holds the second back: streamed, not
        # buffered (a buffering proxy would time this read out).
        assert json.loads(response.readline()) == {"type": "ADDED", "object": {"n": 1}}
        backend.release_watch.set()
        assert json.loads(response.readline()) == {"type": "MODIFIED", "object": {"n": 2}}
        assert response.read() == b""
        # The connection is kept: another request on it.
        connection.request("GET", "/api/v1/namespaces/ns/configmaps/c", headers={"User-Agent": "k/1"})
        assert connection.getresponse().read()
        connection.close()
        exchanges = proxy.traffic().exchanges
    assert [e.watch for e in exchanges] == [True, False]
    assert all(e.fault == Fault.NONE for e in exchanges)
    (_, path, headers, _), _ = backend.received
    assert path == WATCH_PATH
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["User-Agent"] == "k/1"
    assert exchanges[0].client == "ns/worker-1 k"


def test_a_watch_may_be_refused_at_its_start(setup: Setup, backend: Backend) -> None:
    with proxy_for(setup, FaultRates(unavailable=1.0)) as proxy:
        client = Client(setup, proxy.port)
        answer = client.call("GET", WATCH_PATH)
        client.close()
    assert answer is not None and answer.status == 503
    assert backend.received == []


def test_rates_change_for_the_requests_that_follow(setup: Setup, backend: Backend) -> None:
    with proxy_for(setup) as proxy:
        client = Client(setup, proxy.port)
        before = client.call("GET", "/api/v1/namespaces/ns/configmaps/c")
        proxy.set_rates(FaultRates(throttled=1.0))
        after = client.call("GET", "/api/v1/namespaces/ns/configmaps/c")
        client.close()
    assert before is not None and before.status == 200
    assert after is not None and after.status == 429


# --- counting (pure) --------------------------------------------------------------------------------


def exchange(
    at: float,
    client: str = "a",
    target: str = "/x",
    fault: Fault = Fault.NONE,
    retry_after: int | None = None,
    answered: float | None = None,
) -> Exchange:
    status = 429 if fault == Fault.THROTTLED else 200
    return Exchange(
        at,
        at if answered is None else answered,
        client,
        "GET",
        target,
        False,
        fault,
        status,
        None,
        retry_after,
    )


def test_rates_per_second_in_all_and_per_client() -> None:
    a = [exchange(at, "a") for at in (0.1, 0.2, 0.5, 1.5)]
    b = [exchange(at, "b") for at in (0.9, 3.2, 3.9)]
    traffic = Traffic([*a, *b])
    everything = traffic.rate()
    # 0.1, 0.2, 0.5 and 0.9 fall inside one second: the peak is over any window, not aligned ones.
    assert (everything.requests, everything.peak) == (7, 4)
    assert everything.mean == pytest.approx(7 / 3.8)
    assert (traffic.rate("a").requests, traffic.rate("a").peak) == (4, 3)
    assert (traffic.rate("b").requests, traffic.rate("b").peak) == (3, 2)
    assert traffic.busiest_client() == ("a", traffic.rate("a"))
    assert [e.at for e in traffic.busiest_span("a")] == [0.1, 0.2, 0.5]
    assert [e.at for e in traffic.busiest_span("b")] == [3.2, 3.9]
    kinds = Traffic(
        [exchange(0.0, "ns/p1 kopf"), exchange(0.1, "ns/p1 kopf"), exchange(0.2, "ns/p2 shardops-worker")]
    )
    assert kinds.products() == {"kopf", "shardops-worker"}
    assert kinds.busiest_client("shardops-worker") == (
        "ns/p2 shardops-worker",
        kinds.rate("ns/p2 shardops-worker"),
    )
    assert kinds.busiest_client("curl") == ("", Rate(0, 0.0, 0))
    # Over a longer span the peak counts more: a's requests at 0.1 .. 1.5 all fall inside 2 s.
    assert traffic.rate("a", span=2.0).peak == 4 and str(traffic.rate("a", span=2.0)).count("peak 4 in 2 s")
    assert traffic.busiest_client(span=2.0) == ("a", traffic.rate("a", span=2.0))
    assert [e.at for e in traffic.busiest_span("b", 2.0)] == [3.2, 3.9]
    window = traffic.between(1.0, 4.0)
    assert len(window.exchanges) == 3 and window.rate(start=1.0, end=4.0).peak == 2
    assert window.rate(start=1.0, end=4.0).mean == pytest.approx(1.0)
    assert traffic.faults() == Counter({Fault.NONE: 7})


def test_retry_after_breaches_are_counted_per_client_and_request() -> None:
    traffic = Traffic(
        [
            exchange(0.0, "a", "/x", Fault.THROTTLED, retry_after=1, answered=0.01),
            # Another client, and another request of the same client: not a repeat.
            exchange(0.2, "b", "/x"),
            exchange(0.3, "a", "/y"),
            # The same request 1.2 s after: honoured.
            exchange(1.21, "a", "/x"),
            exchange(2.0, "b", "/z", Fault.THROTTLED, retry_after=2, answered=2.0),
            # Sent again after 0.5 s of a 2 s Retry-After: a breach.
            exchange(2.5, "b", "/z"),
        ]
    )
    (breach,) = traffic.retry_after_breaches()
    assert (breach.refused.client, breach.again.at) == ("b", 2.5)
    assert breach.gap == pytest.approx(0.5)
    assert "Retry-After 2 s" in str(breach)
    assert traffic.retry_gaps() == pytest.approx([1.2, 0.5])


def test_counts_of_a_real_run(setup: Setup, backend: Backend) -> None:
    """The counts of what went through the proxy: requests per client, faults by kind."""
    with proxy_for(setup, FaultRates(throttled=1.0)) as proxy:
        worker = Client(setup, proxy.port)
        operator = Client(setup, proxy.port, agent="shardops-operator/0.1.0 (op)")
        for _ in range(3):
            worker.call("GET", "/api/v1/namespaces/ns/configmaps/c")
        operator.call("GET", "/api/v1/namespaces/ns/configmaps/c")
        worker.close()
        operator.close()
        traffic = proxy.traffic()
    assert traffic.faults() == Counter({Fault.THROTTLED: 4})
    assert traffic.rate("ns/worker-1 shardops-worker").requests == 3
    assert traffic.rate("ns/worker-1 shardops-operator").requests == 1
    # Sent again at once after a 1 s Retry-After: each repeat is a breach.
    assert len(traffic.retry_after_breaches()) == 2


def test_pki_has_a_proxy_certificate_for_loopback(setup: Setup) -> None:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(setup.pki.proxy_cert.read_bytes())
    ca = x509.load_pem_x509_certificate(setup.pki.ca_cert.read_bytes())
    assert cert.issuer == ca.subject
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def test_the_upstream_must_be_https(setup: Setup) -> None:
    with pytest.raises(ValueError, match="https"):
        ApiProxy("http://127.0.0.1:1", setup.pki.ca_cert, setup.pki.proxy_cert, setup.pki.proxy_key, seed=1)


def test_paths_of_exchanges() -> None:
    e = exchange(0.0, target="/api/v1/pods?watch=true")
    assert e.path == "/api/v1/pods"
