"""What Kueue says of a campaign's suspended worker Jobs: whether their LocalQueue exists, and the
message of each one's Workload (why it is not admitted yet).

Kueue admits a Job labelled kueue.x-k8s.io/queue-name by unsuspending it; until then the Job has no
pod, which the planner must read as waiting for quota, not as a worker that cannot start
(`state.workers.worker_counts`). Read only while a worker Job is suspended: one get of the LocalQueue
and one list of the Workloads of those Jobs (by their UIDs), at most maxConcurrency of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardops.api.common import JSON
from shardops.api.names import KUEUE_QUEUE_LABEL
from shardops.k8s.api import Forbidden, KubeClient, NotFound, Resource
from shardops.logic.queues import QueueState

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOADS = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads")
LOCAL_QUEUES = Resource(KUEUE_GROUP, KUEUE_VERSION, "localqueues")
# Kueue's label on a Workload: the UID of the Job it stands for.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# The Workload conditions that say why it is not admitted, the first found speaking.
_WAITING_CONDITIONS = ("QuotaReserved", "Admitted")


def suspended(job: JSON) -> bool:
    """A Job held with spec.suspend (Kueue's webhook sets it on a Job labelled with a queue)."""
    return bool((job.get("spec") or {}).get("suspend"))


def queue_of(job: JSON) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)


def workload_message(workload: JSON) -> str | None:
    """Why Kueue has not admitted `workload`, in its words ("couldn't assign flavors to pod set
    main: insufficient quota for pods in flavor default, ..."), or None when it says nothing."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in _WAITING_CONDITIONS:
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "False" and condition.get("message"):
            return str(condition["message"])
    return None


def queue_state(kube: KubeClient, namespace: str, jobs: Sequence[JSON]) -> QueueState | None:
    """The state of the queue the campaign's suspended Jobs wait in; None when none is suspended
    with a queue label (nothing to ask Kueue)."""
    waiting = [job for job in jobs if suspended(job) and queue_of(job)]
    if not waiting:
        return None
    name = str(queue_of(waiting[0]))
    try:
        kube.get(LOCAL_QUEUES, namespace, name)
    except NotFound as missing:
        # A missing object is a Status naming its kind; a missing API (no Kueue) is a bare 404.
        installed = (missing.body.get("details") or {}).get("kind") == LOCAL_QUEUES.plural
        return QueueState(name, exists=False, kueue_installed=installed)
    except Forbidden:
        pass  # the operator may not read LocalQueues: the Workloads may still say why
    uids = ",".join(str((job.get("metadata") or {}).get("uid")) for job in waiting)
    try:
        workloads = kube.list(WORKLOADS, namespace, label_selector=f"{JOB_UID_LABEL} in ({uids})")
    except (Forbidden, NotFound):
        return QueueState(name)
    by_uid = {str((job.get("metadata") or {}).get("uid")): job for job in waiting}
    messages: dict[str, str] = {}
    for workload in workloads:
        job = by_uid.get(((workload.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL, ""))
        message = workload_message(workload)
        if job is not None and message is not None:
            messages[str(job["metadata"]["name"])] = message
    return QueueState(name, messages=messages)
