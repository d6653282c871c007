"""The one mapping from live objects (Campaign, Shards, Leases, worker Jobs and Pods) to the inputs of
`logic/`: shard views, lease observations, worker counts, breakers folded from shard history, and
the planner's inputs. Pure (no I/O, `now` is a parameter); below the scheduler, the worker and the
CLI, so all three decide from the same facts. The modules, lowest first:

    shardview.py        Shards as `logic/` sees them: names, phases, views, lease observations
    breakers.py         per-source breakers, as the status records them and as the planner takes them
    cooldowns.py        per-source cooldowns from rate-limited answers (Retry-After)
    error_threshold.py  the error threshold on live objects: attempt endings, whether it holds
    history.py          the shards' transition history folded into breakers and counters, once
    workers.py          worker Jobs and their pods as the planner counts them
    ledger.py           folding Done shards: what the ledger keeps, which listed shards are folded
    observe.py          live objects turned into the planner's inputs (dispatch_inputs, claim_inputs)
    sources.py          a Campaign as a claimant of the shared Sources it names, and its written shares
    summary.py          the count-and-budget summary of the live shards (Summary), status and CLI alike
    results.py          every finished item of a campaign, in item order
"""
