"""`shardops`: run the operator, run a worker, the built-in LLM worker command, the Batch API
service, generate the CRDs.

The one module above every entry point (scheduler, worker, api.crdgen): it only dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from shardops import __version__

    parser = argparse.ArgumentParser(prog="shardops", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shardops {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    crds = commands.add_parser(
        "crds", help="write the CustomResourceDefinitions generated from the API models"
    )
    crds.add_argument("--output", "-o", default="crds", help="directory to write into, or - for stdout")
    crds.set_defaults(run=_run_crds)

    operator = commands.add_parser("operator", help="run the scheduler (kopf operator)")
    operator.set_defaults(run=_run_operator)

    worker = commands.add_parser(
        "worker", help="run a worker: claim shards of a campaign and run its command"
    )
    worker.add_argument("--campaign", required=True, help="name of the Campaign whose shards to work on")
    worker.set_defaults(run=_run_worker)

    llm = commands.add_parser(
        "llm",
        help="the built-in worker command for spec.worker.llm: one chat completion per item "
        "(run by shardops worker, not by hand)",
    )
    llm.set_defaults(run=_run_llm)

    batch_api = commands.add_parser(
        "batch-api",
        help="serve the OpenAI Batch API (files and batches) backed by Campaigns (the chart's batchAPI)",
    )
    batch_api.set_defaults(run=_run_batch_api)
    return parser


def _run_batch_api(_: argparse.Namespace) -> int:
    from shardops.batchapi.main import run

    return run()


def _run_llm(_: argparse.Namespace) -> int:
    from shardops.llm.main import main as llm_main

    return llm_main()


def _run_worker(args: argparse.Namespace) -> int:
    from shardops.worker.main import run_worker
    from shardops.worker.settings import WorkerSettings

    return run_worker(WorkerSettings(), args.campaign)


def _run_operator(_: argparse.Namespace) -> int:
    # Settings come from the environment (SHARDOPS_*), loaded here, before kopf or any handler exists.
    from shardops.scheduler.main import run_operator
    from shardops.scheduler.settings import OperatorSettings

    return run_operator(OperatorSettings())


def _run_crds(args: argparse.Namespace) -> int:
    from shardops.api.crdgen import write_crds

    write_crds(args.output)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
