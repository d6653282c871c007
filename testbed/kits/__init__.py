"""What tests do on a cluster, beyond the harness. e2e tests reach them through the `bed` fixture
(testbed/bed.py); the benchmarks import them directly. Lowest first:

    chart.py       the Helm chart: render, install, its service accounts and admission policies
    scheduler.py   the operator as a Deployment, campaigns and their waits, audit-log write counts
    worker.py      campaigns and shards made the way the operator makes them, worker processes
    batchapi.py    the Batch API service as a loopback Deployment, and tenants' ServiceAccount tokens
"""
