"""What Kueue says of the queue a campaign's suspended worker Jobs wait in (read by
`k8s.kueue.queue_state`), as `state.workers.worker_counts` turns it into the planner's inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueueState:
    """The LocalQueue the suspended worker Jobs wait in. `exists` False: no LocalQueue of that name
    in the namespace (or no Kueue at all: `kueue_installed` False). `messages`: Job name -> the
    message of its Workload's QuotaReserved (or Admitted) condition, for the Jobs Kueue has said
    something of; empty when the operator may not read Workloads."""

    name: str
    exists: bool = True
    kueue_installed: bool = True
    messages: Mapping[str, str] = field(default_factory=dict)
