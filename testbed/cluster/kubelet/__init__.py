"""Process-kubelet: the kubelet (and scheduler) of the local e2e control plane, running pods as processes.

Started by testbed/cluster/lifecycle.py as `python -m testbed.cluster.kubelet`; what it does and how it
differs from a real kubelet is described in __main__.py. The modules, lowest first:

    host.py              the node's one address (shared by every pod), capacity, labels, Node status
    container_config.py  a container's argv and environment from the pod spec ($(VAR), envFrom/env,
                         downward API, resource fields)                                        [pure]
    pod_status.py        container states, restart and back-off decisions, phase, conditions, the pod
                         status document, questions about a pod object (deleting? started?)    [pure]
    scheduling.py        which pods the default scheduler binds here                           [pure]
    api.py               raw JSON calls, the watch stream, error classification, timestamps,
                         ConfigMap/Secret data for environments
    processes.py         log paths, pid files, private files, process groups on this machine
    probes.py            readiness probes and their thresholds
    server.py            the kubelet API's containerLogs endpoint (`kubectl logs [-f]`), TLS on loopback
    identity.py          how pods reach the API server; the pod-bound service-account token and its files
    pod.py               PodWorker: one pod's processes from first sight until terminal or gone
    node.py              Kubelet: node registration, lease, heartbeats, taints, the pod watch, binding,
                         removal of finished pods, shutdown
    __main__.py          the command line
"""
