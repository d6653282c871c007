"""The worker runtime's own Prometheus figures, on a registry of its own, and the /metrics endpoint.

What the operator exports (scheduler/metrics.py) is what it sees on the objects: shards by phase,
claims in shard history. What only a worker sees is here: the claims it lost to another worker, the
looks for work that found none, heartbeats that failed and were retried, how long the user's
command ran and how many processes of it were started, and the writes the API server refused
because the claim was no longer ours (fencing).

Every metric carries `campaign` as `<namespace>/<name>`, the operator's spelling, so one dashboard
variable selects both. Label values come from bounded sets only (outcomes, fence reasons, shard
classes, error classes): never a shard or pod name. Prometheus adds `pod` and `namespace` from the
scrape; each worker pod is its own series, so queries `sum by (campaign, ...)`.

A worker is a short-lived Job pod, so its figures are pulled while it runs (a PodMonitor selects
worker pods; see docs/observability.md) and, at exit, `MetricsEndpoint.linger` keeps serving until
one scrape has read the final figures, bounded by SHARDOPS_METRICS_LINGER_SECONDS. What can still
be lost is said there.

The registry is made by `WorkerMetrics(...)`, never at import: tests and several workers in one
process (the unit tests) each count their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app

from shardops.api.enums import ShardClass

log = logging.getLogger(__name__)

# User commands run for seconds (a scrape) to an hour (a batch of LLM calls): buckets span both.
COMMAND_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
METRICS_PATH = "/metrics"


class ClaimOutcome(StrEnum):
    # The Lease and the status patch were ours: the shard is claimed.
    WON = "won"
    # Another worker (or the operator) was faster on that candidate: its Lease or its status moved.
    LOST = "lost"
    # A look for work that found no claimable shard at all.
    NONE = "none"


class HeartbeatOutcome(StrEnum):
    OK = "ok"
    # A transient API or store error: retried shortly, the claim kept.
    FAILED = "failed"
    # Refused: the claim is not ours any more (see shardops_worker_fenced_total for why).
    FENCED = "fenced"


class CommandMode(StrEnum):
    # A process started for one shard (the default).
    PER_SHARD = "per-shard"
    # A process of a persistent command (spec.worker.persistent), serving shards until it ends.
    PERSISTENT = "persistent"


class CommandOutcome(StrEnum):
    # Exit 0 with a result for every item.
    SUCCEEDED = "succeeded"
    # Anything else the command caused: a non-zero exit, bad output, over the per-shard budget, a
    # result over the size cap.
    FAILED = "failed"
    # The worker was asked to stop (SIGTERM) and stopped the command.
    STOPPED = "stopped"
    # The claim was lost mid-run: the command was killed, its results thrown away.
    FENCED = "fenced"
    # The worker broke off for trouble of its own or of the API server.
    ERROR = "error"


class WorkerMetrics:
    """Every shardops_worker_ metric of one worker process (one campaign), with `observe_*` helpers.

    New figures of the worker (for example of a built-in command) go here as another metric and
    another `observe_*` method, so the names stay in one registry the dashboard test reads."""

    def __init__(self, campaign: str) -> None:
        self.campaign = campaign
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.claims = Counter(
            "shardops_worker_claims",
            "Claim attempts by outcome: won, lost (another worker was faster on that shard), or none "
            "(a look for work that found no claimable shard).",
            ["campaign", "outcome"],
            registry=r,
        )
        self.heartbeats = Counter(
            "shardops_worker_heartbeats",
            "Heartbeats of claimed shards (Lease renewal and status patch) by outcome: ok, failed "
            "(transient, retried) or fenced (refused).",
            ["campaign", "outcome"],
            registry=r,
        )
        self.command_seconds = Histogram(
            "shardops_worker_command_duration_seconds",
            "Run time of the user's command for one attempt, by shard class and outcome.",
            ["campaign", "shard_class", "outcome"],
            buckets=COMMAND_BUCKETS,
            registry=r,
        )
        self.command_starts = Counter(
            "shardops_worker_command_starts",
            "Processes of the user's command started, by mode: per-shard (one per attempt) or "
            "persistent (one serves shard after shard; a new one after a crash, a stop or a change of "
            "command or environment). Against shards per second: what starting the command costs.",
            ["campaign", "mode"],
            registry=r,
        )
        self.fenced = Counter(
            "shardops_worker_fenced",
            "Shard runs stopped because the claim was no longer this worker's, by what showed it: "
            "lease (renewal refused), shard (status names another holder), deleted, or expired (the "
            "lease ran out while the API server was unreachable). Nothing more was written.",
            ["campaign", "reason"],
            registry=r,
        )
        self.shards = Counter(
            "shardops_worker_shards",
            "Claimed shards by how this worker's run ended (done, reused, failed, released, fenced, "
            "abandoned), by shard class, and by error class for failed ones.",
            ["campaign", "shard_class", "outcome", "error_class"],
            registry=r,
        )
        # Series that exist from the start read 0 at the first scrape instead of appearing later
        # with a value: Prometheus' rate() counts an increase only between two samples of a series.
        for claim in ClaimOutcome:
            self.claims.labels(campaign, claim)
        for beat in HeartbeatOutcome:
            self.heartbeats.labels(campaign, beat)
        for mode in CommandMode:
            self.command_starts.labels(campaign, mode)

    # --- recording -----------------------------------------------------------------------------------

    def observe_claim(self, outcome: ClaimOutcome) -> None:
        self.claims.labels(self.campaign, outcome).inc()

    def observe_heartbeat(self, outcome: HeartbeatOutcome) -> None:
        self.heartbeats.labels(self.campaign, outcome).inc()

    def observe_command(self, shard_class: ShardClass, outcome: CommandOutcome, seconds: float) -> None:
        self.command_seconds.labels(self.campaign, shard_class, outcome).observe(max(seconds, 0.0))

    def observe_command_start(self, mode: CommandMode) -> None:
        self.command_starts.labels(self.campaign, mode).inc()

    def observe_fenced(self, reason: str) -> None:
        self.fenced.labels(self.campaign, reason).inc()

    def observe_shard(self, shard_class: ShardClass, outcome: str, error_class: str | None = None) -> None:
        self.shards.labels(self.campaign, shard_class, outcome, error_class or "").inc()

    def sample(self, name: str, **labels: str) -> float:
        """One sample's value (0 when absent), as a scrape would read it: for tests and the report."""
        value = self.registry.get_sample_value(name, {"campaign": self.campaign, **labels})
        return value or 0.0

    # --- HTTP ------------------------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> MetricsEndpoint:
        """Start /metrics on a daemon thread (port 0: a free one)."""
        endpoint = MetricsEndpoint(self.registry, host, port)
        endpoint.start()
        return endpoint


