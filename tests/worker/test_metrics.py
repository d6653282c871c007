"""The worker's own Prometheus figures move when the runtime does what they count.

The worker runs against the in-memory API server with real commands (the example agent), each test
setting up the event to count (a lost race, a takeover, an API error) with a hook at the exact
point of the protocol, as tests/worker/test_runtime.py does; then the registry is read as a scrape
would read it. The endpoint tests fetch /metrics over HTTP on loopback.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from testbed.harness import wait_for

from shardops.api.campaign import Campaign
from shardops.k8s.api import LEASES, SHARDS, ApiError, Resource
from shardops.scheduler import builders
from shardops.scheduler.settings import OperatorSettings
from shardops.worker.metrics import ClaimOutcome, WorkerMetrics
from shardops.worker.settings import WorkerSettings
from tests import workerkit
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, add_campaign, campaign_body

AGENT = [sys.executable, "-m", "shardops_example_agent.agent"]
CAMPAIGN = f"{NAMESPACE}/camp"
ROOT = Path(__file__).resolve().parents[2]


def _agent_campaign(items: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return campaign_body(items=items, worker={"image": "x", "command": AGENT}, **spec)


def _count(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    return metrics.sample(name, **labels)


def test_won_claims_heartbeats_command_durations_and_done_shards_are_counted(tmp_path: Path) -> None:
    kube = FakeKube()
    # Two shards; one item each runs 1.3 s, past the 1 s heartbeat, so each shard heartbeats once.
    add_campaign(kube, _agent_campaign([{"id": i, "latency": 1.3} for i in range(2)], shardSize=1))
    worker = workerkit.worker(kube, tmp_path)
    assert worker.run() == 0
    m = worker.metrics
    assert m.campaign == CAMPAIGN, "labelled <namespace>/<name>, as the operator labels campaigns"
    assert _count(m, "shardops_worker_claims_total", outcome="won") == 2
    assert _count(m, "shardops_worker_claims_total", outcome="lost") == 0
    assert _count(m, "shardops_worker_heartbeats_total", outcome="ok") >= 2
    assert _count(m, "shardops_worker_heartbeats_total", outcome="failed") == 0
    command = {"shard_class": "work", "outcome": "succeeded"}
    assert _count(m, "shardops_worker_command_duration_seconds_count", **command) == 2
    # The agent slept 1.3 s per shard: the run time is the command's, not a tick's.
    assert 2.6 <= _count(m, "shardops_worker_command_duration_seconds_sum", **command) < 20
    done = {"shard_class": "work", "outcome": "done", "error_class": ""}
    assert _count(m, "shardops_worker_shards_total", **done) == 2
    assert _count(m, "shardops_worker_fenced_total", reason="lease") == 0


def test_a_lost_claim_race_is_counted_apart_from_the_won_claims(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, _agent_campaign([{"id": i} for i in range(2)], shardSize=1))
    raced: list[str] = []

    def operator_writes_first(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        # The claim's status patch finds the shard changed since it was listed, and again after the
        # one re-read: the race is lost.
        if resource is SHARDS and verb == "patch" and len(raced) < 2:
            current = fake.obj(SHARDS, NAMESPACE, name)
            assert current is not None
            fake.put(SHARDS, NAMESPACE, current)
            raced.append(name)

    kube.before.append(operator_writes_first)
    worker = workerkit.worker(kube, tmp_path, claim_candidates=1, idle_seconds=10)
    assert worker.run() == 0
    assert len(raced) == 2
    assert _count(worker.metrics, "shardops_worker_claims_total", outcome="lost") == 1
    assert _count(worker.metrics, "shardops_worker_claims_total", outcome="won") == 2


def test_a_look_that_finds_nothing_claimable_counts_as_none(tmp_path: Path) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": 1}], shardSize=1))
    # In backoff for an hour: Pending but not claimable, and the campaign is not finished.
    body = kube.obj(SHARDS, NAMESPACE, shard.name)
    assert body is not None
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    kube.put(SHARDS, NAMESPACE, {**body, "status": {**body["status"], "notBefore": later}})
    worker = workerkit.worker(kube, tmp_path)
    assert worker.run() == 0
    assert _count(worker.metrics, "shardops_worker_claims_total", outcome="none") >= 1
    assert _count(worker.metrics, "shardops_worker_claims_total", outcome="won") == 0
    assert _count(worker.metrics, "shardops_worker_shards_total", shard_class="work", outcome="done",
                  error_class="") == 0  # fmt: skip


def test_a_refused_renewal_counts_a_fenced_run_a_fenced_heartbeat_and_a_fenced_command(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    (shard,) = add_campaign(kube, _agent_campaign([{"id": i, "latency": 0.4} for i in range(6)], shardSize=6))
    stolen: list[str] = []

    def thief(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        # At the first renewal: another worker took the Lease over (a newer fencing token).
        if resource is LEASES and verb == "patch" and not stolen:
            lease = fake.obj(LEASES, NAMESPACE, name)
            assert lease is not None
            spec = {
                **lease["spec"],
                "holderIdentity": "thief",
                "leaseTransitions": lease["spec"]["leaseTransitions"] + 1,
            }
            fake.put(LEASES, NAMESPACE, {**lease, "spec": spec})
            stolen.append(name)

    kube.before.append(thief)
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    assert worker.run() == 0
    assert stolen == [shard.name]
    m = worker.metrics
    assert _count(m, "shardops_worker_fenced_total", reason="lease") == 1
    assert _count(m, "shardops_worker_heartbeats_total", outcome="fenced") == 1
    assert _count(m, "shardops_worker_heartbeats_total", outcome="ok") == 0
    fenced_command = {"shard_class": "work", "outcome": "fenced"}
    assert _count(m, "shardops_worker_command_duration_seconds_count", **fenced_command) == 1
    fenced = {"shard_class": "work", "outcome": "fenced", "error_class": ""}
    assert _count(m, "shardops_worker_shards_total", **fenced) == 1


def test_a_heartbeat_that_fails_for_a_transient_reason_is_counted_and_retried(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, _agent_campaign([{"id": 1, "latency": 2.5}], shardSize=1))
    broken: list[str] = []

    def api_down_once(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        if resource is LEASES and verb == "patch" and not broken:
            broken.append(name)
            raise ApiError(503, "ServiceUnavailable", "the API server is restarting")

    kube.before.append(api_down_once)
    worker = workerkit.worker(kube, tmp_path)
    assert worker.run() == 0
    assert broken
    m = worker.metrics
    assert _count(m, "shardops_worker_heartbeats_total", outcome="failed") == 1
    assert _count(m, "shardops_worker_heartbeats_total", outcome="ok") >= 1, "retried and renewed"
    assert _count(m, "shardops_worker_shards_total", shard_class="work", outcome="done", error_class="") == 1


def test_a_failed_shard_is_counted_by_error_class_and_its_command_as_failed(tmp_path: Path) -> None:
    kube = FakeKube()
    add_campaign(kube, _agent_campaign([{"id": 1, "fault": "rate-limited"}], shardSize=1))
    worker = workerkit.worker(kube, tmp_path, max_shards=1)
    assert worker.run() == 0
    m = worker.metrics
    failed = {"shard_class": "work", "outcome": "failed", "error_class": "rate-limited"}
    assert _count(m, "shardops_worker_shards_total", **failed) == 1
    command = {"shard_class": "work", "outcome": "failed"}
    assert _count(m, "shardops_worker_command_duration_seconds_count", **command) == 1


# --- the endpoint -------------------------------------------------------------------------------


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_endpoint_serves_the_figures_and_initialises_the_outcomes_at_zero() -> None:
    metrics = WorkerMetrics("ns/camp")
    endpoint = metrics.serve("127.0.0.1", 0)
    try:
        before = _scrape(endpoint.port)
        won = "shardops_worker_claims_total[('campaign', 'ns/camp'), ('outcome', 'won')]"
        assert before[won] == 0, "known series exist before their first event"
        metrics.observe_claim(ClaimOutcome.WON)
        assert _scrape(endpoint.port)[won] == 1
        # The server counts a scrape once its answer is flushed, which may be just after we read it.
        wait_for("two scrapes counted", lambda: endpoint.scrapes == 2, timeout=10, interval=0.01)
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/other", timeout=10)
        assert missing.value.code == 404
        # Requests are served one at a time: once the next scrape is counted, the 404 is done too.
        _scrape(endpoint.port)
        wait_for("the third scrape counted", lambda: endpoint.scrapes >= 3, timeout=10, interval=0.01)
        assert endpoint.scrapes == 3, "only /metrics counts as a scrape"
    finally:
        endpoint.stop()


def test_linger_ends_at_the_first_scrape_after_it_began() -> None:
    endpoint = WorkerMetrics("ns/camp").serve("127.0.0.1", 0)
    try:
        _scrape(endpoint.port)  # a scrape before the worker finished does not end the linger
        result: list[bool] = []
        lingering = threading.Thread(target=lambda: result.append(endpoint.linger(60, threading.Event())))
        lingering.start()
        # Scrape until the linger is over: whichever scrape is the first after it began ends it.
        scrapes = 0
        while lingering.is_alive() and scrapes < 100:
            _scrape(endpoint.port)
            scrapes += 1
            lingering.join(timeout=0.05)
        lingering.join(timeout=10)
        assert result == [True]
    finally:
        endpoint.stop()


def test_linger_gives_up_after_its_time_and_at_once_on_stop() -> None:
    endpoint = WorkerMetrics("ns/camp").serve("127.0.0.1", 0)
    try:
        assert endpoint.linger(0.2, threading.Event()) is False
        stop = threading.Event()
        stop.set()
        assert endpoint.linger(600, stop) is False
    finally:
        endpoint.stop()


# --- how the operator turns it on -----------------------------------------------------------------


def _campaign() -> Campaign:
    return Campaign.parse({**campaign_body(), "metadata": {"name": "camp", "namespace": NAMESPACE}})


def test_worker_pods_get_the_port_and_the_worker_settings_only_when_asked() -> None:
    plain = builders.worker_job_body(_campaign(), _campaign().spec.worker)
    container = plain["spec"]["template"]["spec"]["containers"][0]
    assert "ports" not in container
    assert not [v for v in container["env"] if v["name"].startswith("SHARDOPS_METRICS")]

    settings = OperatorSettings(identity="t", worker_metrics_port=9090, worker_metrics_linger_seconds=45)
    job = builders.worker_job_body(_campaign(), _campaign().spec.worker, "sa", settings.worker_metrics())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    env = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    # The variables are the worker's own settings: what the pod reads is what the operator meant.
    worker = WorkerSettings.model_validate(
        {name.removeprefix("SHARDOPS_").lower(): value for name, value in env.items()
         if name.startswith("SHARDOPS_METRICS")}
    )  # fmt: skip
    assert (worker.metrics_port, worker.metrics_linger_seconds) == (9090, 45)
    assert OperatorSettings(identity="t").worker_metrics() is None


def test_the_operator_reads_the_worker_metrics_settings_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDOPS_WORKER_METRICS_PORT", "9191")
    endpoint = OperatorSettings(identity="t").worker_metrics()
    assert endpoint == builders.WorkerMetricsEndpoint(9191, None), "linger: the worker's own default"
    monkeypatch.setenv("SHARDOPS_WORKER_METRICS_PORT", "0")
    with pytest.raises(ValueError, match="worker_metrics_port"):
        OperatorSettings(identity="t")


def test_the_worker_reads_its_metrics_settings_and_refuses_a_bad_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert WorkerSettings().metrics_port is None, "off unless asked"
    monkeypatch.setenv("SHARDOPS_METRICS_PORT", "0")
    monkeypatch.setenv("SHARDOPS_METRICS_LINGER_SECONDS", "5")
    settings = WorkerSettings()
    assert (settings.metrics_port, settings.metrics_linger_seconds) == (0, 5)
    monkeypatch.setenv("SHARDOPS_METRICS_PORT", "70000")
    with pytest.raises(ValueError, match="metrics_port"):
        WorkerSettings()


def test_the_charts_linger_default_is_the_workers() -> None:
    values = yaml.safe_load((ROOT / "charts" / "shardops" / "values.yaml").read_text())
    chart = values["workers"]["metrics"]["lingerSeconds"]
    assert chart == WorkerSettings.model_fields["metrics_linger_seconds"].default
