"""HTTPS_PROXY / HTTP_PROXY and NO_PROXY are honoured by shardops' own HTTP clients: the S3 wire client
(store.s3wire) and the LLM client (llm.upstream). A loopback HTTP proxy here answers in the server's
place and records the absolute URL each request named, which only a request sent through a proxy
carries."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from shardops.llm.upstream import Upstream
from shardops.proxies import proxy_for
from shardops.store.s3wire import Credentials, WireS3

COMPLETION = {
    "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


class _Proxy(BaseHTTPRequestHandler):
    seen: list[str] = []

    def _answer(self) -> None:
        type(self).seen.append(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps(COMPLETION).encode() if self.path.endswith("/chat/completions") else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[str]:
    _Proxy.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_proxy_for_reads_the_scheme_and_skips_no_proxy_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert proxy_for("https://s3.example.com/b") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", ".svc.cluster.local,10.0.0.5")
    assert proxy_for("https://s3.example.com/b") == "http://proxy.corp:3128"
    assert proxy_for("http://s3.example.com/b") is None, "HTTPS_PROXY is for https URLs"
    assert proxy_for("http://seaweedfs.storage.svc.cluster.local:8333/b") is None
    assert proxy_for("https://10.0.0.5:9000/b") is None
    monkeypatch.setenv("http_proxy", "http://p:8080")
    assert proxy_for("http://s3.example.com/b") == "http://p:8080"
    monkeypatch.setenv("NO_PROXY", "*")
    assert proxy_for("https://s3.example.com/b") is None


def test_the_s3_client_goes_through_the_proxy(monkeypatch: pytest.MonkeyPatch, proxy: str) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    client = WireS3("http://s3.example.internal:9000", "us-east-1", Credentials("a", "b"))
    assert isinstance(client._pool, urllib3.ProxyManager)
    client.put_object(Bucket="results", Key="a/b.json", Body=b"{}")
    assert _Proxy.seen == ["http://s3.example.internal:9000/results/a/b.json"]


def test_the_s3_client_goes_direct_to_a_no_proxy_endpoint(
    monkeypatch: pytest.MonkeyPatch, proxy: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("NO_PROXY", "example.internal")
    client = WireS3("http://s3.example.internal:9000", "us-east-1", Credentials("a", "b"))
    assert not isinstance(client._pool, urllib3.ProxyManager)


def test_the_llm_client_goes_through_the_proxy(monkeypatch: pytest.MonkeyPatch, proxy: str) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    upstream = Upstream("http://llm.example.internal/v1", None, "src", None, 5.0, "shardops-test")
    answer = upstream.complete({"model": "m", "messages": []}, dt.datetime.now(dt.UTC))
    assert answer.content == "ok"
    assert _Proxy.seen == ["http://llm.example.internal/v1/chat/completions"]
    monkeypatch.setenv("NO_PROXY", "llm.example.internal")
    direct = Upstream("http://llm.example.internal/v1", None, "src", None, 5.0, "shardops-test")
    assert not isinstance(direct.pool, urllib3.ProxyManager)
