"""The physical-limit load: threads that create and delete small ConfigMaps as fast as the API server
answers, for a fixed time, then print what they achieved as one JSON line. It stops by itself.

    python -m benchmarks.load --kubeconfig K --namespace NS --seconds 15 --threads 8 --prefix p0
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from shardops.k8s.api import CONFIGMAPS, ApiError, Kube

FIELD_MANAGER = "shardops-bench-load"


def _worker(kubeconfig: str, namespace: str, prefix: str, deadline: float, counts: list[int]) -> None:
    kube = Kube.from_environment(FIELD_MANAGER, kubeconfig)
    kube.api_client.user_agent = "shardops-bench-load"
    number = 0
    # Bounded by the deadline; each iteration is one create and one delete.
    while time.monotonic() < deadline:
        name = f"{prefix}-{number}"
        number += 1
        try:
            kube.create(CONFIGMAPS, namespace, {"metadata": {"name": name}, "data": {"k": "v"}})
            counts[0] += 1
            kube.delete(CONFIGMAPS, namespace, name)
            counts[0] += 1
        except ApiError:
            counts[1] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--prefix", default="load")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.seconds
    per_thread = [[0, 0] for _ in range(args.threads)]
    threads = [
        threading.Thread(
            target=_worker,
            args=(args.kubeconfig, args.namespace, f"{args.prefix}-{i}", deadline, per_thread[i]),
            daemon=True,
        )
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.seconds + 30)
    elapsed = time.monotonic() - started
    writes = sum(c[0] for c in per_thread)
    errors = sum(c[1] for c in per_thread)
    print(json.dumps({"writes": writes, "errors": errors, "seconds": elapsed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
