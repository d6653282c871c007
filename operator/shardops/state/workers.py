"""Worker Jobs and their pods as the planner counts them, with the recent worker failures."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from shardops.api.common import JSON
from shardops.api.names import WORKER_NUMBER_ANNOTATION, WORKER_SLOTS_ANNOTATION
from shardops.k8s.kueue import suspended
from shardops.k8s.leases import parse_time
from shardops.logic.backpressure import WORKER_FAILURE_WINDOW, WorkerFailures
from shardops.logic.planner import WorkerCounts
from shardops.logic.queues import QueueState

# FailureTarget and SuccessCriteriaMet come before Failed and Complete: the pod is done already.
_JOB_DONE = frozenset({"Complete", "Failed", "FailureTarget", "SuccessCriteriaMet"})


def _job_finished(job: JSON) -> bool:
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return True
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in _JOB_DONE:
            return True
    return False


# Container waiting reasons a kubelet keeps reporting while it cannot start a container and retries:
# each names what is wrong (a missing Secret or key, an image it cannot pull or parse, a command that
# exits at once), and a new worker would not start either. Not ContainerCreating or PodInitializing:
# those are a start under way.
CANNOT_START_REASONS = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)
# A Job controller's FailedCreate saying the namespace's ResourceQuota has no room: the cluster (for
# this namespace) is full. Any other refusal (admission, a missing ServiceAccount) is a failing worker.
QUOTA_REFUSAL = "exceeded quota"


def _name(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("name") or "?")


def cannot_start(pod: JSON) -> str | None:
    """The first container of `pod` the kubelet cannot start, with the kubelet's reason and message
    ("pod P: container worker: CreateContainerConfigError: secret 's3' not found"); None if none."""
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in CANNOT_START_REASONS:
            message = waiting.get("message")
            text = f"pod {_name(pod)}: container {container.get('name')}: {reason}"
            return f"{text}: {message}" if message else text
    return None


def _scheduler_says(pod: JSON) -> str | None:
    """Why the scheduler does not place `pod`, in its words (PodScheduled=False), or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message")
            text = f"pod {_name(pod)}: {condition.get('reason') or 'not scheduled'}"
            return f"{text}: {message}" if message else text
    return None


def _pod_stuck(pod: JSON, now: dt.datetime, grace: dt.timedelta) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or cannot_start(pod) is not None:
        return False
    for condition in status.get("conditions") or []:
        scheduled = condition.get("type") == "PodScheduled" and condition.get("status") == "False"
        if scheduled and condition.get("reason") == "Unschedulable":
            return True
    created = _created(pod)
    return created is not None and now - created >= grace


def _created(obj: JSON) -> dt.datetime | None:
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


def _job_of(pod: JSON) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")


def podless_jobs(
    jobs: Sequence[JSON], pods: Sequence[JSON], now: dt.datetime, grace: dt.timedelta
) -> list[str]:
    """Alive worker Jobs that got no pod within `grace`: the ones whose FailedCreate Events say why
    (`k8s.jobs.failed_creates`). A Job gets its pod within a second unless it is refused, or held
    suspended (by Kueue: its queue has no quota yet), which is no refusal."""
    with_pods = {_job_of(p) for p in pods}
    names = []
    for job in jobs:
        created = _created(job)
        if _job_finished(job) or suspended(job) or _name(job) in with_pods:
            continue
        if created is None or now - created < grace:
            continue
        names.append(_name(job))
    return names


def next_worker_number(jobs: Sequence[JSON]) -> int:
    """The number of the campaign's next worker Job: one more than the highest of the Jobs listed
    (any owner: a deleted campaign's Jobs keep their names until the garbage collector takes them),
    1 when there are none. A number comes back only once no Job with it exists any more (finished
    Jobs go after their TTL). Jobs without the annotation (named by generateName) count as 0."""
    numbers = [0]
    for job in jobs:
        value = ((job.get("metadata") or {}).get("annotations") or {}).get(WORKER_NUMBER_ANNOTATION)
        if isinstance(value, str) and value.isdigit():
            numbers.append(int(value))
    return max(numbers) + 1


def job_slots(job: JSON) -> int:
    """The slots of a worker Job's pod (its annotation); 1 without one (Jobs of earlier releases)."""
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(WORKER_SLOTS_ANNOTATION)
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else 1


