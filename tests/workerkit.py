"""Builders for worker and result-store tests: a campaign and its shards in Pending, as the operator
makes them, stored in the in-memory API server (`fakekube.FakeKube`)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardops.api.common import JSON
from shardops.api.names import CAMPAIGN_LABEL
from shardops.api.shard import Shard
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.idempotency import idempotency_key
from shardops.logic.leases import Renewals
from shardops.logic.transitions import Action
from shardops.worker.clocks import SystemClock
from shardops.worker.runtime import Worker
from shardops.worker.settings import WorkerSettings
from tests.fakekube import FakeKube

# --- builders -------------------------------------------------------------------------------------

NAMESPACE = "ns"
OPERATOR = Actor("shardops.dev/operator", "test")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def campaign_body(name: str = "camp", items: list[JSON] | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "shardops.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": name},
        "spec": {
            "items": items if items is not None else [{"id": i} for i in range(4)],
            "shardSize": 2,
            "leaseSeconds": 10,
            "heartbeatSeconds": 1,
            "idleSeconds": 0,
            "worker": {"image": "x", "command": ["true"]},
            **spec,
        },
    }


def add_campaign(kube: FakeKube, body: JSON) -> list[Shard]:
    """The Campaign and its shards in Pending, as the operator makes them."""
    kube.put(CAMPAIGNS, NAMESPACE, body)
    name = body["metadata"]["name"]
    size = body["spec"]["shardSize"]
    items = body["spec"]["items"]
    command = body["spec"]["worker"]["command"]
    shards = []
    for index, start in enumerate(range(0, len(items), size)):
        part = items[start : start + size]
        created = kube.put(
            SHARDS,
            NAMESPACE,
            {
                "apiVersion": "shardops.dev/v1alpha1",
                "kind": "Shard",
                "metadata": {"name": f"{name}-{index:05d}", "labels": {CAMPAIGN_LABEL: name}},
                "spec": {
                    "campaign": name,
                    "index": index,
                    "items": part,
                    "itemRange": {"start": start, "end": start + len(part)},
                    "idempotencyKey": idempotency_key(name, part, command),
                },
            },
        )
        shards.append(
            apply_transition(
                kube,  # type: ignore[arg-type]
                Shard.parse(created),
                TransitionRequest(Action.MATERIALIZE, "test"),
                OPERATOR,
                T0,
            )
        )
    # The operator records how many shards it cut: workers list only the unfinished ones.
    recorded = kube.obj(CAMPAIGNS, NAMESPACE, name)
    assert recorded is not None
    status = {**(recorded.get("status") or {}), "cutShards": len(shards)}
    kube.put(CAMPAIGNS, NAMESPACE, {**recorded, "status": status})
    return shards


def held_by_another(
    kube: FakeKube, shard: Shard, now: dt.datetime, monotonic: Callable[[], float] = time.monotonic
) -> None:
    """`shard`'s Lease, held by another worker for 10 s from `now`."""
    held = leases.acquire(
        kube,  # type: ignore[arg-type]
        NAMESPACE,
        shard.lease_name,
        "another-worker",
        10,
        now,
        seen=Renewals(monotonic),
    )
    assert held is not None


# --- workers ----------------------------------------------------------------------------------------


def worker_settings(tmp_path: Path, **overrides: Any) -> WorkerSettings:
    """A worker under test: ticks and polls of 10 ms, no idle wait, attempt files under tmp_path."""
    values: dict[str, Any] = {
        "namespace": NAMESPACE,
        "pod_name": "w",
        "tick_seconds": 0.01,
        "poll_seconds": 0.01,
        "idle_seconds": 0,
        "work_dir": tmp_path,
        **overrides,
    }
    return WorkerSettings(**values)


def worker(kube: FakeKube, tmp_path: Path, campaign: str = "camp", **overrides: Any) -> Worker:
    """A Worker of `campaign` on the in-memory API server; `looks`, `clock` and `stop` go to the
    Worker, everything else to its settings (`worker_settings`)."""
    parts = {key: overrides.pop(key) for key in ("observer", "clock", "stop") if key in overrides}
    return Worker(
        kube=kube,  # type: ignore[arg-type]
        settings=worker_settings(tmp_path, **overrides),
        namespace=NAMESPACE,
        campaign_name=campaign,
        **parts,
    )


class ShiftedClock(SystemClock):
    """The system's clocks, moved forward on demand: a test lets a lease duration pass at once."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def now(self) -> dt.datetime:
        return super().now() + dt.timedelta(seconds=self.offset)

    def monotonic(self) -> float:
        return super().monotonic() + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds


def watching_worker(kube: FakeKube, tmp_path: Path, seconds: float, **overrides: Any) -> Worker:
    """A worker (`worker`) that has looked once and then watched its campaign's claims for `seconds`
    on its own clock: zombies are judged by how long a worker has not seen them renewed."""
    clock = ShiftedClock()
    runner = worker(kube, tmp_path, clock=clock, **overrides)
    assert runner._step() is None, "the first look must find nothing to do"
    clock.skip(seconds)
    return runner


def process_gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def stop_after_first_result(worker: Worker, work_dir: Path, seconds: float = 20) -> None:
    """In a thread: ask `worker` to stop (as SIGTERM does) once its command wrote a first result line
    under `work_dir`."""

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(p.read_text() for p in work_dir.glob("*/results.jsonl")):
                worker.stop.set()
                return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
