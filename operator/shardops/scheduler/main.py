"""`shardops operator`: metrics, leader election, then kopf, in that order; and a clean stop.

Only the leader runs kopf. A replica that loses the leadership stops kopf and exits non-zero, so
its pod restarts as a fresh standby (client-go's rule: never keep going after losing the lease).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import kopf

from shardops import API_GROUP, __version__
from shardops.api.names import KOPF_FINALIZER, OPERATOR_FIELD_MANAGER
from shardops.k8s.api import Kube
from shardops.scheduler.handlers import register
from shardops.scheduler.leader import LeaderElector
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.reconcile import Reconciler
from shardops.scheduler.settings import OperatorSettings
from shardops.scheduler.ticker import CampaignTicker

log = logging.getLogger(__name__)

# Exit codes: 0 stopped on request; 1 lost the leadership (restart as a standby).
EXIT_LOST_LEADERSHIP = 1


class LoopHeartbeat:
    """Ticks inside the event loop. A blocked loop (a sync call on it, a deadlock) stops the ticks,
    which /healthz and the leader renewals notice."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self.started = False
        self.last = time.monotonic()

    async def run(self) -> None:
        self.started = True
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(1.0)

    def age(self) -> float:
        return time.monotonic() - self.last if self.started else 0.0

    def healthy(self) -> bool:
        return self.age() < self.stall_seconds


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    # kopf's bookkeeping under our own prefix, so `kubectl get -o yaml` shows one vocabulary.
    configured.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    # No handler needs a finalizer (handlers.py); kopf would add this one only if one did. It stays
    # the name an earlier release used, so kopf, too, removes it where it finds it.
    configured.persistence.finalizer = KOPF_FINALIZER
    # The pool that runs every sync handler, and the periodic tick (ticker.py), sized explicitly:
    # kopf's default, ThreadPoolExecutor(), takes min(32, CPUs + 4) of the *node* (os.cpu_count()
    # ignores the pod's CPU limit), so the operator's concurrency would depend on where it lands.
    # What blocks a thread: a reconcile pass (its API calls, and the wait that spaces passes of one
    # campaign by min_reconcile_interval_seconds); the rest (a shard event or a tick for a campaign
    # whose pass is running, removing an old finalizer) takes a moment. Reconciler.kick runs one
    # pass per campaign at a time and hands later requests to it, and a campaign whose shards keep
    # changing keeps its thread, so the pool is about the number of campaigns reconciling at once.
    configured.execution.executor = ThreadPoolExecutor(
        max_workers=settings.reconcile_threads, thread_name_prefix="reconcile"
    )
    configured.execution.max_workers = settings.reconcile_threads
    # Logs stay logs: Events are ours and carry the transitions.
    configured.posting.enabled = False
    # Leadership is decided by our Lease (leader.py), not by kopf peering (kopf #734).
    configured.peering.standalone = True
    # Serve the CRDs present at start; no list/watch permission on all CRDs and namespaces needed.
    configured.scanning.disabled = True
    return configured


