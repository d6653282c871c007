"""Start and stop a real, local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
the process-kubelet that runs pods as local processes, and SeaweedFS as its S3 server.

    python -m testbed.cluster.lifecycle up      # background; prints the KUBECONFIG to use
    python -m testbed.cluster.lifecycle down    # stops it; checks nothing is left running
    python -m testbed.cluster.lifecycle run     # foreground; Ctrl-C stops everything

`--record-history` (up, run) also audits the bodies of Shard, Campaign status and Lease writes, the
history testbed/faults/checker.py checks; the e2e session's cluster always records it.

Every child process is started with a parent-death signal, so even a SIGKILLed parent leaves no
orphan behind, and carries SHARDOPS_LOCAL_CLUSTER=<dir> in its environment so that `leftovers()`
can prove it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from testbed.cluster import images
from testbed.cluster import kueue as kueue_mod
from testbed.cluster import pki as pki_mod

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path(__file__).resolve().parent
DEFAULT_DIR = REPO_ROOT / ".shardops" / "cluster"
# The checkout's Python that pods run from (the editable install): shardops and the example agent.
POD_SOURCES = ("operator", "examples/agent")
MARKER_ENV = "SHARDOPS_LOCAL_CLUSTER"
NODE_NAME = "local-node"

# Controllers the e2e tests and the operator rely on; nothing that needs a cloud or a real kubelet.
CONTROLLERS = (
    "job-controller",
    "cronjob-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller",
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "resourcequota-controller",
    # Fills the default view/edit/admin roles from ClusterRoles labelled aggregate-to-* (the chart's).
    "clusterrole-aggregation-controller",
)

# What the audit log covers: every object a campaign or a Job costs the API server, including the
# status subresources the Job controller and the kubelet write (jobs/status, pods/status) and the
# pods' bindings, so that a worker Job's or an Indexed Job's cost is counted like a shard's.
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
READ_VERBS = ("get", "list", "watch")
AUDITED_RESOURCES = [
    {"group": "shardops.dev"},
    {"group": "coordination.k8s.io", "resources": ["leases"]},
    {"group": "batch", "resources": ["jobs", "jobs/status"]},
    {"group": "", "resources": ["configmaps", "events", "pods", "pods/status", "pods/binding"]},
    {"group": "events.k8s.io", "resources": ["events"]},
]

# What a fault run's history is made of (testbed/faults/history.py): every write to Shards and their
# status, to Campaign status and to Leases, with the request and the stored object it answered.
HISTORY_RESOURCES = [
    {"group": "shardops.dev", "resources": ["shards", "shards/status", "campaigns/status"]},
    {"group": "coordination.k8s.io", "resources": ["leases"]},
]


# The namespaces whose writes `record_history` records with their bodies: the history-checked
# tests' own (the `history_namespace` fixture). Named exactly, since an audit policy matches
# namespaces only by name; bodies of every other test's writes would cost the API server (and the
# suite) minutes for nothing.
HISTORY_NAMESPACES = tuple(f"history-{n}" for n in range(32))


def audit_policy(record_history: bool = False) -> dict[str, Any]:
    """The audit policy: who wrote and read what, at level Metadata. `record_history` adds the
    bodies (level RequestResponse) of the writes in HISTORY_RESOURCES in HISTORY_NAMESPACES, which
    the fault checker needs; it is off by default, so that a benchmark's audit log stays small."""
    bodies = [
        {
            "level": "RequestResponse",
            "verbs": list(WRITE_VERBS),
            "resources": HISTORY_RESOURCES,
            "namespaces": list(HISTORY_NAMESPACES),
        }
    ]
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            # The first rule that matches decides.
            *(bodies if record_history else []),
            {
                # Who wrote what: the operator's and workers' state changes, claims and Jobs.
                "level": "Metadata",
                "verbs": list(WRITE_VERBS),
                "resources": AUDITED_RESOURCES,
            },
            {
                # Who read what, for the cost of a campaign in reads (benchmarks/): metadata only.
                "level": "Metadata",
                "verbs": list(READ_VERBS),
                "resources": AUDITED_RESOURCES,
            },
            {"level": "None"},
        ],
    }


