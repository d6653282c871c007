"""One pod on this node: its containers' processes from first sight until the pod is terminal or gone."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from testbed.cluster.images import LocalImage
from testbed.cluster.kubelet.api import (
    STRATEGIC_MERGE,
    call_json,
    describe_error,
    is_transient,
    read_env_source,
    rfc3339,
)
from testbed.cluster.kubelet.container_config import (
    EnvResolutionError,
    build_argv,
    missing_entrypoints,
    process_env,
    resolve_env,
)
from testbed.cluster.kubelet.identity import PodCredentials
from testbed.cluster.kubelet.pod_status import (
    BACKOFF_RESET_AFTER_SECONDS,
    RUNNING,
    TERMINAL_PHASES,
    TERMINATED,
    WAITING,
    ContainerRun,
    abandoned_status,
    backoff_seconds,
    build_pod_status,
    compute_phase,
    deletion_grace_seconds,
    exit_code_from_returncode,
    initial_runs,
    is_deleting,
    merge_conditions,
    pod_conditions,
    readiness_gates_ok,
    should_restart,
    status_shows_started,
    tail_text,
    terminated_state,
)
from testbed.cluster.kubelet.probes import ProbeTracker, run_probe
from testbed.cluster.kubelet.processes import (
    forget_process,
    kill_recorded_processes,
    pod_log_path,
    record_process,
    signal_group,
)
from testbed.cluster.kubelet.runc import (
    KUBE_MOUNT,
    SA_MOUNT,
    ContainerConfigError,
    PodPaths,
    bundle_config,
    container_argv,
    image_env,
    mount_overlay,
    read_only_root,
    unmount,
)
from testbed.cluster.kubelet.server import LogSegment

if TYPE_CHECKING:
    from testbed.cluster.kubelet.node import Kubelet

log = logging.getLogger(__name__)

# The serviceaccount controller creates "default" moments after a namespace appears; a pod racing
# it should wait, a pod naming a service account that never comes should fail visibly.
SERVICE_ACCOUNT_WAIT_SECONDS = 60.0
# How runc reports that it could not start the container process (then the run never started).
RUNC_START_FAILURE = "runc run failed"
# The control plane marks its processes with this variable (lifecycle.MARKER_ENV), to find leftovers.
CLUSTER_MARKER_ENV = "SHARDOPS_LOCAL_CLUSTER"
# A force-deleted pod (grace 0) still gets a moment to handle SIGTERM, as with a real kubelet.
MIN_FORCED_GRACE_SECONDS = 2
# lifecycle.py gives the kubelet 20 s to stop before SIGKILL; every pod stops in parallel.
SHUTDOWN_GRACE_CAP_SECONDS = 10
CONFIG_ERROR_RETRY_SECONDS = 2.0
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class _Bundle:
    run_dir: Path
    container_id: str


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    started: float
    env: dict[str, str]
    cwd: str
    # Set when the container runs in runc: its runc id, and the run directory (bundle, overlay).
    container_id: str | None = None
    run_dir: Path | None = None


class PodWorker:
    """Runs one pod from its first sight on this node until it is terminal (or gone); one thread each."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        self.kubelet = kubelet
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = False
        self._shutdown = False
        self._closed = False
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.init_specs: list[dict[str, Any]] = list(spec.get("initContainers") or [])
        self.specs: list[dict[str, Any]] = list(spec.get("containers") or [])
        self.init_runs, self.runs = initial_runs(self.init_specs, self.specs)
        self.procs: dict[str, _Process] = {}
        # Where each container's last two runs start in its log file (for `kubectl logs [--previous]`).
        self.log_starts: dict[str, list[int]] = {}
        self.not_before: dict[str, float] = {}
        self.backoff_steps: dict[str, int] = {}
        self.probes: dict[str, ProbeTracker] = {}
        self.init_index = 0
        self.initialized = not self.init_specs
        self.start_time: str | None = None
        self.started_mono: float | None = None
        # A container's hostname: spec.hostname when set, else the pod name (as the kubelet does).
        self.injected: dict[str, str] = {"HOSTNAME": str(spec.get("hostname") or self.name)[:63]}
        self.last_status: dict[str, Any] | None = None
        self.conditions: list[dict[str, Any]] = list((pod.get("status") or {}).get("conditions") or [])
        self.pod_dir = kubelet.state_dir / "pods" / self.uid
        self.service_account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        # Container name -> its locally built image, for the containers that run in runc.
        self.images: dict[str, LocalImage] = {}
        self.credentials = PodCredentials(
            kubelet.core,
            kubelet.cluster,
            self.pod_dir,
            self.namespace,
            self.name,
            self.uid,
            self.service_account,
        )
        self.thread = threading.Thread(
            target=self._main, name=f"pod/{self.namespace}/{self.name}", daemon=True
        )

    # -- called from other threads --------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def update(self, pod: dict[str, Any]) -> bool:
        """Hand over a newer pod object; False when the worker is past looking at updates."""
        with self._lock:
            if self._closed:
                return False
            self._pod = pod
        self._wake.set()
        return True

    def gone(self, pod: dict[str, Any] | None = None) -> None:
        """The pod object was deleted from the API (force deletion or our own final delete)."""
        with self._lock:
            self._gone = True
            if pod is not None:
                self._pod = pod
        self._wake.set()

    def shutdown(self) -> None:
        self._shutdown = True
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    # -- the pod's life ---------------------------------------------------------------------------

    @property
    def pod(self) -> dict[str, Any]:
        with self._lock:
            return self._pod

    def log_segment(self, container: str, previous: bool) -> LogSegment | None:
        """The part of `container`'s log file its last run (or the one before) wrote; None if none ran."""
        starts = self.log_starts.get(container)
        if not starts or (previous and len(starts) < 2):
            return None
        path = pod_log_path(self.kubelet.state_dir, self.namespace, self.name, container)
        if previous:
            return LogSegment(path, starts[-2], starts[-1], lambda: False)
        return LogSegment(path, starts[-1], None, lambda: container in self.procs)

    def _container_log(self, run: ContainerRun) -> Path:
        return pod_log_path(self.kubelet.state_dir, self.namespace, self.name, run.name)

    def _main(self) -> None:
        try:
            self._lifecycle()
        except Exception as exc:
            log.exception("pod %s/%s: unexpected error", self.namespace, self.name)
            # One bad pod must not take the node down: it fails loudly instead.
            with contextlib.suppress(Exception):
                self._terminate_all(0)
                self._publish_until_done(
                    phase="Failed",
                    stopping=True,
                    reason="KubeletError",
                    message=f"the process-kubelet failed to run this pod: {exc!r}",
                )
        finally:
            self._kill_everything()
            with self._lock:
                self._closed = True
                pod, gone = self._pod, self._gone
            if gone:
                shutil.rmtree(self.pod_dir, ignore_errors=True)
            elif is_deleting(pod) and not self._shutdown:
                # A deletion that arrived while we were finishing up: nobody else will see it.
                self.kubelet.final_delete(pod)

    def _lifecycle(self) -> None:
        pod = self.pod
        # Processes an earlier kubelet started (and was killed before reporting) are not ours either.
        kill_recorded_processes(self.pod_dir)
        if status_shows_started(pod):
            self._abandon(pod)
            return
        if is_deleting(pod) or self._gone:
            self.kubelet.final_delete(pod)
            return
        self._choose_runtimes()
        missing = missing_entrypoints(
            [s for s in [*self.init_specs, *self.specs] if s["name"] not in self.images]
        )
        if missing:
            self._fail_entrypoint(missing)
            return
        self.start_time = rfc3339()
        self.started_mono = time.monotonic()
        self._publish()
        if not self._prepare_identity():
            return
        while True:
            if self._shutdown:
                self._terminate_all(min(deletion_grace_seconds(self.pod), SHUTDOWN_GRACE_CAP_SECONDS))
                return
            if self._gone:
                self._terminate_all(MIN_FORCED_GRACE_SECONDS)
                return
            pod = self.pod
            if is_deleting(pod):
                self._terminate_all(deletion_grace_seconds(pod))
                if not self._gone:
                    self._publish_until_done(stopping=True)
                    self.kubelet.final_delete(pod)
                return
            deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
            if deadline is not None and time.monotonic() - (self.started_mono or 0.0) > int(deadline):
                self._terminate_all(deletion_grace_seconds(pod))
                self._publish_until_done(
                    phase="Failed",
                    stopping=True,
                    reason="DeadlineExceeded",
                    message=f"Pod was active on the node longer than the specified deadline ({deadline}s)",
                )
                return
            self._step()
            phase = compute_phase(self.restart_policy, self.init_runs, self.runs)
            if phase in TERMINAL_PHASES:
                if any(r.sidecar and r.name in self.procs for r in self.init_runs):
                    self._terminate_all(deletion_grace_seconds(pod))
                self._publish_until_done()
                return
            self._publish()
            self.credentials.refresh_if_due()
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()

    def _abandon(self, pod: dict[str, Any]) -> None:
        """A pod some earlier kubelet ran: its processes (killed already) are not ours to adopt."""
        status = pod.get("status") or {}
        if status.get("phase") not in TERMINAL_PHASES:
            patch = abandoned_status(status, rfc3339())
            delay = 0.5
            while not self._patch_status(patch) and not self._gone and not self._shutdown:
                self._wake.wait(delay)
                delay = min(delay * 2, 5.0)
            log.warning(
                "pod %s/%s: was running before this kubelet started; marked Failed", self.namespace, self.name
            )
        if is_deleting(self.pod):
            self.kubelet.final_delete(self.pod)

    def _fail_entrypoint(self, problems: dict[str, str]) -> None:
        finished = rfc3339()
        for run in [*self.init_runs, *self.runs]:
            if run.name in problems:
                run.state = TERMINATED
                run.terminated = terminated_state(
                    128, None, finished, None, message=problems[run.name], reason="ImageEntrypointUnsupported"
                )
        problem_text = "; ".join(problems.values())
        log.warning("pod %s/%s: %s", self.namespace, self.name, problem_text)
        self._publish_until_done(
            phase="Failed", reason="ImageEntrypointUnsupported", message=problem_text, stopping=True
        )
        if is_deleting(self.pod):
            self.kubelet.final_delete(self.pod)

    def _choose_runtimes(self) -> None:
        """runc for containers whose image was built locally; a process (and a note) for the others."""
        runtime = self.kubelet.runtime
        unavailable = runtime.unavailable()
        notes = []
        for spec in [*self.init_specs, *self.specs]:
            reference = str(spec.get("image") or "")
            try:
                image = runtime.local_image(reference)
            except (OSError, ValueError, KeyError) as exc:
                image = None
                log.warning("pod %s/%s: reading local images: %s", self.namespace, self.name, exc)
            if image is not None and unavailable is None:
                self.images[spec["name"]] = image
                continue
            why = f"image {reference!r} is not built locally" if image is None else unavailable
            notes.append(f"{why}: container {spec['name']} runs as a process on the node")
        if notes:
            self.kubelet.record_event(self.pod, "RunAsProcess", "; ".join(notes))
        if self.images:
            # A container runs as its own user and reads the token files as a kubelet's projected
            # service-account volume has them (mode 0644).
            self.credentials.file_mode = 0o644

    # -- identity -----------------------------------------------------------------------------------

    def _prepare_identity(self) -> bool:
        deadline = time.monotonic() + SERVICE_ACCOUNT_WAIT_SECONDS
        while True:
            if self._shutdown or self._gone:
                return False
            if is_deleting(self.pod):
                # Nothing ran yet: the pod just goes away.
                self.kubelet.final_delete(self.pod)
                return False
            try:
                self._setup_identity()
                return True
            except Exception as exc:
                problem = f"service account {self.namespace}/{self.service_account}: {describe_error(exc)}"
                if not is_transient(exc) or time.monotonic() > deadline:
                    log.warning("pod %s/%s: %s", self.namespace, self.name, problem)
                    for run in [*self.init_runs, *self.runs]:
                        run.waiting_reason, run.waiting_message = "ServiceAccountUnavailable", problem
                    self._publish_until_done(
                        phase="Failed", stopping=True, reason="ServiceAccountUnavailable", message=problem
                    )
                    return False
                for run in [*self.init_runs, *self.runs]:
                    run.waiting_message = f"waiting for {problem}"
                self._publish()
                self._wake.wait(1.0)
                self._wake.clear()

    def _setup_identity(self) -> None:
        injected = self.credentials.mount(self.pod.get("spec") or {})
        if not injected:
            return
        for run in [*self.init_runs, *self.runs]:
            run.waiting_message = ""
        self.injected.update(injected)

    # -- containers ---------------------------------------------------------------------------------

    def _spec(self, name: str) -> dict[str, Any]:
        return next(s for s in [*self.init_specs, *self.specs] if s["name"] == name)

    def _container_config(self, spec: Mapping[str, Any]) -> tuple[list[str], dict[str, str], str]:
        def lookup(kind: str, name: str) -> Mapping[str, str] | None:
            return read_env_source(self.kubelet.core, self.namespace, kind, name)

        image = self.images.get(spec["name"])
        if image is not None:
            injected = dict(self.injected)
            if "KUBECONFIG" in injected:
                injected.update(KUBECONFIG=f"{KUBE_MOUNT}/config", SHARDOPS_SA_DIR=SA_MOUNT)
            # The cluster marker lets the control plane's leftover check find container processes too.
            marker = {k: v for k, v in self.kubelet.inherited_env.items() if k == CLUSTER_MARKER_ENV}
            declared = resolve_env(spec, self.pod, lookup, {**image_env(image), **injected})
            env = {**image_env(image), **marker, **injected, **declared}
            return container_argv(spec, image, env), env, ""
        declared = resolve_env(spec, self.pod, lookup, self.injected)
        argv = build_argv(spec, {**self.injected, **declared})
        env = process_env(self.kubelet.inherited_env, self.injected, declared, self.kubelet.python_bin_dir)
        working_dir = spec.get("workingDir")
        cwd = working_dir if working_dir and os.path.isdir(working_dir) else str(self.pod_dir)
        return argv, env, cwd

    def _start(self, run: ContainerRun) -> None:
        spec = self._spec(run.name)
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        try:
            argv, env, cwd = self._container_config(spec)
            bundle = self._bundle(run, spec, argv, env) if run.name in self.images else None
        except (EnvResolutionError, ContainerConfigError) as exc:
            run.state = WAITING
            run.waiting_reason = "CreateContainerConfigError"
            run.waiting_message = str(exc)
            self.not_before[run.name] = time.monotonic() + CONFIG_ERROR_RETRY_SECONDS
            return
        log_path = self._container_log(run)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started_at = rfc3339()
        with log_path.open("ab") as log_file:
            offset = log_file.tell()
            try:
                if bundle is not None:
                    runtime = self.kubelet.runtime
                    runtime.delete(bundle.container_id)
                    argv_run, cwd_run = (
                        runtime.command(bundle.run_dir, bundle.container_id),
                        str(bundle.run_dir),
                    )
                else:
                    argv_run, cwd_run = argv, cwd
                popen = subprocess.Popen(
                    argv_run,
                    cwd=cwd_run,
                    env=env if bundle is None else self.kubelet.inherited_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    # Own process group: SIGTERM/SIGKILL reach the whole container, as in a cgroup.
                    start_new_session=True,
                )
            except OSError as exc:
                message = f"failed to start container {run.name!r}: {argv[0]}: {exc.strerror or exc}"
                log.warning("pod %s/%s: %s", self.namespace, self.name, message)
                self._after_exit(
                    run,
                    terminated_state(128, None, started_at, None, message=message, reason="StartError"),
                    0.0,
                )
                return
        if run.ever_started:
            run.restart_count += 1
        run.state = RUNNING
        run.pid = popen.pid
        run.started_at = started_at
        run.terminated = None
        run.waiting_reason, run.waiting_message = "", ""
        probe = spec.get("readinessProbe")
        run.ready = not probe
        if probe:
            delay = float(probe.get("initialDelaySeconds") or 0)
            self.probes[run.name] = ProbeTracker(probe=probe, next_at=time.monotonic() + delay)
        self.procs[run.name] = _Process(
            popen,
            log_path,
            offset,
            time.monotonic(),
            env,
            cwd,
            bundle.container_id if bundle else None,
            bundle.run_dir if bundle else None,
        )
        if bundle is not None:
            run.container_id = f"runc://{bundle.container_id}"
            run.image_id = self.images[run.name].digest
        self.log_starts[run.name] = [*self.log_starts.get(run.name, [])[-1:], offset]
        record_process(self.pod_dir, run.name, popen.pid)
        where = f"runc {bundle.container_id}" if bundle else "process"
        log.info(
            "pod %s/%s: started %s (%s, pid %d): %s",
            self.namespace,
            self.name,
            run.name,
            where,
            popen.pid,
            argv,
        )

    def _bundle(
        self, run: ContainerRun, spec: Mapping[str, Any], argv: list[str], env: dict[str, str]
    ) -> _Bundle:
        """The runc bundle of this run: config.json, and the root (shared read-only, or an overlay)."""
        image = self.images[run.name]
        pod_spec = self.pod.get("spec") or {}
        run_dir = self.pod_dir / "containers" / run.name
        run_dir.mkdir(parents=True, exist_ok=True)
        volumes_dir = self.pod_dir / "volumes"
        for volume in pod_spec.get("volumes") or []:
            if "emptyDir" in volume:
                directory = volumes_dir / volume["name"]
                directory.mkdir(parents=True, exist_ok=True)
                # As a kubelet makes an emptyDir: writable by whatever user the container runs as.
                directory.chmod(0o777)
        identity = "KUBECONFIG" in self.injected
        paths = PodPaths(
            service_account_dir=self.credentials.service_account_dir if identity else None,
            kube_dir=self.credentials.kube_dir if identity else None,
            volumes_dir=volumes_dir,
        )
        rootfs = self.kubelet.runtime.rootfs(image)
        config = bundle_config(
            spec=spec,
            pod_spec=pod_spec,
            image=image,
            rootfs=rootfs,
            argv=argv,
            env=env,
            hostname=self.injected["HOSTNAME"],
            paths=paths,
        )
        if not read_only_root(spec):
            config["root"]["path"] = str(mount_overlay(rootfs, run_dir))
        (run_dir / "config.json").write_text(json.dumps(config, indent=2))
        return _Bundle(run_dir, f"{self.uid}-{run.name}")

    def _signal(self, proc: _Process, sig: signal.Signals) -> None:
        """Signal a container: its process group, or (runc) its init process through runc."""
        if proc.container_id is not None:
            self.kubelet.runtime.kill(proc.container_id, sig.name)
        else:
            signal_group(proc.popen.pid, sig)

    def _reap(self, run: ContainerRun, allow_restart: bool = True) -> None:
        proc = self.procs.pop(run.name)
        code = exit_code_from_returncode(proc.popen.returncode)
        # The container ends with its main process: strays left in its group go too.
        signal_group(proc.popen.pid, signal.SIGKILL)
        if proc.container_id is not None and proc.run_dir is not None:
            self.kubelet.runtime.delete(proc.container_id)
            unmount(proc.run_dir / "root")
        finished = rfc3339()
        message = ""
        reason = None
        if code != 0:
            with contextlib.suppress(OSError), proc.log_path.open("rb") as handle:
                handle.seek(proc.log_offset)
                message = tail_text(handle.read())
            # runc's own error (exec of a missing entrypoint, a mount it cannot make): never started.
            if proc.container_id is not None and RUNC_START_FAILURE in message:
                reason = "StartError"
        self.probes.pop(run.name, None)
        forget_process(self.pod_dir, run.name)
        log.info(
            "pod %s/%s: %s (pid %d) exited with %d", self.namespace, self.name, run.name, proc.popen.pid, code
        )
        pid = None if proc.container_id else proc.popen.pid
        term = terminated_state(code, run.started_at, finished, pid, message=message, reason=reason)
        if run.container_id:
            term["containerID"] = run.container_id
        self._after_exit(run, term, time.monotonic() - proc.started, allow_restart)

    def _after_exit(
        self, run: ContainerRun, term: dict[str, Any], ran_for: float, allow_restart: bool = True
    ) -> None:
        run.ready = False
        code = int(term["exitCode"])
        is_init = any(run is r for r in self.init_runs)
        if not allow_restart:
            restart = False
        elif run.sidecar:
            restart = True
        elif is_init:
            restart = code != 0 and self.restart_policy != "Never"
        else:
            restart = should_restart(self.restart_policy, code)
        if not restart:
            run.state = TERMINATED
            run.terminated = term
            return
        step = 0 if ran_for >= BACKOFF_RESET_AFTER_SECONDS else self.backoff_steps.get(run.name, 0)
        delay = backoff_seconds(step)
        self.backoff_steps[run.name] = step + 1
        run.last_terminated = term
        run.terminated = None
        run.state = WAITING
        run.waiting_reason = "CrashLoopBackOff"
        run.waiting_message = (
            f"back-off {delay:g}s restarting failed container={run.name} "
            f"pod={self.name}_{self.namespace}({self.uid})"
        )
        self.not_before[run.name] = time.monotonic() + delay

    def _due(self, run: ContainerRun, now: float) -> bool:
        return (
            run.state == WAITING and run.name not in self.procs and now >= self.not_before.get(run.name, 0.0)
        )

    def _step(self) -> None:
        for run in [*self.init_runs, *self.runs]:
            proc = self.procs.get(run.name)
            if proc is not None and proc.popen.poll() is not None:
                self._reap(run)
        now = time.monotonic()
        while not self.initialized:
            if self.init_index >= len(self.init_runs):
                self.initialized = True
                for run in self.runs:
                    if run.state == WAITING and not run.ever_started:
                        run.waiting_reason = "ContainerCreating"
                break
            run = self.init_runs[self.init_index]
            if run.sidecar and run.state == RUNNING:
                self.init_index += 1
                continue
            if not run.sidecar and run.state == TERMINATED and run.exit_code == 0:
                self.init_index += 1
                continue
            if self._due(run, now):
                self._start(run)
                if run.sidecar and run.state == RUNNING:
                    continue
            break
        for run in self.init_runs[: self.init_index]:
            if run.sidecar and self._due(run, now):
                self._start(run)
        if self.initialized:
            for run in self.runs:
                if self._due(run, now):
                    self._start(run)
        self._probe(now)

    def _probe(self, now: float) -> None:
        for name, tracker in list(self.probes.items()):
            proc = self.procs.get(name)
            if proc is None or now < tracker.next_at:
                continue
            ok = run_probe(tracker.probe, self._spec(name), proc.env, proc.cwd)
            tracker.record(ok)
            tracker.next_at = time.monotonic() + float(tracker.probe.get("periodSeconds") or 10)
            for run in [*self.init_runs, *self.runs]:
                if run.name == name:
                    run.ready = tracker.ready

    def _terminate_all(self, grace: float) -> None:
        """SIGTERM the containers (sidecars after the others), SIGKILL whatever outlives the grace period."""
        started = time.monotonic()
        deadline = started + max(grace, 0)
        granted = grace
        sidecars = {r.name for r in self.init_runs if r.sidecar}
        for name, running in self.procs.items():
            if name not in sidecars:
                self._signal(running, signal.SIGTERM)
        sidecars_signalled = False
        killed = False
        while True:
            for run in [*self.init_runs, *self.runs]:
                proc = self.procs.get(run.name)
                if proc is not None and proc.popen.poll() is not None:
                    self._reap(run, allow_restart=False)
            if not sidecars_signalled and all(name in sidecars for name in self.procs):
                for name in sidecars & set(self.procs):
                    self._signal(self.procs[name], signal.SIGTERM)
                sidecars_signalled = True
            if not self.procs:
                break
            pod = self.pod
            # A second, shorter deletion (e.g. --force --grace-period=0) cuts the wait short.
            if self._gone:
                deadline = min(deadline, started + MIN_FORCED_GRACE_SECONDS)
            elif is_deleting(pod) and deletion_grace_seconds(pod) < granted:
                granted = max(deletion_grace_seconds(pod), 0)
                deadline = min(deadline, time.monotonic() + granted)
            if time.monotonic() >= deadline and not killed:
                for proc in self.procs.values():
                    self._signal(proc, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        # Containers that were waiting (to start or to restart) will not run any more.
        for run in [*self.init_runs, *self.runs]:
            if run.state == WAITING and run.last_terminated is not None:
                run.state = TERMINATED
                run.terminated = run.last_terminated
                run.last_terminated = None
        self.not_before.clear()

    def _kill_everything(self) -> None:
        for proc in list(self.procs.values()):
            self._signal(proc, signal.SIGKILL)
            signal_group(proc.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
            if proc.container_id is not None and proc.run_dir is not None:
                self.kubelet.runtime.delete(proc.container_id)
                unmount(proc.run_dir / "root")

    # -- status -------------------------------------------------------------------------------------

    def _publish(
        self, *, phase: str | None = None, stopping: bool = False, reason: str = "", message: str = ""
    ) -> bool:
        """Patch the pod status if it changed since the last successful write; True when up to date."""
        if phase is None:
            phase = compute_phase(self.restart_policy, self.init_runs, self.runs, stopping=stopping)
        desired = pod_conditions(
            phase,
            self.init_runs,
            self.runs,
            initialized=self.initialized,
            readiness_gates_ok=readiness_gates_ok(self.pod),
        )
        conditions = merge_conditions(self.conditions, desired, rfc3339())
        status = build_pod_status(
            phase=phase,
            init_runs=self.init_runs,
            runs=self.runs,
            conditions=conditions,
            start_time=self.start_time,
            reason=reason,
            message=message,
        )
        if status == self.last_status:
            return True
        if not self._patch_status(status):
            return False
        if self.last_status is None or self.last_status.get("phase") != phase:
            log.info("pod %s/%s: %s%s", self.namespace, self.name, phase, f" ({reason})" if reason else "")
        self.last_status = status
        self.conditions = conditions
        return True

    def _publish_until_done(self, **kwargs: Any) -> None:
        """A terminal status must land: the Job controller waits for it. Give up only if the pod is gone."""
        delay = 0.5
        while not self._gone and not self._shutdown:
            if self._publish(**kwargs):
                return
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, 5.0)

    def _patch_status(self, status: dict[str, Any]) -> bool:
        try:
            call_json(
                self.kubelet.core.patch_namespaced_pod_status,
                self.name,
                self.namespace,
                {"status": status},
                _content_type=STRATEGIC_MERGE,
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                self.gone()
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, describe_error(exc))
        except Exception as exc:
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, describe_error(exc))
        return False
