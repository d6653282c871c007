"""The fault suite's offline half: a run's history as the API server's audit log recorded it
(`history`), and the invariants checked on it (`checker`). docs/faults.md says what is recorded,
what each invariant means and how to check a recorded run."""
