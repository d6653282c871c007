"""After a 429 with Retry-After the whole campaign leaves that source alone: the shard records when
(lastError.retryAt), the planner holds the source's shards, the operator records the cooldown in the
status, a worker mid-shard reads it at heartbeat and the LLM command pauses (with jitter). Also the
x-ratelimit-remaining-* headers slowing a worker down."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed.upstream import Behaviour, LlmServer, llm_server

from shardops.api.campaign import Campaign
from shardops.api.llm import CONFIG_ENV, COOLDOWN_FILE_ENV
from shardops.api.shard import Shard
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.llm import main as llm_main
from shardops.llm.pacing import JITTER_CAP_SECONDS, Pacer, Share, cooldown_until, jittered
from shardops.logic.planner import plan_dispatch
from shardops.state import cooldowns, observe
from shardops.worker.runtime import Worker
from shardops.worker.settings import WorkerSettings
from tests.fakekube import FakeKube
from tests.schedulerkit import campaign as scheduler_campaign
from tests.schedulerkit import shard as scheduler_shard
from tests.workerkit import NAMESPACE, add_campaign, campaign_body

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SOURCE = "a"
LLM_COMMAND = [
    sys.executable,
    "-c",
    "import sys; from shardops.main import main; sys.exit(main(['llm']))",
]


def _limited(index: int, retry_at: dt.datetime, source: str = SOURCE) -> dict[str, Any]:
    body = scheduler_shard("c", index, "Pending")
    body["spec"]["source"] = source
    body["status"]["notBefore"] = retry_at.isoformat()
    body["status"]["lastError"] = {
        "class": "rate-limited",
        "source": source,
        "message": "429",
        "at": NOW.isoformat(),
        "retryAt": retry_at.isoformat(),
    }
    return body


def _pending(index: int, source: str = SOURCE) -> dict[str, Any]:
    body = scheduler_shard("c", index, "Pending")
    body["spec"]["source"] = source
    return body


def test_the_latest_retry_at_of_each_source_is_its_cooldown_and_past_ones_are_none() -> None:
    camp = Campaign.parse(scheduler_campaign(items=[{"id": i} for i in range(4)]))
    shards = [
        Shard.parse(_limited(0, NOW + dt.timedelta(seconds=2))),
        Shard.parse(_limited(1, NOW + dt.timedelta(seconds=5))),
        Shard.parse(_limited(2, NOW - dt.timedelta(seconds=1), source="b")),  # over already
    ]
    found = cooldowns.source_cooldowns(camp, shards, NOW)
    assert list(found) == [SOURCE]
    assert found[SOURCE].until == NOW + dt.timedelta(seconds=5) and found[SOURCE].shard == "c-00001"
    # What the operator recorded counts too (a worker mid-shard sees only the status), the later wins.
    body = scheduler_campaign(items=[{"id": i} for i in range(4)])
    body["status"] = {"sourceCooldowns": [c.to_dict() for c in cooldowns.status_list(found)]}
    camp = Campaign.parse(body)
    assert cooldowns.source_cooldowns(camp, [], NOW)[SOURCE].until == NOW + dt.timedelta(seconds=5)
    assert cooldowns.source_cooldowns(camp, [], NOW + dt.timedelta(seconds=6)) == {}


def test_the_planner_hands_out_no_shard_of_a_cooling_source() -> None:
    body = scheduler_campaign(
        items=[{"id": i} for i in range(3)], sources=[{"name": SOURCE}, {"name": "b"}], shardSize=1
    )
    camp = Campaign.parse(body)
    shards = [
        Shard.parse(_limited(0, NOW + dt.timedelta(seconds=2))),
        Shard.parse(_pending(1)),
        Shard.parse(_pending(2, source="b")),
    ]
    plan = plan_dispatch(observe.claim_inputs(camp, shards, NOW))
    assert plan.claimable == ("c-00002",), plan.skipped
    assert plan.skipped["c-00001"].startswith(f"source {SOURCE} cooling down until 2026-01-01T00:00:02Z")
    later = plan_dispatch(observe.claim_inputs(camp, shards, NOW + dt.timedelta(seconds=3)))
    assert set(later.claimable) == {"c-00000", "c-00001", "c-00002"}


def test_jitter_only_adds_up_to_a_quarter_of_the_wait_and_at_most_the_cap() -> None:
    assert jittered(2.0, 0.0) == 2.0
    assert jittered(2.0, 0.999) == pytest.approx(2.0 + 0.5 * 0.999)
    assert jittered(60.0, 0.999) == pytest.approx(60.0 + JITTER_CAP_SECONDS * 0.999)


def test_the_cooldown_file_is_read_leniently(tmp_path: Path) -> None:
    path = tmp_path / "cooldown.json"
    assert cooldown_until(None) is None and cooldown_until(path) is None
    path.write_text("{}")
    assert cooldown_until(path) is None
    path.write_text('{"until": 12.5}')
    assert cooldown_until(path) == 12.5
    path.write_text("{not json")
    assert cooldown_until(path) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _call(tmp_path: Path, cooldown: Path | None = None, workers: int = 2) -> llm_main.Call:
    llm = {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "messages": [{"role": "user", "content": "x"}]}
    env = {CONFIG_ENV: json.dumps({"llm": llm, "maxConcurrency": workers, "rateLimits": {}})}
    if cooldown is not None:
        env[COOLDOWN_FILE_ENV] = str(cooldown)
    call = llm_main.Call(llm_main.Settings.from_env(env), SOURCE, env, wall_clock=lambda: 1000.0)
    clock = FakeClock()
    call.pacer = Pacer(Share(), None, clock=clock, sleep=clock.sleep)
    return call


def test_a_cooldown_from_another_worker_holds_the_next_request_with_jitter(tmp_path: Path) -> None:
    path = tmp_path / "cooldown.json"
    path.write_text(json.dumps({"source": SOURCE, "until": 1002.0}))  # 2 s from the wall clock's now
    call = _call(tmp_path, path)
    call._heed_cooldown()
    start = call.pacer.wait()
    assert 102.0 <= start <= 102.5  # 2 s plus up to a quarter of it
    path.write_text(json.dumps({"source": SOURCE, "until": 999.0}))  # over: no wait
    call._heed_cooldown()
    assert call.pacer.wait() == start


def test_remaining_requests_and_tokens_headers_slow_the_worker_down(tmp_path: Path) -> None:
    call = _call(tmp_path, workers=2)
    call._tighten({"x-ratelimit-remaining-requests": "5000", "x-ratelimit-reset-requests": "60s"}, 100)
    assert call.pacer.wait() == pytest.approx(100.0 + 60 * 2 / 5000)  # plenty left: barely slower
    # 1,000 tokens left until the reset in 10 s, requests of 100 tokens: 10 requests' worth for two
    # workers, 5 each over 10 s: one every 2 s.
    before = call.pacer.clock()
    call._tighten({"X-RateLimit-Remaining-Tokens": "1000", "X-RateLimit-Reset-Tokens": "10s"}, 100)
    assert call.pacer.wait() == pytest.approx(before + 2.0)
    # Fewer tokens left than one request uses: wait for the reset.
    before = call.pacer.clock()
    call._tighten({"x-ratelimit-remaining-tokens": "50", "x-ratelimit-reset-tokens": "6m0s"}, 100)
    assert call.pacer.wait() == pytest.approx(before + 360.0)
    # Without a reset the remaining count says nothing about a pace.
    before = call.pacer.clock()
    call._tighten({"x-ratelimit-remaining-requests": "1"}, 100)
    assert call.pacer.wait() == before


# --- under the worker runtime, against the loopback upstream ---------------------------------------


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with llm_server(Behaviour(latency_seconds=0.3)) as running:
        yield running


def _llm_campaign(server: LlmServer, items: int, shard_size: int) -> dict[str, Any]:
    block = {
        "baseUrl": server.base_url,
        "model": "test-model",
        "messages": [{"role": "user", "content": "{{ item.q }}"}],
    }
    return campaign_body(
        items=[{"q": f"q{n}"} for n in range(items)],
        worker={"image": "x", "command": LLM_COMMAND, "llm": block},
        shardSize=shard_size,
        sources=[{"name": SOURCE}],
        defaultSource=SOURCE,
    )


def _add(kube: FakeKube, body: dict[str, Any]) -> list[Shard]:
    """The campaign's shards, each calling SOURCE (as the operator cuts them with defaultSource)."""
    shards = add_campaign(kube, body)
    for shard in shards:
        stored = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert stored is not None
        stored["spec"]["source"] = SOURCE
    return shards


