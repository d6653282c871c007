"""k8s.kueue: what Kueue says of a campaign's suspended worker Jobs, read as the operator's role allows."""

from __future__ import annotations

from shardops.api.common import JSON
from shardops.k8s import kueue
from shardops.k8s.api import Forbidden
from shardops.logic.queues import QueueState
from tests.fakekube import Call, FakeKube

NS = "team-a"


def _job(name: str, uid: str, *, suspend: bool, queue: str | None = "lq") -> JSON:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"metadata": {"name": name, "uid": uid, "labels": labels}, "spec": {"suspend": suspend}}


def _workload(job_uid: str, message: str, kind: str = "QuotaReserved") -> JSON:
    return {
        "metadata": {
            "name": f"job-{job_uid}",
            "namespace": NS,
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
        },
        "status": {
            "conditions": [{"type": kind, "status": "False", "reason": "Pending", "message": message}]
        },
    }


def _local_queue(name: str) -> JSON:
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"clusterQueue": "cq"}}


def test_nothing_is_asked_of_kueue_while_no_job_is_held() -> None:
    kube = FakeKube()
    jobs = [_job("w-1", "u1", suspend=False), _job("w-2", "u2", suspend=True, queue=None)]
    assert kueue.queue_state(kube, NS, jobs) is None
    assert kube.calls == []


def test_each_held_job_gets_its_own_workloads_message_in_one_list() -> None:
    kube = FakeKube()
    kube.add(kueue.LOCAL_QUEUES, _local_queue("lq"))
    kube.add(kueue.WORKLOADS, _workload("u2", "insufficient quota for pods in flavor default"))
    kube.add(kueue.WORKLOADS, _workload("u3", "waiting for admission checks", kind="Admitted"))
    kube.add(kueue.WORKLOADS, _workload("other", "another Job's workload"))
    jobs = [
        _job("w-1", "u1", suspend=False),
        _job("w-2", "u2", suspend=True),
        _job("w-3", "u3", suspend=True),
    ]
    state = kueue.queue_state(kube, NS, jobs)
    assert state == QueueState(
        "lq",
        messages={
            "w-2": "insufficient quota for pods in flavor default",
            "w-3": "waiting for admission checks",
        },
    )
    assert [(call.method, call.plural) for call in kube.calls] == [
        ("GET", "localqueues"),
        ("LIST", "workloads"),
    ]


def test_a_missing_local_queue_is_told_from_a_missing_kueue() -> None:
    kube = FakeKube()
    held = [_job("w-1", "u1", suspend=True, queue="nope")]
    assert kueue.queue_state(kube, NS, held) == QueueState("nope", exists=False)


def test_a_role_that_may_not_read_kueue_still_says_the_jobs_wait() -> None:
    def forbid(call: Call) -> BaseException | None:
        return Forbidden(403, "Forbidden", "no") if call.plural in {"localqueues", "workloads"} else None

    kube = FakeKube(fail=forbid)
    assert kueue.queue_state(kube, NS, [_job("w-1", "u1", suspend=True)]) == QueueState("lq")
