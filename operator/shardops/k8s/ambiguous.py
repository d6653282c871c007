"""Writes whose answer was lost: re-read, and recognise our own write.

A write can be applied and still be answered with an error: a 504 after etcd committed it, a read
timeout, a connection reset. Its retry (`Kube.request` retries server errors) then meets the write
itself — 409 at the old resourceVersion, or AlreadyExists for a create. Taken at its word, such an
answer reads as a lost race, and the writer walks away from a claim it holds or calls itself fenced
after its own Done. So every write of the claim protocol (a Lease create, takeover or release; a
shard transition: claim, complete, fail, release, reclaim) goes through `write_recognised`: on an
answer that leaves the outcome open, it re-reads the object once and asks whether it shows this
writer's write — by owner and fencing token (a Lease's holderIdentity and leaseTransitions, a
shard's owner and fencingToken), and for a shard transition by the very history entry it added
(owner, reason, attempt, time). Recognised, the write counts as answered; not, the error stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import urllib3

from shardops.k8s.api import ApiError

log = logging.getLogger(__name__)
T = TypeVar("T")


def may_have_applied(error: BaseException) -> bool:
    """A write that ended with `error` may have been applied all the same: no answer came (timeout,
    connection error), the server answered with an error of its own (5xx), or the error is the
    answer to a retry of a try that did (`ApiError.ambiguous`)."""
    if isinstance(error, ApiError):
        return error.ambiguous or error.status >= 500 or error.status == 0
    return isinstance(error, (urllib3.exceptions.HTTPError, OSError))


def write_recognised(write: Callable[[], T], reread: Callable[[], T | None], what: str) -> T:
    """`write()`; when it fails in a way that leaves its outcome open, `reread()` looks at the object
    as it is now and returns what the write would have returned if it shows our write, else None —
    then the write's own error is raised. Errors of the re-read itself propagate (NotFound: the object
    is gone)."""
    try:
        return write()
    except Exception as error:
        if not may_have_applied(error):
            raise
        found = reread()
        if found is None:
            raise
        log.info("%s: answered %s, but the object shows our write: it was applied", what, error)
        return found