def _worker(kube: FakeKube, tmp_path: Path, **settings: Any) -> Worker:
    values: dict[str, Any] = {
        "namespace": NAMESPACE,
        "pod_name": f"w-{tmp_path.name}",
        "tick_seconds": 0.01,
        "poll_seconds": 0.05,
        "idle_seconds": 0,
        "work_dir": tmp_path,
        **settings,
    }
    return Worker(kube=kube, settings=WorkerSettings(**values), namespace=NAMESPACE, campaign_name="camp")  # type: ignore[arg-type]


def test_a_worker_claims_nothing_of_a_source_another_shard_was_told_to_wait_for(
    server: LlmServer, tmp_path: Path
) -> None:
    kube = FakeKube()
    first, _second = _add(kube, _llm_campaign(server, 2, 1))
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)
    # Another worker's attempt on the first shard got a 429 with Retry-After.
    body = kube.obj(SHARDS, NAMESPACE, first.name)
    assert body is not None
    body["status"]["lastError"] = {
        "class": "rate-limited",
        "source": SOURCE,
        "message": "429",
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "retryAt": until.isoformat(),
    }
    assert _worker(kube, tmp_path, idle_seconds=10).run() == 0
    log = server.requests()
    assert len(log) == 2 and all(e.status == 200 for e in log)
    assert min(e.wall for e in log) >= until.timestamp(), (min(e.wall for e in log), until.timestamp())


