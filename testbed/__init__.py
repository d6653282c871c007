"""What the e2e tests, the fault suite, the demo and the benchmarks share. The product
(operator/shardops) never imports it; it imports nothing of e2e/, tests/ or benchmarks/
(tests/project/test_layering.py checks both). The modules, lowest first:

    cluster/      the local control plane: Go modules, build.sh (`make tools`), lifecycle, process-kubelet
    upstream.py   the OpenAI-compatible test upstream: real HTTP on loopback, faults on demand
    harness.py    the cluster under test (local or KUBECONFIG): clients, namespaces, CRDs, wait_for
    litellm/      the LiteLLM proxy, a second upstream no one here wrote: its own venv, a mocked model
    tenants.py    provision_namespace: a namespace's S3 identity scoped to its area, and its store Secret
    faults/       the fault suite: audit-log history, its invariants, the API fault proxy, process finders
    kits/         what tests do on a cluster: the Helm chart, the operator and campaigns, workers
    bed.py        Bed: one test's cluster and namespace with the kits' calls bound (the e2e `bed` fixture)
    demo.py       `make demo`: the operator installed by its chart and a sample campaign to completion
"""
