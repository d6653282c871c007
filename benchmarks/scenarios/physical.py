"""The physical limit: how many writes a second this cluster takes, with no operator in the way."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import stats
from benchmarks.model import Section, Table
from benchmarks.scenarios.context import (
    Context,
    cpu_delta,
    cpu_text,
)


def physical(ctx: Context) -> Section:
    plan, target = ctx.plan, ctx.target
    section = Section(
        "physical",
        "Physical limit: the API server's write rate",
        f"{plan.physical_processes} processes x {plan.physical_threads} threads create and delete "
        f"small ConfigMaps as fast as the API server answers, for {plan.physical_seconds:g} s, "
        f"{plan.physical_repeats} times. Each create and each delete is one write.",
    )
    namespace = target.namespace("bench-physical")
    rates = []
    for repeat in range(plan.physical_repeats):
        cpu_before = target.cpu_seconds()
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.load",
                    f"--kubeconfig={target.cluster.kubeconfig}",
                    f"--namespace={namespace}",
                    f"--seconds={plan.physical_seconds}",
                    f"--threads={plan.physical_threads}",
                    f"--prefix=r{repeat}p{p}",
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=target.cluster.env(),
            )
            for p in range(plan.physical_processes)
        ]
        results = []
        for process in processes:
            try:
                output, _ = process.communicate(timeout=plan.physical_seconds + 60)
                results.append(json.loads(output.strip().splitlines()[-1]))
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                process.kill()
        cpu = cpu_delta(cpu_before, target.cpu_seconds())
        writes = sum(r["writes"] for r in results)
        seconds = max((r["seconds"] for r in results), default=plan.physical_seconds)
        rate = writes / seconds if seconds else 0.0
        rates.append(rate)
        section.tables.append(
            Table(
                f"repeat {repeat + 1}",
                ["writes", "errors", "seconds", "writes/s", "CPU seconds by process"],
                [
                    [
                        str(writes),
                        str(sum(r["errors"] for r in results)),
                        f"{seconds:.1f}",
                        f"{rate:.0f}",
                        cpu_text(cpu),
                    ]
                ],
            )
        )
    spread = stats.spread(rates)
    ctx.write_rate = spread.median if spread else None
    section.data["write_rates"] = rates
    section.notes.append(
        f"Write limit: {spread.show(0, ' writes/s') if spread else 'n/a'}. The load generator runs on the "
        "same 2 cores as the API server, like every client in these benchmarks."
    )
    target.delete_namespace(namespace)
    return section
