"""`shardops worker --campaign NAME`: wire settings, API client, signals and logs to the loop."""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from shardops import __version__
from shardops.api.names import WORKER_FIELD_MANAGER
from shardops.k8s.api import Kube
from shardops.worker.clocks import SystemClock
from shardops.worker.logs import emit
from shardops.worker.metrics import METRICS_PATH, MetricsEndpoint, WorkerMetrics
from shardops.worker.observed import WatchedObserver, Watches
from shardops.worker.runtime import Worker
from shardops.worker.settings import WorkerSettings
from shardops.worker.slots import SlotGroup, run_slots


class JsonFormatter(logging.Formatter):
    """One JSON object per line: pod logs stay greppable and tests can read them back."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The kubernetes client logs every retry of urllib3 at WARNING; Kube.request reports what matters.
    logging.getLogger("urllib3").setLevel(logging.ERROR)


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM (pod deletion, eviction) and SIGINT ask for a graceful stop: no new claims, the
    running command gets SIGTERM, partial results are flushed and the shard is released."""

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("shardops.worker").info(
            "stop requested", extra={"fields": {"event": "signal", "signal": signal.Signals(signum).name}}
        )
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def run_worker(settings: WorkerSettings, campaign: str) -> int:
    setup_logging(settings.log_level)
    stop = threading.Event()
    install_signal_handlers(stop)
    # A connection for each slot and each of the two watches, which hold theirs open.
    kube = Kube.from_environment(WORKER_FIELD_MANAGER, connections=settings.slots + 2)
    # The audit log records the user agent: it tells apart workers sharing one service account.
    kube.api_client.user_agent = f"shardops-worker/{__version__} ({settings.identity})"
    namespace = settings.resolved_namespace()
    # What the slots share: one start, one API client, one pair of watches, one metrics registry.
    # Labelled as the operator labels its campaign metrics, so one dashboard variable fits both.
    group = SlotGroup(WorkerMetrics(f"{namespace}/{campaign}"))
    watches = Watches(kube, namespace, campaign) if settings.watch else None
    clock = SystemClock(settings.wall_clock())
    slots = [
        Worker(
            kube=kube,
            settings=settings,
            namespace=namespace,
            campaign_name=campaign,
            stop=stop,
            slot=slot,
            group=group,
            observer=WatchedObserver(kube, namespace, campaign, watches) if watches is not None else None,
            clock=clock,
        )
        for slot in range(settings.slots)
    ]
    try:
        if settings.metrics_port is None:
            return run_slots(slots)
        endpoint = group.metrics.serve(settings.metrics_host, settings.metrics_port)
        emit("metrics-serving", port=endpoint.port, path=METRICS_PATH)
        try:
            code = run_slots(slots)
            linger(endpoint, settings.metrics_linger_seconds, stop)
            return code
        finally:
            endpoint.stop()
    finally:
        if watches is not None:
            watches.close()


def linger(endpoint: MetricsEndpoint, seconds: float, stop: threading.Event) -> None:
    """A worker pod may end between two scrapes: wait for one scrape of the final figures."""
    if seconds <= 0 or stop.is_set():
        return
    emit("metrics-lingering", seconds=seconds, scrapes=endpoint.scrapes)
    scraped = endpoint.linger(seconds, stop)
    emit("metrics-final", scraped=scraped, scrapes=endpoint.scrapes)