def test_a_rate_limited_failure_records_when_the_source_may_be_called_again(tmp_path: Path) -> None:
    with llm_server(Behaviour(rate_limited_share=1.0, retry_after="7")) as server:
        kube = FakeKube()
        (only,) = _add(kube, _llm_campaign(server, 1, 1))
        assert _worker(kube, tmp_path, max_shards=1).run() == 0
    status = Shard.parse(kube.obj(SHARDS, NAMESPACE, only.name) or {}).current_status
    error = status.last_error
    assert error is not None and error.error_class == "rate-limited" and error.source == SOURCE
    assert error.at is not None and error.retry_at is not None
    assert 7.0 <= (error.retry_at - error.at).total_seconds() <= 7.01
    assert status.not_before is not None and status.not_before >= error.retry_at


def test_mid_shard_a_worker_pauses_for_a_cooldown_it_reads_at_heartbeat(
    server: LlmServer, tmp_path: Path
) -> None:
    kube = FakeKube()
    _add(kube, _llm_campaign(server, 12, 12))  # one shard of 12 calls, ~0.3 s each
    recorded: dict[str, float] = {}

    def operator_records_a_cooldown() -> None:
        # When the shard's first call is logged, the operator records another worker's 429.
        deadline = time.monotonic() + 10
        while not server.requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
        body = kube.obj(CAMPAIGNS, NAMESPACE, "camp")
        assert body is not None
        body.setdefault("status", {})["sourceCooldowns"] = [
            {"source": SOURCE, "until": until.isoformat(), "shard": "elsewhere"}
        ]
        recorded.update(at=time.time(), until=until.timestamp())

    thread = threading.Thread(target=operator_records_a_cooldown)
    thread.start()
    assert _worker(kube, tmp_path).run() == 0
    thread.join()
    times = [e.wall for e in server.requests()]
    assert len(times) == 12
    # heartbeatSeconds is 1: the worker learns within a heartbeat (plus a tick and the request in
    # flight); from then to the end of the cooldown nothing is sent; afterwards the shard finishes.
    learnt = recorded["at"] + 1.0 + 0.5
    inside = [t for t in times if learnt <= t < recorded["until"]]
    assert inside == [], (inside, recorded)
    assert any(t >= recorded["until"] for t in times)