class MetricsEndpoint:
    """/metrics of one worker. It knows which scrapes it has answered in full, so that a worker about
    to exit can wait for one scrape of its final figures (`linger`).

    One request at a time (wsgiref's server is not threaded): scrapes are numbered as they begin,
    and the number of the last one answered tells whether it began after a given moment."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._lock = threading.Condition()
        self._begun = 0
        self._answered = 0
        metrics_app = make_wsgi_app(registry)
        endpoint = self

        class Handler(WSGIRequestHandler):
            def handle(self) -> None:
                super().handle()
                # Only now is the response written and flushed: the scraper has the figures.
                if getattr(self, "path", "").split("?", 1)[0] == METRICS_PATH:
                    endpoint._scrape_answered()

            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
                log.debug("http: " + format, *args)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == METRICS_PATH:
                endpoint._scrape_begins()
                body: Iterable[bytes] = metrics_app(environ, start_response)
                return body
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]

        self._server: WSGIServer = make_server(host, port, app, handler_class=Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="worker-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def scrapes(self) -> int:
        """Scrapes answered in full so far."""
        with self._lock:
            return self._answered

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _scrape_begins(self) -> None:
        with self._lock:
            self._begun += 1

    def _scrape_answered(self) -> None:
        with self._lock:
            # Requests are served one by one: the one answered now is the last one begun.
            self._answered = self._begun
            self._lock.notify_all()

    def linger(self, seconds: float, stop: threading.Event, tick: float = 0.2) -> bool:
        """Keep serving until a scrape that began after this call has been answered, at most
        `seconds`, or until `stop` is set (SIGTERM: the pod is going). True when that scrape came.

        Called after the worker's last change, so that scrape read the final figures (one already
        under way may have read the registry before them, so it does not count)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            before = self._begun
            while self._answered <= before:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                # A Condition cannot also wait on the stop Event: look at it every tick.
                self._lock.wait(min(left, tick))
            return True