def run_operator(settings: OperatorSettings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.log_level.upper() != "DEBUG":
        # kopf logs every successful handler call at INFO: one line per tick per campaign.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    metrics = Metrics()
    # A connection for each reconcile thread and for a write alongside each (Dispatcher.alongside),
    # plus the leader election thread's and one spare.
    kube = Kube.from_environment(
        OPERATOR_FIELD_MANAGER, settings.kubeconfig, connections=2 * settings.reconcile_threads + 2
    )
    kube.observer = metrics.observe_api
    # The audit log records the user agent: it tells apart operator replicas sharing one service
    # account (which of them wrote, or released, the leader Lease).
    kube.api_client.user_agent = f"shardops-operator/{__version__} ({settings.identity})"
    heartbeat = LoopHeartbeat(settings.loop_stall_seconds)
    stop = threading.Event()
    outcome = {"code": 0}

    def lost() -> None:
        outcome["code"] = EXIT_LOST_LEADERSHIP
        stop.set()

    # One wall clock for this process (shifted only by fault injection: `skew`).
    wall = settings.wall_clock()
    elector = LeaderElector(kube, settings, metrics, loop_healthy=heartbeat.healthy, on_lost=lost, wall=wall)

    def healthy() -> tuple[bool, str]:
        metrics.loop_lag.set(heartbeat.age())
        if not heartbeat.healthy():
            return False, f"event loop blocked for {heartbeat.age():.0f}s"
        if settings.leader_election:
            return elector.health()
        return True, "leader election disabled"

    server = metrics.serve(settings.metrics_host, settings.metrics_port, healthy)
    election_stop = threading.Event()
    election = threading.Thread(
        target=elector.run, args=(election_stop,), name="leader-election", daemon=True
    )

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if settings.leader_election:
            election.start()
            log.info("standby: waiting to become the leader")
            while not stop.is_set() and not elector.became_leader.wait(0.5):
                pass
            is_leader, renewing = elector.is_leader, elector.renewing
        else:
            is_leader = renewing = lambda: True
        if stop.is_set():
            return outcome["code"]
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Every write of a pass (shard, Job, Lease revoke, Event, status), and every retry of one, is
        # sent only while this replica leads (leader.py, guard_write); the election keeps `kube`.
        passes = kube.guarded(elector.guard_write) if settings.leader_election else kube
        reconciler = Reconciler(passes, settings, metrics, is_leader=is_leader, renewing=renewing, clock=wall)
        sweeper = threading.Thread(
            target=_sweep_retention,
            args=(reconciler, settings, metrics, is_leader, stop),
            name="retention-sweep",
            daemon=True,
        )
        sweeper.start()
        configured = kopf_settings(settings)
        ticker = CampaignTicker(
            reconciler.kick,
            settings.tick_seconds,
            configured.execution.executor,
            outcome=lambda outcome: metrics.periodic_reconciles.labels(outcome=outcome).inc(),
        )
        sharing = threading.Thread(
            target=_share_sources,
            args=(reconciler, ticker, settings, is_leader, stop),
            name="source-sharing",
            daemon=True,
        )
        sharing.start()
        registry = kopf.OperatorRegistry()
        register(registry, settings, reconciler, ticker)
        asyncio.run(_serve(registry, configured, settings, stop, heartbeat, ticker))
        return outcome["code"]
    finally:
        election_stop.set()
        if outcome["code"] == 0:
            elector.release()
        server.stop()


def _sweep_retention(
    reconciler: Reconciler,
    settings: OperatorSettings,
    metrics: Metrics,
    is_leader: Callable[[], bool],
    stop: threading.Event,
) -> None:
    """Every retention_sweep_seconds, on the leader: delete results past their retention
    (retention.py). Its own thread, so a long sweep never holds a reconcile worker."""
    while not stop.wait(settings.retention_sweep_seconds):
        if not is_leader():
            continue
        try:
            deleted = reconciler.retention.sweep(reconciler.clock())
        except Exception:
            log.exception("retention sweep failed; the next one retries")
            continue
        if deleted:
            metrics.retention_deleted.inc(deleted)


def _share_sources(
    reconciler: Reconciler,
    ticker: CampaignTicker,
    settings: OperatorSettings,
    is_leader: Callable[[], bool],
    stop: threading.Event,
) -> None:
    """Every tick, on the leader: hand out the shared Sources' limits (scheduler/sources.py); each
    campaign's own pass writes its share. Its own thread: a pass reads one object per Source."""
    while not stop.wait(settings.tick_seconds):
        if not is_leader():
            continue
        try:
            reconciler.sharing.run(ticker.known(), reconciler.clock())
        except Exception:
            log.exception("sharing the Sources' limits failed; the next pass retries")


async def _serve(
    registry: kopf.OperatorRegistry,
    configured: kopf.OperatorSettings,
    settings: OperatorSettings,
    stop: threading.Event,
    heartbeat: LoopHeartbeat,
    ticker: CampaignTicker,
) -> None:
    beat = asyncio.create_task(heartbeat.run())
    try:
        await kopf.operator(
            registry=registry,
            settings=configured,
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            stop_flag=stop,
        )
    finally:
        beat.cancel()
        await ticker.stop()
        # kopf waits for a threading.Event stop flag in an executor thread; when kopf stopped for
        # another reason (its own SIGTERM handler), that thread must be released or the loop never closes.
        stop.set()
