"""A watch-fed copy of a bounded set of objects: client-go's reflector and store, in small.

An `Informer` lists the objects its query selects, then follows the API server's watch from the
version of that list, in a thread of its own, so a reader has the current set at no request. When
the watch ends (the server closes it after `watch_seconds`) it goes on from the last version seen;
when that version is too old (410 Gone) or the API server is unreachable it lists again. The copy
may lag the API server by the time an event takes to arrive: whoever writes from it writes with a
resourceVersion precondition (a stale copy then costs a conflict, never a wrong write), and a
decision that cannot be taken back (a worker exiting) is confirmed by a fresh read first.

What it holds is bounded by its query: every user says in its own code why that set is bounded
(a worker watches one Campaign by name and its campaign's unfinished Shards: the window).

Readers wait for a change with `Changes`: one counter for several informers, advanced only by the
changes a reader cares about (`matters`), so a heartbeat of a running shard wakes nobody.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from shardops.api.common import JSON
from shardops.k8s.api import Forbidden, Gone, KubeClient, Resource, WatchEvent

log = logging.getLogger(__name__)

# How long one watch request lasts before the server ends it and the informer starts the next.
WATCH_SECONDS = 240
# After API trouble, the informer lists again this long after (more after Forbidden: RBAC
# without watch is a configuration that waiting does not fix soon).
RETRY_SECONDS = 1.0
FORBIDDEN_RETRY_SECONDS = 30.0

Matters = Callable[[JSON | None, JSON | None], bool]


def always(old: JSON | None, new: JSON | None) -> bool:
    return True


class Changes:
    """A count of the changes that matter to a reader, and a way to wait for the next one."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._count = 0

    @property
    def count(self) -> int:
        with self._condition:
            return self._count

    def advance(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the count differs from `seen` or `timeout` seconds passed; the count then."""
        with self._condition:
            self._condition.wait_for(lambda: self._count != seen, max(timeout, 0.0))
            return self._count


class Informer:
    """The objects of `resource` in `namespace` that `query` (labelSelector, fieldSelector) selects,
    kept current in a daemon thread. `changes` is advanced on every change `matters(old, new)` says
    is one (None: added or gone), and on every (re)list."""

    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        namespace: str,
        query: Mapping[str, str],
        changes: Changes,
        *,
        matters: Matters = always,
        name: str = "informer",
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.query = dict(query)
        self.changes = changes
        self.matters = matters
        self.name = name
        self.watch_seconds = watch_seconds
        self._lock = threading.Lock()
        self._objects: dict[str, JSON] = {}
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # Why the last list or watch failed, for whoever falls back to reading directly.
        self.problem: str | None = None

    # --- readers ------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """A list has been read: the copy is the API server's as of at most one event ago."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def objects(self) -> list[JSON]:
        """The objects as last seen (shared, not copied: readers must not change them)."""
        with self._lock:
            return list(self._objects.values())

    # --- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No more updates. A watch in flight is not cut (the thread is a daemon): its events are dropped."""
        self._stopped.set()

    def _run(self) -> None:
        version = ""
        while not self._stopped.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._follow(version)
            except Gone:
                version = ""
            except Forbidden as error:
                self._trouble(f"{error}", FORBIDDEN_RETRY_SECONDS)
                version = ""
            except Exception as error:  # the thread must outlive any API trouble
                self._trouble(f"{type(error).__name__}: {error}", RETRY_SECONDS)
                version = ""

    def _trouble(self, problem: str, retry_seconds: float) -> None:
        if problem != self.problem:
            log.warning(
                "%s: watch of %s failed (%s); listing again", self.name, self.resource.plural, problem
            )
        self.problem = problem
        self._stopped.wait(retry_seconds)

    def _list(self) -> str:
        items, version = self.kube.list_at(self.resource, self.namespace, **self.query)
        with self._lock:
            self._objects = {item["metadata"]["name"]: item for item in items}
        self.problem = None
        self._synced.set()
        self.changes.advance()
        return version

    def _follow(self, version: str) -> str:
        """Apply the watch's events until the server ends it; returns the last version seen."""
        for event in self.kube.watch(
            self.resource, self.namespace, version, seconds=self.watch_seconds, **self.query
        ):
            if self._stopped.is_set():
                break
            if event.resource_version:
                version = event.resource_version
            if event.type != "BOOKMARK":
                self._apply(event)
        return version

    def _apply(self, event: WatchEvent) -> None:
        name = str((event.object.get("metadata") or {}).get("name") or "")
        with self._lock:
            old = self._objects.get(name)
            if event.type == "DELETED":
                self._objects.pop(name, None)
                new = None
            else:
                new = event.object
                self._objects[name] = new
        if self.matters(old, new):
            self.changes.advance()