# The bucket the local S3 server creates at start; results and inputs of tests go under it.
DEFAULT_BUCKET = "shardops"
# SeaweedFS accepts any region in a signature; this is the one S3 clients assume by default.
DEFAULT_REGION = "us-east-1"

_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: signal.Signals) -> Callable[[], None]:
    """preexec_fn: the child gets `sig` when the thread that started it dies (Linux)."""

    def apply() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return apply


# Where every process of this machine takes its next loopback port from (`free_port`).
PORTS = range(20000, 30000)
PORTS_TAKEN = Path(tempfile.gettempdir()) / "shardops-ports"


def free_port() -> int:
    """A loopback port nobody uses, for a server started next. From below the kernel's ephemeral
    range (net.ipv4.ip_local_port_range, 32768-60999 by default; NodePorts start at 30000), in turn
    across every process of the machine (the last one handed out is kept in PORTS_TAKEN, under a
    lock). A port the kernel hands out itself (bind to 0) is of that range: between the pick and the
    server's own bind the kernel may give it to an outgoing connection, as it did while the API
    server opened its connections to etcd (SeaweedFS exited: "port ... is not available"); and two
    processes picking at once may get the same one. In turn, a port comes back only after all the
    others (10,000 picks; an e2e run makes a few hundred)."""
    with PORTS_TAKEN.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        handle.seek(0)
        last = handle.read().strip()
        start = PORTS.index(int(last)) + 1 if last.isdigit() and int(last) in PORTS else 0
        for step in range(len(PORTS)):
            port = PORTS[(start + step) % len(PORTS)]
            if _bindable(port):
                handle.seek(0)
                handle.truncate()
                handle.write(str(port))
                return port
    raise RuntimeError(f"no free loopback port in {PORTS.start}-{PORTS.stop - 1}")


