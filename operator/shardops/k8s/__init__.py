"""Every call to the API server: typed, with preconditions, ambiguous writes recognised. The modules,
lowest first:

    api.py         the client (Kube) and the Protocol product code takes (KubeClient), resources,
                   typed errors, retries, watches
    ambiguous.py   writes whose answer was lost: re-read, and recognise our own write
    events.py      Kubernetes Events for the transitions a person must see
    shards.py      Shard state changes: one fenced status patch per transition, and Shard lists
    campaigns.py   Campaign reads, status patches, its items from a ConfigMap
    leases.py      claims on shards as Leases, with leaseTransitions as the fencing token
    finalizers.py  removing one finalizer without touching anyone else's
    informer.py    a watch-fed copy of a bounded set of objects (list, then watch)
    jobs.py        worker Jobs and their pods: list a campaign's, create one
    kueue.py       what Kueue says of suspended worker Jobs: their LocalQueue, their Workloads
"""
