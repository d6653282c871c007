"""The operator (`shardops operator`): reconcile each Campaign into Shards, Leases and worker Jobs,
on the leader only. The modules, lowest first:

    failpoints.py     crash points for the fault-injection tests (SHARDOPS_FAILPOINT)
    builders.py       the objects and status parts the operator writes: Shard and worker Job bodies,
                      conditions merged, status patches                                       [pure]
    settings.py       OperatorSettings: what the operator reads from its environment
    metrics.py        the operator's Prometheus figures and /healthz
    memory.py         what one campaign's passes remember between passes (Memory, Progress)
    observed.py       what one pass saw (Observed): the Campaign, its items, Shards, Jobs and pods
    stores.py         whether a campaign's workers can reach its S3 store (its namespace's Secret)
    writes.py         a pass's writes to Shards: transitions and creates (ShardWrites)
    items.py          a campaign's items, read and checked once per spec generation (Items)
    sweep.py          the lease sweep: zombies, stalls, their Events (Sweeper, Sweep)
    history.py        the shard history folded into the breakers, committed once the status holds it
    fold.py           the Done shards folded into the ledger, then deleted with their Leases (LedgerFold)
    retry.py          a recorded retry request acted on once (Retry), announced after the status write
    dispatch.py       planning and carrying the plan out: pause, resume, cut, finalize, worker Jobs
    sources.py        shared Sources on the leader: claims reported by passes, one sharing pass over
                      every referenced Source, the share each campaign's pass writes
    status.py         the status a pass wants (desired_status), the conditions that turned    [pure]
    retention.py      result retention: what a finished campaign's results are, and when they go
    reconcile.py      one pass over a campaign (Reconciler: kick, reconcile, shard_event): observe,
                      decide, act, then patch the status only where it differs
    old_finalizer.py  removing the finalizer an earlier release put on Campaigns
    leader.py         leader election through one Lease; the write guard of a pass
    ticker.py         the periodic reconcile of every Campaign served
    handlers.py       kopf wiring: which events reach which function
    main.py           `shardops operator`: metrics, leader election, then kopf; a clean stop
"""