def worker_counts(
    jobs: Sequence[JSON],
    pods: Sequence[JSON],
    now: dt.datetime,
    pending_grace: dt.timedelta,
    refusals: Mapping[str, str] | None = None,
    queue: QueueState | None = None,
) -> WorkerCounts:
    """Jobs not finished count as alive (their pod may still be starting). Pods stuck Pending say the
    cluster has no room for more; so does a Job that got no pod at all within the grace (its pods are
    refused: quota, admission, a missing ServiceAccount). Failed Jobs are the planner's
    WorkersFailing hold; so is a pod the kubelet cannot start, or a Job whose pods are refused for
    anything but quota.

    `refusals`: Job name -> the message of its Job controller's FailedCreate event (`k8s.jobs.
    pod_refusals`), for the alive Jobs without a pod. Bounded like the rest: the campaign's worker
    Jobs and pods, at most maxConcurrency alive.

    A suspended Job (Kueue holds it until its queue has quota: `queue`, `k8s.kueue.queue_state`) is
    neither stuck nor failing: it waits for quota, or for its LocalQueue to exist."""
    refusals = refusals or {}
    alive_jobs = [job for job in jobs if not _job_finished(job)]
    live_pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    running = sum(1 for p in live_pods if (p.get("status") or {}).get("phase") == "Running")
    stuck_pods = [p for p in live_pods if _pod_stuck(p, now, pending_grace)]
    stuck = len(stuck_pods)
    # The scheduler's or the quota's words where there are any: they say what to change.
    said = [text for pod in stuck_pods if (text := _scheduler_says(pod)) is not None]
    problems = [problem for p in live_pods if (problem := cannot_start(p)) is not None]
    with_pods = {_job_of(p) for p in pods}
    held = [job for job in alive_jobs if suspended(job)]
    for job in alive_jobs:
        name = _name(job)
        if name in with_pods or suspended(job):
            continue
        refusal = refusals.get(name)
        if refusal is not None and QUOTA_REFUSAL not in refusal:
            problems.append(f"Job {name}: FailedCreate: {refusal}")
            continue
        created = _created(job)
        if refusal is not None or (created and now - created >= pending_grace):
            stuck += 1
            if refusal is not None:
                said.append(f"Job {name}: FailedCreate: {refusal}")
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return WorkerCounts(
        alive_jobs=len(alive_jobs),
        alive_slots=sum(job_slots(job) for job in alive_jobs),
        running_pods=running,
        stuck_pending_pods=stuck,
        recent_failures=worker_failures(jobs, now),
        cannot_start=f"{problems[0]}{more}" if problems else None,
        stuck_detail=said[0] if said else None,
        queued_jobs=len(held),
        queue_wait=_queue_wait(held, queue) if held else None,
        queue_missing=_queue_missing(queue) if held and queue is not None else None,
    )


def _queue_wait(held: Sequence[JSON], queue: QueueState | None) -> str:
    """`2 worker Job(s) wait for quota in LocalQueue team-a: Kueue: couldn't assign flavors ...`."""
    where = f" in LocalQueue {queue.name}" if queue is not None else ""
    text = f"{len(held)} worker Job(s) wait for quota{where}"
    said = [queue.messages[_name(job)] for job in held if queue is not None and _name(job) in queue.messages]
    return f"{text}: Kueue: {said[0]}" if said else text


def _queue_missing(queue: QueueState) -> str | None:
    """What to fix when the worker Jobs' queue does not exist; None when it does."""
    if queue.exists:
        return None
    if not queue.kueue_installed:
        return (
            f"spec.worker.queueName {queue.name}: Kueue is not installed in this cluster (no "
            "kueue.x-k8s.io API): install Kueue, or remove spec.worker.queueName"
        )
    return (
        f"spec.worker.queueName {queue.name}: no LocalQueue {queue.name} in this namespace, so Kueue "
        "admits none of the worker Jobs: create it (a kueue.x-k8s.io LocalQueue naming a ClusterQueue), "
        "or set spec.worker.queueName to an existing one"
    )


def worker_failures(jobs: Sequence[JSON], now: dt.datetime) -> WorkerFailures:
    """Worker Jobs that failed within the window, the newest one's time and reason."""
    failed: list[tuple[dt.datetime, str]] = []
    for job in jobs:
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("type") != "Failed" or condition.get("status") != "True":
                continue
            at = parse_time(condition.get("lastTransitionTime"))
            if at is not None and now - at <= WORKER_FAILURE_WINDOW:
                name = (job.get("metadata") or {}).get("name")
                failed.append((at, f"{name}: {condition.get('reason')}: {condition.get('message', '')}"))
    if not failed:
        return WorkerFailures(0, None, "")
    last_at, last_reason = max(failed)
    return WorkerFailures(len(failed), last_at, last_reason)
