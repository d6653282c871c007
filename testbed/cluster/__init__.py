"""The local control plane: a real kube-apiserver, kube-controller-manager and etcd, SeaweedFS as
its S3 server, and the process-kubelet. Lowest first:

    versions.env   the pinned versions, and why each
    gen-gomod.sh   generates k8s/, etcd/, seaweedfs/ (go.mod, go.sum, tools.go) from the pins
    build.sh       builds them once into ~/.cache/shardops (`make tools`), stamped by their inputs
    pki.py         the throwaway CA and certificates of one cluster directory
    images.py      locally built OCI images (`make image`), unpacked once per digest for runc
    kubelet/       the process-kubelet: pods as local processes or runc containers (its own map)
    lifecycle.py   start, stop and describe a cluster (`python -m testbed.cluster.lifecycle up|down|run`)
"""
