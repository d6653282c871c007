"""What the e2e tests, the fault suite, the demo and the benchmarks share: the local control plane,
the fault tooling, the test upstream and the kits. Never imported by the product (operator/shardops);
imports nothing from e2e/, tests/ or benchmarks/ (tests/test_layering.py checks both). Lowest first:

    cluster/      the local control plane: Go modules and build.sh (`make tools`), pki, images,
                  lifecycle (start/stop, `make cluster-up`), the process-kubelet (kubelet/)
    upstream.py   the OpenAI-compatible test upstream: real HTTP on loopback, faults on demand
    harness.py    the cluster under test (local or KUBECONFIG): clients, namespaces, CRDs, wait_for
    faults/       the fault suite: audit-log history, its invariants, the API fault proxy, process finders
    kits/         what tests do on a cluster: render/install the chart, run the operator, run workers
    bed.py        Bed: one test's cluster and namespace with the kits' calls bound to them (the e2e
                  `bed` fixture)
    demo.py       `make demo`: the operator installed by its chart and a sample campaign to completion
"""
