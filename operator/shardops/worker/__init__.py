"""The worker runtime (`shardops worker`): claim a shard, run the Campaign's command on it, heartbeat,
store the results, repeat. The modules, lowest first:

    settings.py    WorkerSettings: what a worker reads from its environment (identity, slots, timings)
    clocks.py      the wall clock and the monotonic one a worker reads (Clock, SystemClock)
    logs.py        the structured log: one JSON line per event (`emit`)
    metrics.py     the worker's Prometheus figures and the endpoint that serves them
    observed.py    what a worker observes before it claims (Observed): read or watched, its own (`own`)
    heartbeat.py   proving the claim is still ours before every write (Fenced), the heartbeat patch
    claim.py       whether to exit, which shard to claim (pure) and claiming it: the Lease, then the status
    items.py       a shard's items (ShardItems: inline or an itemsFrom slice) and its stored item results
    runner.py      one attempt of the user's command: files, environment (`command_env`), process
                   group, results reader, Command
    persistent.py  the persistent command: one process serving shard after shard (ServedCommand)
    tally.py       the item results of one attempt (Tally): which items have one, what is left, the cost
    slots.py       what the slots of one process share (SlotGroup) and running them (`run_slots`)
    holding.py     a claimed shard as its holder sees it (Holding: fenced writes, Done/failed/released,
                   Outcome), seeing its slot through the Slot Protocol
    shardrun.py    a claimed shard's attempt (ShardRun): its command run, supervised, heartbeated
    runtime.py     the loop of one slot (Worker): observe, claim, run, repeat until nothing is left
    main.py        `shardops worker`: settings, API client, signals, logs and metrics wired to the slots
"""
