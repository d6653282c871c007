"""The k8s layer's request building and error handling, without a network."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from shardops.api.enums import ErrorClass, ShardPhase
from shardops.api.shard import Shard, ShardError
from shardops.k8s import events, leases
from shardops.k8s.api import (
    CAMPAIGNS,
    JOBS,
    LEASES,
    MERGE_PATCH,
    PODS,
    SHARDS,
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    Kube,
    NotFound,
    RetryPolicy,
    WriteRefused,
    merge_patch_with_precondition,
    resource_path,
)
from shardops.k8s.shards import TransitionRequest, planned_status
from shardops.logic.leases import Renewals
from shardops.logic.transitions import Action, IllegalTransition

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_resource_paths() -> None:
    assert resource_path(PODS, "ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert resource_path(CAMPAIGNS, "ns") == "/apis/shardops.dev/v1alpha1/namespaces/ns/campaigns"
    assert LEASES.path("a b", "x/y") == "/apis/coordination.k8s.io/v1/namespaces/a%20b/leases/x%2Fy"


def test_precondition_is_added_without_touching_the_patch() -> None:
    patch = {"status": {"phase": "Running"}, "metadata": {"labels": {"a": "b"}}}
    guarded = merge_patch_with_precondition(patch, "42")
    assert guarded["metadata"] == {"labels": {"a": "b"}, "resourceVersion": "42"}
    assert patch["metadata"] == {"labels": {"a": "b"}}
    assert merge_patch_with_precondition(patch, None) is patch


@dataclass
class FakeResponse:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def read(self) -> bytes:
        return self.body

    def getheader(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclass
class FakeApiClient:
    """Answers call_api from a script of responses and records what was sent."""

    responses: list[FakeResponse]
    sent: list[tuple[str, str, Any]] = field(default_factory=list)
    # The headers and the timeout of each call, in the order of `sent`.
    headers: list[dict[str, str]] = field(default_factory=list)
    timeouts: list[Any] = field(default_factory=list)

    def param_serialize(
        self,
        *,
        method: str,
        resource_path: str,
        query_params: Any,
        header_params: Any,
        auth_settings: Any,
        body: Any = None,
    ) -> tuple[str, str, dict[str, str], Any, None]:
        query = "&".join(f"{k}={v}" for k, v in query_params)
        return method, f"https://x{resource_path}?{query}", dict(header_params), body, None

    def call_api(
        self, method: str, url: str, header_params: Any, body: Any = None, _request_timeout: Any = None
    ) -> FakeResponse:
        self.sent.append((method, url, body))
        self.headers.append(dict(header_params))
        self.timeouts.append(_request_timeout)
        return self.responses.pop(0)


def _status(code: int, reason: str, message: str = "m") -> FakeResponse:
    return FakeResponse(code, json.dumps({"kind": "Status", "reason": reason, "message": message}).encode())


def _kube(*responses: FakeResponse) -> tuple[Kube, FakeApiClient, list[float]]:
    fake = FakeApiClient(list(responses))
    slept: list[float] = []
    kube = Kube(fake, "tester", RetryPolicy(attempts=3, sleep=slept.append, rand=lambda: 0.0))  # type: ignore[arg-type]
    return kube, fake, slept


def test_retries_throttling_and_server_errors_then_succeeds() -> None:
    kube, fake, slept = _kube(
        FakeResponse(429, b"", {"Retry-After": "1"}),
        _status(503, "ServiceUnavailable"),
        FakeResponse(200, b'{"ok": 1}'),
    )
    assert kube.get(PODS, "ns", "p") == {"ok": 1}
    assert len(fake.sent) == 3
    assert slept == [1.0, 0.2]


def test_a_write_and_a_watch_are_sent_with_their_own_headers_and_timeouts() -> None:
    """Both go through one serialize-and-send: a write says its body's type and has the client's
    timeout; a watch has no body, asks for bookmarks from its version, and its read timeout covers
    the quiet between two events (the server ends the watch after `seconds`)."""
    kube, fake, _ = _kube(FakeResponse(200, b"{}"), _status(410, "Expired"))
    kube.patch(SHARDS, "ns", "s", {"status": {"phase": "Done"}}, resource_version="7", subresource="status")
    with pytest.raises(Gone):
        list(kube.watch(SHARDS, "ns", "41", seconds=60, labelSelector="a=b"))
    (patch_method, patch_url, patch_body), (watch_method, watch_url, watch_body) = fake.sent
    assert patch_method == "PATCH" and patch_url.endswith("/shards/s/status?fieldManager=tester")
    assert patch_body == {"status": {"phase": "Done"}, "metadata": {"resourceVersion": "7"}}
    assert fake.headers[0] == {"Accept": "application/json", "Content-Type": MERGE_PATCH}
    assert fake.timeouts[0] == kube.timeout
    assert watch_method == "GET" and watch_body is None
    assert watch_url.endswith(
        "/shards?labelSelector=a=b&watch=true&resourceVersion=41&allowWatchBookmarks=true&timeoutSeconds=60"
    )
    assert fake.headers[1] == {"Accept": "application/json"}
    assert fake.timeouts[1] == (kube.timeout, 90)


def test_gives_up_after_the_retry_budget() -> None:
    kube, fake, _ = _kube(*[_status(500, "InternalError")] * 3)
    with pytest.raises(ApiError) as error:
        kube.get(PODS, "ns", "p")
    assert error.value.status == 500 and len(fake.sent) == 3


def test_a_create_by_generate_name_is_not_repeated_after_a_server_error() -> None:
    """A 504 can follow a committed create: sent again, it would make a second object."""
    kube, fake, _ = _kube(_status(504, "Timeout"), FakeResponse(201, b"{}"))
    with pytest.raises(ApiError) as error:
        kube.create(JOBS, "ns", {"metadata": {"generateName": "w-"}, "spec": {}})
    assert error.value.status == 504 and len(fake.sent) == 1


def test_a_create_by_generate_name_is_repeated_when_throttled() -> None:
    """429: refused before the server acted, so sending it again makes nothing twice."""
    kube, fake, _ = _kube(FakeResponse(429, b"", {"Retry-After": "1"}), FakeResponse(201, b'{"ok": 1}'))
    assert kube.create(JOBS, "ns", {"metadata": {"generateName": "w-"}}) == {"ok": 1}
    assert len(fake.sent) == 2


def test_a_named_create_is_repeated_after_a_server_error() -> None:
    """Repeated, a committed create answers 409 AlreadyExists, which the caller takes as made."""
    kube, fake, _ = _kube(_status(504, "Timeout"), _status(409, "AlreadyExists"))
    with pytest.raises(AlreadyExists):
        kube.create(JOBS, "ns", {"metadata": {"name": "w-1"}})
    assert len(fake.sent) == 2


def test_an_event_whose_create_answer_was_lost_counts_as_written() -> None:
    kube, fake, _ = _kube(_status(504, "Timeout"), _status(409, "AlreadyExists"))
    body = {"metadata": {"name": "s.0123456789ab", "namespace": "ns"}, "reason": "Blocked"}
    assert events.record(kube, body) == "s.0123456789ab"
    assert len(fake.sent) == 2, "sent again: its name makes the repetition harmless"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (_status(404, "NotFound"), NotFound),
        (_status(409, "AlreadyExists"), AlreadyExists),
        (_status(409, "Conflict"), Conflict),
    ],
)
def test_conflicts_and_missing_objects_are_typed_and_never_retried(
    response: FakeResponse, expected: type
) -> None:
    kube, fake, _ = _kube(response)
    with pytest.raises(expected):
        kube.patch(PODS, "ns", "p", {"a": 1}, resource_version="7")
    assert len(fake.sent) == 1


@pytest.mark.parametrize(
    ("method", "responses", "ambiguous"),
    [
        pytest.param("PATCH", [_status(504, "Timeout"), _status(409, "Conflict")], True, id="504 then 409"),
        pytest.param("PATCH", [_status(500, "InternalError")] * 3, True, id="server errors to the end"),
        pytest.param(
            "PATCH", [_status(429, "TooManyRequests"), _status(409, "Conflict")], False, id="throttled"
        ),
        pytest.param("PATCH", [_status(409, "Conflict")], False, id="a plain conflict"),
        pytest.param("GET", [_status(500, "InternalError")] * 3, False, id="a read"),
    ],
)
def test_an_error_after_a_server_error_on_a_write_is_ambiguous(
    method: str, responses: list[FakeResponse], ambiguous: bool
) -> None:
    # The write may have been applied before the server error was answered: its retry then meets
    # the write itself, and the caller must re-read before calling it a lost race.
    kube, _, _ = _kube(*responses)
    with pytest.raises(ApiError) as error:
        kube.request(method, "/api/v1/namespaces/ns/pods/p")
    assert error.value.ambiguous is ambiguous


def test_writes_carry_the_field_manager_and_the_precondition() -> None:
    kube, fake, _ = _kube(FakeResponse(200, b"{}"))
    kube.patch(CAMPAIGNS, "ns", "c", {"status": {"x": 1}}, resource_version="9", subresource="status")
    method, url, body = fake.sent[0]
    assert (
        method == "PATCH"
        and "fieldManager=tester" in url
        and url.split("?")[0].endswith("/campaigns/c/status")
    )
    assert body == {"status": {"x": 1}, "metadata": {"resourceVersion": "9"}}


def test_list_follows_continue_tokens() -> None:
    kube, fake, _ = _kube(
        FakeResponse(200, json.dumps({"items": [{"a": 1}], "metadata": {"continue": "t"}}).encode()),
        FakeResponse(200, json.dumps({"items": [{"a": 2}], "metadata": {}}).encode()),
    )
    assert kube.list(PODS, "ns", label_selector="x=y") == [{"a": 1}, {"a": 2}]
    assert "continue=t" in fake.sent[1][1] and "labelSelector=x=y" in fake.sent[1][1]


def _lease(
    holder: str | None, renewed: dt.datetime, duration: int = 10, transitions: int = 3
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "leaseTransitions": transitions}
    if holder:
        spec |= {"holderIdentity": holder, "renewTime": leases.format_micro_time(renewed)}
    return {"metadata": {"name": "s", "resourceVersion": "1"}, "spec": spec}


def test_lease_is_free_when_released_or_not_seen_renewed_for_its_duration_on_the_observers_clock() -> None:
    monotonic = [0.0]
    seen = Renewals(lambda: monotonic[0])
    assert leases.is_free(_lease(None, NOW), seen)
    # Its renewTime is an hour old by this machine's clock (the holder's clock runs behind): held.
    stale_looking = _lease("w1", NOW - dt.timedelta(hours=1))
    assert not leases.is_free(stale_looking, seen)
    monotonic[0] = 9.9
    assert not leases.is_free(stale_looking, seen)
    monotonic[0] = 10.0
    assert leases.is_free(stale_looking, seen)
    # Renewed since (its mark rose): held again, timed from now.
    assert not leases.is_free(_lease("w1", NOW - dt.timedelta(hours=1) + dt.timedelta(seconds=3)), seen)


def test_holding_needs_both_identity_and_fencing_token() -> None:
    claim = leases.Claim("ns", "s", "w1", 3, "1", 10, NOW)
    assert leases.holds(_lease("w1", NOW), claim)
    assert not leases.holds(_lease("w1", NOW, transitions=4), claim)
    assert not leases.holds(_lease("w2", NOW), claim)


def _shard(phase: ShardPhase | None, attempt: int = 1) -> Shard:
    body: dict[str, Any] = {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Shard",
        "metadata": {"name": "c-00000", "namespace": "ns", "resourceVersion": "5"},
        "spec": {"campaign": "c", "index": 0, "items": [{"x": 1}], "idempotencyKey": "k"},
    }
    if phase:
        body["status"] = {"phase": phase.value, "attempt": attempt}
    return Shard.parse(body)


def test_planned_status_follows_the_transition_table() -> None:
    claimed = planned_status(
        _shard(ShardPhase.PENDING), TransitionRequest(Action.CLAIM, "claimed", {"owner": "w1"}), NOW, "ev1"
    )
    assert claimed.phase is ShardPhase.RUNNING and claimed.owner == "w1" and claimed.attempt == 1
    assert claimed.history[-1].reason == "Claimed" and claimed.history[-1].event == "ev1"

    error = ShardError(error_class=ErrorClass.TIMEOUT, message="slow")
    failed = planned_status(
        _shard(ShardPhase.RUNNING, attempt=2),
        TransitionRequest(Action.FAIL_RETRYABLE, "timeout", {"last_error": error, "owner": None}),
        NOW,
        "ev2",
    )
    assert failed.phase is ShardPhase.PENDING and failed.attempt == 3 and failed.owner is None
    assert failed.last_error is not None and failed.last_error.event == "ev2"
    # The merge patch must clear the owner explicitly, or the API server keeps the old one.
    assert failed.to_merge_patch()["owner"] is None


def test_materialize_starts_from_a_shard_without_status() -> None:
    status = planned_status(_shard(None), TransitionRequest(Action.MATERIALIZE, "m"), NOW, None)
    assert status.phase is ShardPhase.PENDING and status.attempt == 1


def test_illegal_transitions_are_refused_before_any_write() -> None:
    with pytest.raises(IllegalTransition):
        planned_status(_shard(ShardPhase.DONE), TransitionRequest(Action.CLAIM, "x"), NOW, None)


def test_a_guarded_client_checks_every_write_and_every_retry_of_one() -> None:
    leading = [True]
    asked: list[tuple[str, str]] = []

    def guard(method: str, path: str) -> None:
        asked.append((method, path))
        if not leading[0]:
            raise WriteRefused(f"not leading: {method} {path} not sent")

    base, fake, _ = _kube(_status(503, "ServiceUnavailable"), FakeResponse(200, b"{}"))
    kube = base.guarded(guard)
    # The leadership runs out while the client waits to retry: the retry is never sent.
    kube.retry.sleep = lambda _seconds: leading.__setitem__(0, False)
    with pytest.raises(WriteRefused):
        kube.patch(PODS, "ns", "p", {"metadata": {"labels": {"a": "b"}}})
    assert [method for method, _, _ in fake.sent] == ["PATCH"], "the first attempt went, the retry did not"
    assert asked == [("PATCH", "/api/v1/namespaces/ns/pods/p")] * 2
    # Reads are not guarded, and the client it came from has no guard.
    assert kube.get(PODS, "ns", "p") == {} and base.write_guard is None


def test_the_transport_never_sends_a_write_again_after_its_answer_was_lost(tmp_path: Any) -> None:
    """A connection that closes after the request arrived: urllib3 would send a PUT again by itself
    (its copy meets 409 when the first was applied, and the write reads as a lost race). Only reads
    are repeated by the transport; the write's caller gets the transport error and re-reads."""
    import http.server
    import socketserver
    import threading

    import urllib3

    arrived: list[str] = []

    class HangUp(http.server.BaseHTTPRequestHandler):
        def _drop(self) -> None:
            arrived.append(self.command)
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.close_connection = True  # no answer at all

        do_PUT = do_GET = _drop

        def log_message(self, *args: object) -> None:
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), HangUp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        kube = Kube.from_environment("test", kubeconfig=str(kubeconfig), timeout=5)
        with pytest.raises(urllib3.exceptions.HTTPError):
            kube.request("PUT", "/api/v1/namespaces/ns/configmaps/x", body={"a": 1})
        assert arrived == ["PUT"], "the transport sent the write again"
        arrived.clear()
        with pytest.raises(urllib3.exceptions.HTTPError):
            kube.request("GET", "/api/v1/namespaces/ns/configmaps/x")
        assert arrived == ["GET"] * 4, "reads are still repeated by the transport (3 retries)"
    finally:
        server.shutdown()
        server.server_close()
