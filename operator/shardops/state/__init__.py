"""The one mapping from live objects (Campaign, Shards, Leases, worker Jobs and Pods) to the inputs of
`logic/`: shard views, lease observations, worker counts, breakers folded from shard history, and
the planner's inputs. Pure (no I/O, `now` is a parameter); below the scheduler, the worker and the
CLI, so all three decide from the same facts."""
