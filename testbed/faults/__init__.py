"""The fault suite: a run's history as the API server's audit log recorded it, the invariants
checked on it, and the faults injected into a running campaign. docs/faults.md says what is
recorded, what each invariant means and how to check a recorded run. Lowest first:

    history.py     the stored versions of every Shard, Lease and Campaign status, and refused writes
    recording.py   the audit log read whole, or one test's part of it
    checker.py     the invariants of a finished run (`python -m testbed.faults.checker`)
    results.py     each Done write's result, checked in the S3 store itself
    proxy.py       the loopback HTTPS proxy that injects API faults in front of kube-apiserver
    inject.py      the worker processes of a running campaign, to freeze or kill
"""
