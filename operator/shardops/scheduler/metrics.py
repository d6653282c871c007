"""Prometheus metrics on a registry of our own, plus /healthz, served from one small HTTP thread.

The registry is created by `Metrics()` in main, never at import: tests and a second operator in the
same process get their own, and nothing leaks into the global default registry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shardops.api.common import TokenCounts
from shardops.api.enums import BreakerState, ShardPhase

log = logging.getLogger(__name__)

_RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Every shardops_ metric of the operator. Labels: campaign is `<namespace>/<name>`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.shards = Gauge(
            "shardops_shards", "Shards by campaign and phase.", ["campaign", "phase"], registry=r
        )
        self.oldest_pending = Gauge(
            "shardops_oldest_pending_seconds",
            "Age of the longest-waiting Pending shard (0 when none).",
            ["campaign"],
            registry=r,
        )
        self.items_errored = Gauge(
            "shardops_items_errored",
            "Items of Done shards that failed on their own (the campaign's status.itemsErrored).",
            ["campaign"],
            registry=r,
        )
        self.claims = Counter(
            "shardops_claims", "Shard claims seen in shard history.", ["campaign"], registry=r
        )
        self.lease_expirations = Counter(
            "shardops_lease_expirations",
            "Running shards taken back because their lease expired (zombies).",
            ["campaign"],
            registry=r,
        )
        self.stalls = Counter(
            "shardops_stalls", "Running shards found heartbeating without progress.", ["campaign"], registry=r
        )
        self.retries = Counter(
            "shardops_retries",
            "Failed attempts that go back to Pending, by error class.",
            ["campaign", "error_class"],
            registry=r,
        )
        self.blocked = Counter(
            "shardops_blocked", "Shards that used up their attempts (Blocked).", ["campaign"], registry=r
        )
        self.failed = Counter(
            "shardops_failed",
            "Shards failed by a non-retryable error, by class.",
            ["campaign", "error_class"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "shardops_breaker_state",
            "Circuit breaker per source, one series per state: 1 for the state it is in, 0 for the others.",
            ["campaign", "source", "state"],
            registry=r,
        )
        self.budget_ratio = Gauge(
            "shardops_budget_spent_ratio",
            "Spent / budget limit (absent without a budget).",
            ["campaign"],
            registry=r,
        )
        self.tokens = Counter(
            "shardops_tokens",
            "Tokens the campaign's shards reported using (status.tokens), by kind: input (prompt tokens, "
            "cached ones included), cached_input, output.",
            ["campaign", "kind"],
            registry=r,
        )
        # What `tokens` shows per (campaign, kind): it follows status.tokens, which never goes down, by
        # adding the difference; a new process starts its series at the status's total, so Prometheus
        # sees the count continue rather than reset.
        self._tokens_shown: dict[tuple[str, str], int] = {}
        self.dispatch = Counter(
            "shardops_dispatch_decisions",
            "Dispatch plans by the reason that limited them (None: nothing did).",
            ["campaign", "reason"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "shardops_reconcile_duration_seconds",
            "Duration of one campaign reconcile, by outcome: ok, conflict (the campaign kept changing), "
            "not-leader (stopped: the leadership ran out mid-pass), error.",
            ["outcome"],
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            "shardops_api_requests",
            "API server requests by verb and status code.",
            ["verb", "code"],
            registry=r,
        )
        self.is_leader = Gauge(
            "shardops_leader", "1 while this replica is the leader.", ["identity"], registry=r
        )
        self.leader_known = Gauge(
            "shardops_leader_known",
            "1 while this replica can read the leader Lease.",
            ["identity"],
            registry=r,
        )
        self.leader_problems = Counter(
            "shardops_leader_election_problems",
            "Leader election trouble: renewal failed, lease unreadable, duplicate identity, loop stalled.",
            ["identity", "kind"],
            registry=r,
        )
        self.old_finalizers_removed = Counter(
            "shardops_old_finalizers_removed",
            "Campaigns whose finalizer from an earlier release (kopf's, no longer needed) was removed.",
            registry=r,
        )
        self.periodic_reconciles = Counter(
            "shardops_periodic_reconciles",
            "Campaign reconciles started by the periodic tick (not by a change), by outcome.",
            ["outcome"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "shardops_retention_deleted_objects",
            "Stored objects (results, item results, ledgers, uploaded inputs) deleted past their retention.",
            registry=r,
        )
        self.loop_lag = Gauge(
            "shardops_event_loop_heartbeat_age_seconds",
            "Seconds since the kopf event loop last ticked (large: the loop is blocked).",
            registry=r,
        )

        # Every metric whose first label is the campaign: what forget_campaign drops.
        self._per_campaign = [
            metric
            for metric in vars(self).values()
            if isinstance(metric, Gauge | Counter | Histogram) and metric._labelnames[:1] == ("campaign",)
        ]

    # --- recording helpers -----------------------------------------------------------------------

    def observe_api(self, verb: str, _path: str, code: int) -> None:
        """`Kube`'s request observer."""
        self.api_requests.labels(verb=verb, code=str(code)).inc()

    @contextmanager
    def reconcile_timer(self) -> Iterator[None]:
        with self.reconcile_seconds.labels(outcome="ok").time():
            yield

    def set_phases(self, campaign: str, counts: dict[ShardPhase, int]) -> None:
        for phase in ShardPhase:
            self.shards.labels(campaign=campaign, phase=str(phase)).set(counts.get(phase, 0))

    def set_tokens(self, campaign: str, tokens: TokenCounts) -> None:
        """Bring shardops_tokens_total up to the campaign's status.tokens."""
        for kind, total in (
            ("input", tokens.input),
            ("cached_input", tokens.cached_input),
            ("output", tokens.output),
        ):
            shown = self._tokens_shown.get((campaign, kind))
            if shown is None and total == 0:
                continue  # a campaign that reports no tokens gets no series
            if shown is None or total > shown:
                self.tokens.labels(campaign=campaign, kind=kind).inc(total - (shown or 0))
                self._tokens_shown[(campaign, kind)] = total

    def set_breaker(self, campaign: str, source: str, state: BreakerState) -> None:
        """The state as a label (state="Open" 1, the others 0), not as a number to decode."""
        for each in BreakerState:
            self.breaker_state.labels(campaign=campaign, source=source, state=str(each)).set(
                1 if each is state else 0
            )

    def forget_campaign(self, campaign: str) -> None:
        """Drop every series of a deleted campaign, gauges and counters alike, so dashboards do not show
        it forever and the registry does not grow with every campaign ever run. A finished campaign
        keeps its series (its final counts and budget stay graphable) until it is deleted."""
        for metric in self._per_campaign:
            for labels in _label_sets(metric):
                if labels and labels[0] == campaign:
                    metric.remove(*labels)
        for key in [k for k in self._tokens_shown if k[0] == campaign]:
            del self._tokens_shown[key]

    # --- HTTP ---------------------------------------------------------------------------------------

    def serve(self, host: str, port: int, healthy: Callable[[], tuple[bool, str]]) -> MetricsServer:
        """Start /metrics and /healthz on a daemon thread; `healthy` says whether the process still works."""
        server = MetricsServer(self, host, port, healthy)
        server.start()
        return server


def _label_sets(metric: Gauge | Counter | Histogram) -> Iterable[tuple[str, ...]]:
    # prometheus_client keeps no public list of children; its samples carry the label values.
    seen: set[tuple[str, ...]] = set()
    for family in metric.collect():
        for sample in family.samples:
            values = tuple(sample.labels[name] for name in metric._labelnames)
            if values not in seen:
                seen.add(values)
                yield values


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds are not news
        log.debug("http: " + format, *args)


class MetricsServer:
    def __init__(
        self, metrics: Metrics, host: str, port: int, healthy: Callable[[], tuple[bool, str]]
    ) -> None:
        self.metrics = metrics
        self.healthy = healthy
        self._server: WSGIServer = make_server(host, port, self._app, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def start(self) -> None:
        self._thread.start()
        log.info("metrics and health on port %d (/metrics, /healthz)", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [generate_latest(self.metrics.registry)]
        if path in ("/healthz", "/livez", "/readyz"):
            ok, detail = self.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{'ok' if ok else 'unhealthy'}: {detail}\n".encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]
