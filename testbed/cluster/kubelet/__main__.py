"""Process-kubelet: the kubelet (and scheduler) of the local e2e control plane, running pods as processes.

The local control plane (testbed/cluster/lifecycle.py) is a real kube-apiserver, kube-controller-manager
and etcd, but the machines it runs on have no container runtime. This program plays the kubelet of
one node and, since there is no kube-scheduler either, the scheduler too:

    python -m testbed.cluster.kubelet --kubeconfig ADMIN_KUBECONFIG --node-name local-node \\
        --state-dir DIR [--python PATH]

It runs until SIGTERM/SIGINT, then stops every pod process (SIGTERM, grace period, SIGKILL) and exits.

What it does:

* registers the Node (Ready, cpu 2 / memory 24Gi / 110 pods, InternalIP 127.0.0.1, the kubelet API
  port as daemonEndpoints.kubeletEndpoint) and keeps it
  alive: a node Lease in kube-node-lease renewed every 10 s, NodeReady heartbeats, and removal of
  the not-ready/unreachable taints nobody else would remove;
* binds every unscheduled pod meant for the default scheduler to that node (pods/binding);
* runs each pod's containers as local process groups: init containers one after the other (native
  sidecars, i.e. init containers with restartPolicy Always, keep running), then all containers;
  honours restartPolicy (with a small, capped back-off), readiness probes (httpGet, tcpSocket, exec),
  activeDeadlineSeconds and graceful deletion (SIGTERM to the process group, grace period, SIGKILL),
  then removes the pod object like a kubelet does (delete with gracePeriodSeconds=0);
* gives each pod the identity of its service account (unless automountServiceAccountToken is
  false): a pod-bound token from the TokenRequest API, written as a kubeconfig ($KUBECONFIG) and as
  the usual token / ca.crt / namespace files ($SHARDOPS_SA_DIR) under DIR/pods/<uid>/, refreshed at
  80% of its lifetime, so RBAC applies to pods exactly as in a real cluster;
* reports pod status the way the Job, ReplicaSet and Deployment controllers need it.

Differences from a real kubelet, by necessity or on purpose:

* Images are never pulled. A container whose image is in one of the --image-archive OCI archives
  (what `make image` built) runs from it in runc (runc.py): the image's rootfs unpacked once per
  digest under --rootfs-cache, read-only unless the securityContext allows writes (then an
  overlay), its entrypoint/cmd/env/user/workdir, the pod's securityContext, emptyDir volumes and
  the service-account token at /var/run/secrets/kubernetes.io/serviceaccount, the host's network;
  containerID runc://<id>, imageID the manifest digest. runc's start errors (a missing entrypoint)
  fail the container with reason StartError. Any other image is only recorded, and the pod gets
  one RunAsProcess event saying so: the container runs `command + args`
  on this machine, with the host's filesystem and tools; the directory of --python comes first on
  PATH, so `python` and the venv's console scripts resolve to the test venv. A container without
  `command` cannot fall back to its image's entrypoint: the pod fails with reason
  ImageEntrypointUnsupported. The rest of this list is about these process containers.
* No isolation. Every pod shares the host network (podIP = hostIP = 127.0.0.1, hostPort is ignored,
  two pods listening on the same port conflict), the filesystem, the users and the resources;
  requests and limits are not enforced.
* Volumes are not mounted; the service account files are the only exception, and they live in
  $SHARDOPS_SA_DIR, not /var/run/secrets/kubernetes.io/serviceaccount. workingDir is used when it
  exists on this machine, otherwise the pod's state directory DIR/pods/<uid>.
* The environment is the kubelet's own (minus KUBECONFIG and in-cluster discovery variables) plus
  the container's env/envFrom, HOSTNAME=<pod name> and PYTHONUNBUFFERED=1 (so logs are live).
* Scheduling looks only at schedulerName, schedulingGates, nodeSelector and spec.unschedulable;
  affinity, taints/tolerations and resource fit are ignored (there is only one node anyway).
* No liveness or startup probes, lifecycle hooks or ephemeral containers. Of the kubelet API only
  containerLogs is served (server.py: `kubectl logs [-f] [--previous] [--tail]`, not exec or
  port-forward), over TLS on loopback (--serving-port, with the certificates lifecycle.py makes).
  Logs are files: DIR/logs/<namespace>/<pod>/<container>.log (stdout and stderr, appended across
  restarts and across pods that reuse a name; the API serves each run's part); see
  processes.pod_log_path().
* A restarted kubelet does not adopt processes: it kills the ones it recorded for pods it finds
  running (pid files) and marks those pods Failed with reason KubeletRestarted.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from testbed.cluster.kubelet.node import Kubelet, ServingConfig

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.cluster.kubelet", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig of the cluster")
    parser.add_argument("--node-name", default="local-node")
    parser.add_argument("--state-dir", type=Path, required=True, help="pod logs, tokens, pid files")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter whose directory goes first on the pods' PATH"
    )
    parser.add_argument("--serving-port", type=int, help="loopback port of the kubelet API (container logs)")
    parser.add_argument("--tls-cert", type=Path, help="the kubelet API's serving certificate")
    parser.add_argument("--tls-key", type=Path, help="its key")
    parser.add_argument("--client-ca", type=Path, help="CA whose client certificates the kubelet API accepts")
    parser.add_argument(
        "--image-archive",
        type=Path,
        action="append",
        default=[],
        help="an OCI archive of images built locally (repeatable): pods naming one run in runc",
    )
    parser.add_argument(
        "--rootfs-cache", type=Path, help="where image root filesystems are unpacked, per digest"
    )
    parser.add_argument("--log-level", default=os.environ.get("SHARDOPS_KUBELET_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s [%(threadName)s] %(message)s",
    )
    serving = None
    if args.serving_port:
        if not (args.tls_cert and args.tls_key and args.client_ca):
            parser.error("--serving-port needs --tls-cert, --tls-key and --client-ca")
        serving = ServingConfig(args.serving_port, args.tls_cert, args.tls_key, args.client_ca)
    kubelet = Kubelet(
        args.kubeconfig,
        args.node_name,
        args.state_dir,
        args.python,
        serving,
        image_archives=args.image_archive,
        rootfs_cache=args.rootfs_cache,
    )

    def request_stop(signum: int, _frame: object) -> None:
        log.info("received %s", signal.Signals(signum).name)
        kubelet.stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