def _bindable(port: int) -> bool:
    """Nothing listens on it and no connection holds it (a bind without SO_REUSEADDR fails on both)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def compile_pod_sources() -> None:
    """Compile the sources pods run, as an image's pip install compiles what it installs: a process
    that finds no bytecode compiles every module it imports, at every start, when it may not write
    it (PYTHONDONTWRITEBYTECODE, set on CI machines). Measured: a worker's start 0.80 -> 0.60 CPU-s.
    Cheap when up to date (compileall skips current files)."""
    import compileall

    for root in POD_SOURCES:
        compileall.compile_dir(REPO_ROOT / root, quiet=1)


@dataclass(frozen=True)
class ObjectStore:
    """An S3 API endpoint, credentials for it and the bucket to use: what tests and users get."""

    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str
    bucket: str

    # How `make cluster-up` hands these to a shell, and how tests against an external cluster
    # are told about an S3 endpoint.
    ENV_NAMES: ClassVar[dict[str, str]] = {
        "endpoint": "SHARDOPS_S3_ENDPOINT",
        "region": "SHARDOPS_S3_REGION",
        "access_key_id": "SHARDOPS_S3_ACCESS_KEY_ID",
        "secret_access_key": "SHARDOPS_S3_SECRET_ACCESS_KEY",
        "bucket": "SHARDOPS_S3_BUCKET",
    }

    def env(self) -> dict[str, str]:
        return {name: getattr(self, attr) for attr, name in self.ENV_NAMES.items()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ObjectStore | None:
        """The store named by SHARDOPS_S3_* variables; None when SHARDOPS_S3_ENDPOINT is unset."""
        if not environ.get(cls.ENV_NAMES["endpoint"]):
            return None
        defaults = {"region": DEFAULT_REGION, "bucket": DEFAULT_BUCKET}
        values = {attr: environ.get(name) or defaults.get(attr, "") for attr, name in cls.ENV_NAMES.items()}
        missing = [cls.ENV_NAMES[attr] for attr, value in values.items() if not value]
        if missing:
            raise ValueError(
                f"{cls.ENV_NAMES['endpoint']} is set but {', '.join(missing)} is not: "
                "set the credentials of that S3 endpoint too (or unset it to skip the S3 tests)"
            )
        return cls(**values)

    def client(self, **overrides: str) -> Any:
        """A boto3 S3 client for this store; `overrides` replace constructor arguments (e.g. a wrong
        secret, to see what the store answers)."""
        import boto3
        from botocore.config import Config

        arguments: dict[str, Any] = {
            "endpoint_url": self.endpoint,
            "region_name": self.region,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            # Bucket names in the path: a loopback endpoint has no per-bucket host names.
            "config": Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30),
        }
        arguments.update(overrides)
        return boto3.client("s3", **arguments)


def _read_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for raw in (CLUSTER_DIR / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key] = value
    return versions


def bin_dir(*, build: bool = True) -> Path:
    """Where testbed/cluster/build.sh puts (or has put) the binaries; builds them when missing.

    `build=False`: only where `make tools` has built them all (`build.sh --check`, which writes
    nothing, so a test run never races a build into the shared cache); FileNotFoundError naming what
    is missing otherwise."""
    override = os.environ.get("SHARDOPS_BIN_DIR")
    if override:
        return Path(override)
    script = str(CLUSTER_DIR / "build.sh")
    if not build:
        checked = subprocess.run(["bash", script, "--check"], capture_output=True, text=True, check=False)
        if checked.returncode != 0:
            raise FileNotFoundError(checked.stderr.strip() or f"{script} --check failed")
        return Path(checked.stdout.strip().splitlines()[-1])
    result = subprocess.run(["bash", script], check=True, stdout=subprocess.PIPE, text=True)
    return Path(result.stdout.strip().splitlines()[-1])


@dataclass
class LocalCluster:
    """One local control plane living in `directory` (certs, etcd data, logs, kubeconfig, audit log)."""

    directory: Path
    binaries: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    apiserver_port: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    # Every port SeaweedFS listens on, by its flag name; chosen once, kept across restarts.
    seaweedfs_ports: dict[str, int] = field(default_factory=dict)
    object_store: ObjectStore | None = None
    # Audit the bodies of the writes a fault run's history is made of (`audit_policy`).
    record_history: bool = False
    # How each process was started (argv, env, death signal): `restart` starts it again the same way.
    started_as: dict[str, tuple[list[str], dict[str, str] | None, signal.Signals]] = field(
        default_factory=dict
    )

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.directory / "audit.log"

    @property
    def kubelet_state(self) -> Path:
        return self.directory / "kubelet"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def pki(self) -> pki_mod.Pki:
        """The cluster's CA, certificates and keys (made by `start`, read back after)."""
        return pki_mod.generate(self.directory / "pki")

    @property
    def seaweedfs_data(self) -> Path:
        return self.directory / "seaweedfs"

    @property
    def s3_identities(self) -> Path:
        return self.directory / "s3-identities.json"

    def env(self) -> dict[str, str]:
        """Environment for a child: marks it as ours, and points kubectl/helm at this cluster."""
        env = dict(os.environ)
        env[MARKER_ENV] = str(self.directory)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.binaries}{os.pathsep}{env.get('PATH', '')}"
        # The kubelet runs as `python -m testbed.cluster.kubelet` from the cluster directory.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        return env

    def _spawn(
        self,
        name: str,
        argv: list[str],
        death_signal: signal.Signals = signal.SIGKILL,
        env: dict[str, str] | None = None,
    ) -> None:
        self.started_as[name] = (argv, env, death_signal)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env() if env is None else env,
            cwd=self.directory,
            # Only prctl runs between fork and exec, which is safe even with threads around.
            preexec_fn=parent_death_signal(death_signal),  # noqa: PLW1509
        )
        log.close()

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n" + "\n".join(tail))

    def _wait(self, what: str, probe: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if probe():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {timeout:.0f}s; logs in {self.logs}")

    def _ssl_context(self, pki: pki_mod.Pki) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return context

    def _get(self, pki: pki_mod.Pki, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"{self.server}{path}", context=self._ssl_context(pki), timeout=5
            ) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return 0, ""

    def start(self) -> None:
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        # The S3 server needs nothing from the others: it comes up while they do.
        self._start_seaweedfs()
        pki = self.pki
        etcd_client, etcd_peer = free_port(), free_port()
        self.apiserver_port = free_port()
        controller_manager_port = free_port()
        kubelet_port = free_port()

        self._spawn(
            "etcd",
            [
                str(self.binaries / "etcd"),
                "--name=local",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=local=http://127.0.0.1:{etcd_peer}",
                # A throwaway test store: durability on power loss buys nothing and costs seconds.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        policy_file = self.directory / "audit-policy.json"
        policy_file.write_text(json.dumps(audit_policy(self.record_history)))
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_public_key}",
                f"--service-account-signing-key-file={pki.sa_private_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                # The "kubernetes" Service cannot point at a loopback address; nothing here needs it.
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={policy_file}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
                "--audit-log-mode=blocking",
                "--allow-privileged=true",
                # `kubectl logs`: the process-kubelet's API at the Node's InternalIP (its Hostname
                # resolves nowhere), TLS verified both ways with the cluster CA.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client_cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client_key}",
                # /debug/pprof (admin only): where the API server spends its CPU (benchmarks/).
                "--profiling=true",
                "--v=1",
            ],
        )
        self._write_kubeconfig(pki, self.kubeconfig, pki.admin_cert, pki.admin_key, "shardops-admin")
        self._wait("kube-apiserver /readyz", lambda: self._get(pki, "/readyz")[0] == 200, timeout=120)
        self.timings["readyz"] = time.monotonic() - started

        controller_kubeconfig = self.directory / "controller-manager.kubeconfig"
        self._write_kubeconfig(
            pki,
            controller_kubeconfig,
            pki.controller_manager_cert,
            pki.controller_manager_key,
            "kube-controller-manager",
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries / "kube-controller-manager"),
                f"--kubeconfig={controller_kubeconfig}",
                f"--authentication-kubeconfig={controller_kubeconfig}",
                f"--authorization-kubeconfig={controller_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={controller_manager_port}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={pki.sa_private_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--concurrent-job-syncs=10",
                "--v=1",
            ],
        )

        self.kubelet_state.mkdir(parents=True, exist_ok=True)
        compile_pod_sources()
        self._spawn(
            "kubelet",
            [
                sys.executable,
                "-m",
                "testbed.cluster.kubelet",
                f"--kubeconfig={self.kubeconfig}",
                f"--node-name={NODE_NAME}",
                f"--state-dir={self.kubelet_state}",
                f"--python={sys.executable}",
                f"--serving-port={kubelet_port}",
                f"--tls-cert={pki.kubelet_cert}",
                f"--tls-key={pki.kubelet_key}",
                f"--client-ca={pki.ca_cert}",
                # Pods naming the image `make image` built run from it in runc (read when a pod starts).
                f"--image-archive={images.SHARDOPS_ARCHIVE}",
                f"--rootfs-cache={images.rootfs_cache()}",
            ],
            # The kubelet must get the chance to stop its pod processes.
            death_signal=signal.SIGTERM,
        )
        self._wait("node and default service account", lambda: self._cluster_usable(pki), timeout=120)
        self.timings["usable"] = time.monotonic() - started
        self._wait_object_store()
        self.timings["s3"] = time.monotonic() - started
        _write_private(
            self.directory / "ready.json",
            json.dumps(
                {
                    "kubeconfig": str(self.kubeconfig),
                    "server": self.server,
                    "auditLog": str(self.audit_log),
                    "kubeletState": str(self.kubelet_state),
                    "binDir": str(self.binaries),
                    "objectStore": asdict(self.object_store) if self.object_store else None,
                    "seaweedfsData": str(self.seaweedfs_data),
                    "seaweedfsPorts": self.seaweedfs_ports,
                    "timings": self.timings,
                    "pid": os.getpid(),
                }
            ),
        )

    def start_kueue(self, timeout: float = 120.0) -> None:
        """Kueue (testbed/cluster/kueue.py) in this control plane, once: its CRDs, its controller
        manager, then its webhooks once it serves them. Started on demand (the e2e `kueue` fixture),
        not by `start`: only the tests that hand Jobs to Kueue need it."""
        if "kueue" in self.processes:
            return
        started = time.monotonic()
        module = kueue_mod.module_dir()
        kubectl = str(self.binaries / "kubectl")
        crds = [arg for path in kueue_mod.crd_files(module) for arg in ("-f", str(path))]
        # Server-side: Kueue's CRDs are larger than the annotation a client-side apply keeps.
        subprocess.run(
            [kubectl, "apply", "--server-side", *crds], env=self.env(), check=True, capture_output=True
        )
        subprocess.run(
            [kubectl, "wait", "--for=condition=Established", "--timeout=60s", *crds],
            env=self.env(),
            check=True,
            capture_output=True,
        )
        directory = self.directory / "kueue"
        directory.mkdir(parents=True, exist_ok=True)
        health_port = free_port()
        files = kueue_mod.write_files(
            directory, module, self.pki, webhook_port=free_port(), health_port=health_port
        )
        self._spawn(
            "kueue", [str(self.binaries / "kueue"), f"--config={files.config}", "--zap-log-level=info"]
        )

        def serving() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=5) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        self._wait("kueue /readyz", serving, timeout=timeout)
        subprocess.run(
            [kubectl, "apply", "-f", str(files.webhooks)], env=self.env(), check=True, capture_output=True
        )

        # The API server calls the webhooks from now on: a dry-run create through Kueue's
        # ResourceFlavor webhook answers once it takes them (the first call may race its start).
        def webhooks_answer() -> bool:
            probe = subprocess.run(
                [kubectl, "create", "--dry-run=server", "-f", "-"],
                input=json.dumps(
                    {
                        "apiVersion": "kueue.x-k8s.io/v1beta2",
                        "kind": "ResourceFlavor",
                        "metadata": {"name": "webhook-probe"},
                    }
                ),
                env=self.env(),
                capture_output=True,
                text=True,
                check=False,
            )
            return probe.returncode == 0

        self._wait("kueue webhooks", webhooks_answer, timeout=timeout)
        self.timings["kueue"] = time.monotonic() - started

    def _start_seaweedfs(self) -> None:
        """SeaweedFS's all-in-one `weed mini` (master, volume server, filer, S3 gateway and its admin
        server in one process), every port it opens chosen here on loopback, data under the cluster
        directory, one S3 identity generated for this cluster."""
        if not self.seaweedfs_ports:
            self.seaweedfs_ports = {
                flag: free_port()
                for flag in (
                    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                    "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
                    "admin.port", "admin.port.grpc",
                )
            }  # fmt: skip
        if self.object_store is None:
            self.object_store = ObjectStore(
                endpoint=f"http://127.0.0.1:{self.seaweedfs_ports['s3.port']}",
                region=DEFAULT_REGION,
                access_key_id="SHARDOPS" + secrets.token_hex(6).upper(),
                secret_access_key=secrets.token_urlsafe(30),
                bucket=DEFAULT_BUCKET,
            )
            _write_private(
                self.s3_identities,
                json.dumps(
                    {
                        "identities": [
                            {
                                "name": "shardops",
                                "credentials": [
                                    {
                                        "accessKey": self.object_store.access_key_id,
                                        "secretKey": self.object_store.secret_access_key,
                                    }
                                ],
                                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                            }
                        ]
                    },
                    indent=2,
                ),
            )
        self.seaweedfs_data.mkdir(parents=True, exist_ok=True)
        # A clean environment: SeaweedFS turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an admin
        # identity, reads WEED_* as configuration and looks for config files under $HOME/.seaweedfs;
        # none of the developer's may leak in.
        env = {
            MARKER_ENV: str(self.directory),
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.seaweedfs_data),
        }
        self._spawn(
            "seaweedfs",
            [
                str(self.binaries / "weed"),
                # Logs to the captured output instead of files under /tmp.
                "-logtostderr",
                "mini",
                f"-dir={self.seaweedfs_data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                *(f"-{flag}={port}" for flag, port in self.seaweedfs_ports.items()),
                # What is not needed is off: no second admin port, Iceberg/Lance catalogs, WebDAV or
                # admin UI; and no usage reports sent to the SeaweedFS telemetry server.
                "-admin.port.legacy=0",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-webdav=false",
                "-admin.ui=false",
                "-master.telemetry=false",
                f"-s3.config={self.s3_identities}",
                f"-bucket={DEFAULT_BUCKET}",
                f"-filer.localSocket={self.seaweedfs_data / 'filer.sock'}",
                f"-s3.localSocket={self.seaweedfs_data / 's3.sock'}",
            ],
            # A graceful stop flushes the filer's metadata and removes its sockets.
            death_signal=signal.SIGTERM,
            env=env,
        )

    def _wait_object_store(self) -> None:
        """Until a real S3 call with this cluster's credentials succeeds: the bucket answers HeadBucket."""
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        assert self.object_store is not None
        bucket = self.object_store.bucket
        # One quick attempt per probe: _wait polls.
        probe = self.object_store.client(
            config=Config(
                s3={"addressing_style": "path"},
                connect_timeout=2,
                read_timeout=5,
                retries={"max_attempts": 1},
            )
        )

        def ready() -> bool:
            try:
                probe.head_bucket(Bucket=bucket)
            except (BotoCoreError, ClientError):
                return False
            return True

        self._wait(f"SeaweedFS S3 (HeadBucket {bucket})", ready, timeout=120)

    def restart_object_store(self, timeout: float = 20.0) -> None:
        """Stop the S3 server and start it again on the same ports and data (a store outage)."""
        process = self.processes["seaweedfs"]
        _terminate(process, timeout)
        _remove_seaweedfs_sockets(self.seaweedfs_ports)
        others = {name: proc for name, proc in self.processes.items() if name != "seaweedfs"}
        self.processes = {}
        self._start_seaweedfs()
        # Keep it first, so that stop() still ends it last.
        self.processes.update(others)
        self._wait_object_store()

    def restart(self, name: str, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Stop one process of the control plane ("kube-apiserver", "etcd") and start it again the same
        way, on the same ports and data, `down_seconds` later; back once the API server is ready
        again. A fault: etcd keeps its data, every client sees the outage."""
        argv, env, death_signal = self.started_as[name]
        order = list(self.processes)
        _terminate(self.processes[name], timeout)
        # Down for a while: a clock, not a synchronization.
        time.sleep(down_seconds)
        self._spawn(name, argv, death_signal, env)
        self.processes = {key: self.processes[key] for key in order}
        pki = self.pki
        self._wait("kube-apiserver /readyz", lambda: self._get(pki, "/readyz")[0] == 200, timeout=timeout)

    def _cluster_usable(self, pki: pki_mod.Pki) -> bool:
        status, body = self._get(pki, f"/api/v1/nodes/{NODE_NAME}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        node_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        sa_status, _ = self._get(pki, "/api/v1/namespaces/default/serviceaccounts/default")
        return node_ready and sa_status == 200

    def _write_kubeconfig(self, pki: pki_mod.Pki, path: Path, cert: Path, key: Path, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "shardops-local",
                    "cluster": {"server": self.server, "certificate-authority": str(pki.ca_cert)},
                }
            ],
            "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "shardops-local", "context": {"cluster": "shardops-local", "user": user}}],
            "current-context": "shardops-local",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop in reverse order: kubelet first (it ends the pod processes), the S3 server last."""
        for name in reversed(list(self.processes)):
            _terminate(self.processes[name], timeout)
        self.processes.clear()
        for pid in leftovers(self.directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _remove_seaweedfs_sockets(self.seaweedfs_ports)


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (it holds a secret)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def seaweedfs_socket_paths(ports: Mapping[str, int]) -> list[Path]:
    """SeaweedFS puts a Unix socket for each of its gRPC services in /tmp, named by the port (no flag
    moves them); it removes them when it stops gracefully."""
    return [
        Path(f"/tmp/seaweedfs-{flag.split('.', 1)[0]}-grpc-{port}.sock")
        for flag, port in ports.items()
        if flag.endswith(".grpc")
    ]


def _remove_seaweedfs_sockets(ports: Mapping[str, int]) -> None:
    """What a killed SeaweedFS left in /tmp."""
    for path in seaweedfs_socket_paths(ports):
        path.unlink(missing_ok=True)


def leftovers(directory: Path) -> list[int]:
    """PIDs of live processes started for the cluster in `directory` (control plane and pods)."""
    marker = f"{MARKER_ENV}={directory}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Zombies are already dead; they wait only for their parent to reap them.
        if marker in environ.split(b"\0") and stat.rsplit(")", 1)[-1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def running_cluster(directory: Path | None = None, *, record_history: bool = False) -> Iterator[LocalCluster]:
    """A started cluster for the duration of the block; stopped (and checked for leftovers) after.
    `record_history`: audit the bodies of the writes a fault run's history is made of."""
    temporary = directory is None
    path = Path(tempfile.mkdtemp(prefix="shardops-cluster-")) if directory is None else directory
    binaries = bin_dir()
    images.build_shardops_image()
    cluster = LocalCluster(directory=path, binaries=binaries, record_history=record_history)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


def _run_foreground(directory: Path, record_history: bool = False) -> int:
    stop_requested = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    cluster = LocalCluster(directory=directory, binaries=bin_dir(), record_history=record_history)
    try:
        cluster.start()
        print(
            f"local control plane ready in {cluster.timings['readyz']:.1f}s (readyz), "
            f"{cluster.timings['usable']:.1f}s (node ready), {cluster.timings['s3']:.1f}s (S3)",
            flush=True,
        )
        while not stop_requested:
            cluster._check_alive()
            time.sleep(0.5)
    finally:
        cluster.stop()
        (directory / "ready.json").unlink(missing_ok=True)
    return 0


def running_object_store(directory: Path = DEFAULT_DIR) -> ObjectStore | None:
    """The S3 store of the cluster `up` started in `directory` (None when there is none)."""
    ready = directory / "ready.json"
    if not ready.exists():
        return None
    info = json.loads(ready.read_text())
    return ObjectStore(**info["objectStore"]) if info.get("objectStore") else None


def _usage(info: dict[str, Any]) -> str:
    """The shell lines that point kubectl, helm and S3 clients at the cluster described by ready.json."""
    lines = [
        f"  export KUBECONFIG={info['kubeconfig']}",
        f"  export PATH={info['binDir']}:$PATH   # kubectl, helm and weed matching the cluster",
    ]
    if info.get("objectStore"):
        store = ObjectStore(**info["objectStore"])
        lines += [f"  export {name}={value}" for name, value in store.env().items()]
    return "\n".join(lines)


def _up(directory: Path, record_history: bool = False) -> int:
    if (directory / "ready.json").exists():
        info = json.loads((directory / "ready.json").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(info["pid"], 0)
            print(f"already running:\n{_usage(info)}")
            return 0
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    bin_dir()  # build before detaching, so build output and errors reach the terminal
    images.build_shardops_image()
    with (directory / "supervisor.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testbed.cluster.lifecycle",
                "run",
                f"--dir={directory}",
                *(["--record-history"] if record_history else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while not (directory / "ready.json").exists():
        if supervisor.poll() is not None or time.monotonic() > deadline:
            print((directory / "supervisor.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            return 1
        time.sleep(0.3)
    info = json.loads((directory / "ready.json").read_text())
    print(
        f"local control plane up ({info['server']}, /readyz after {info['timings']['readyz']:.1f}s)\n"
        f"{_usage(info)}\n"
        f"  audit log: {info['auditLog']}\n"
        f"  pod logs:  {info['kubeletState']}/logs/<namespace>/<pod>/<container>.log\n"
        f"  S3 data:   {info['seaweedfsData']} (SeaweedFS; bucket {DEFAULT_BUCKET})\n"
        f"  stop with: make cluster-down"
    )
    return 0


def _down(directory: Path) -> int:
    ready = directory / "ready.json"
    if ready.exists():
        pid = json.loads(ready.read_text())["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while ready.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    remaining = leftovers(directory)
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    print(f"local control plane stopped ({len(remaining)} leftover processes killed)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.cluster.lifecycle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["up", "down", "run"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="cluster state directory")
    parser.add_argument(
        "--record-history",
        action="store_true",
        help="audit the bodies of Shard, Campaign status and Lease writes (for testbed/faults/checker.py)",
    )
    args = parser.parse_args(argv)
    directory = args.dir.resolve()
    if args.action == "up":
        return _up(directory, args.record_history)
    if args.action == "down":
        return _down(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _run_foreground(directory, args.record_history)


if __name__ == "__main__":
    sys.exit(main())
