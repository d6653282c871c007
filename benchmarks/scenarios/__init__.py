"""The scenarios of `make bench`, one module each, measured side by side in one run on one cluster.

Every scenario is a function of the shared Context that returns a `Section` (tables, plots, figures
against their targets) and never raises for a slow system: a run that reaches its budget is stopped,
reported with how far it got, and marked as missing its target. Lowest first:

    context.py    the Context every scenario gets, the items of a zero-work run, table formatters
    physical.py   the physical limit: writes a second this cluster takes with no operator
    versus.py     shardops against an Indexed Job, and the CPU to start a worker and an agent
    cost.py       API cost per shard from the audit log, heartbeats apart
    latency.py    Pending to Running, a zombie's reclaim, operator restart and failover
    many.py       many campaigns at once under one operator
    scale.py      the scale curve: cost per shard by decile, objects over time
    failing.py    a campaign with one shard in ten failing: objects alive and the Campaign's size
    million.py    a million items end to end: deciles, memory, objects, the S3 store, API writes
    profiles.py   the py-spy profiles taken during the others, as tables
"""
