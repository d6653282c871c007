"""`kubectl campaign`: the parser and the dispatch to its commands, nothing else.

Installed as the console script `kubectl-campaign`, so kubectl finds it as a plugin. Each command is
one module with its view, its text and its `run_*`: `campaign_list`, `campaign_status`,
`campaign_plan`, `campaign_events`, `campaign_report` and `campaign_actions` (suspend, resume, retry,
cancel). Reads and writes go through `campaign_client`; decisions come from `state/` and `logic/`, the
operator's own code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from shardops import __version__
from shardops.api.store import DEFAULT_S3_PREFIX
from shardops.cli.campaign_actions import run_cancel, run_resume, run_retry, run_suspend
from shardops.cli.campaign_apply import run_apply
from shardops.cli.campaign_client import (
    EXIT_BAD_STATE,
    EXIT_NO_ACCESS,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CliError,
    connect,
)
from shardops.cli.campaign_completion import COMPLETE_COMMAND, SHELLS, print_candidates, script
from shardops.cli.campaign_events import run_events
from shardops.cli.campaign_list import run_list
from shardops.cli.campaign_plan import run_plan
from shardops.cli.campaign_purge import run_purge
from shardops.cli.campaign_report import run_report
from shardops.cli.campaign_results import DEFAULT_CUSTOM_ID, FORMATS, run_results
from shardops.cli.campaign_status import WATCH_INTERVAL_SECONDS, run_status
from shardops.cli.command import Context
from shardops.cli.text import parse_duration
from shardops.clock import utcnow
from shardops.k8s.api import DEFAULT_TIMEOUT_SECONDS, ApiError

OUTPUTS: tuple[str, ...] = ("human", "json", "yaml")
# `-o name` prints kind.group/name as `kubectl get -o name` does: for list only.
LIST_OUTPUTS: tuple[str, ...] = (*OUTPUTS, "name")

EPILOG = """\
exit codes:
  0  ok
  1  the thing asked about is in a bad state (report: a checklist line failed; retry: nothing to
     retry or a retry still pending; plan: the operator could not read the items)
  2  usage error
  3  not found: the campaign, the shard, or the shardops CRDs themselves
  4  no cluster access: no kubeconfig, API server unreachable, credentials rejected, or forbidden (RBAC)

Global flags (-n, --kubeconfig, --context, --as, --request-timeout, -o) go before or after the command.
Actions are recorded requests on the Campaign (spec.suspend, spec.retry, an annotation for cancel)
plus an Event; shard status is never written: the operator acts on the request.
See docs/user-guide.md.
"""


def _global_flags(top: bool, outputs: Sequence[str], with_output: bool = True) -> argparse.ArgumentParser:
    """The same flags on the top parser and on every command, so they work before or after it.
    On commands the default is SUPPRESS: a flag given before the command is not reset after it.
    Spelled and read as kubectl's own. `outputs`: what -o takes there."""
    parser = argparse.ArgumentParser(add_help=False)

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "-n",
        "--namespace",
        default=default(None),
        help="namespace of the campaign (default: the kubeconfig context's, else default)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument(
        "--context",
        default=default(None),
        help="the kubeconfig context to use: its cluster, user and namespace (default: current-context)",
    )
    parser.add_argument(
        "--as",
        dest="impersonate",
        metavar="USER",
        default=default(None),
        help="user to impersonate for every request, a regular user or system:serviceaccount:NS:NAME",
    )
    parser.add_argument(
        "--request-timeout",
        type=_request_timeout,
        metavar="DURATION",
        default=default(DEFAULT_TIMEOUT_SECONDS),
        help="how long to wait for one API server request before giving up: seconds, or a number with "
        f"a unit (1s, 2m, 3h); 0 waits as long as it takes (default {DEFAULT_TIMEOUT_SECONDS:g}s)",
    )
    if not with_output:
        return parser
    parser.add_argument(
        "-o",
        "--output",
        choices=outputs,
        default=default("human"),
        help="output format: human (default), json or yaml; list also takes name",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl campaign",
        description="Look into shardops campaigns and record actions on them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_flags(top=True, outputs=LIST_OUTPUTS)],
    )
    parser.add_argument("--version", action="version", version=f"kubectl-campaign (shardops) {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    flags = {outputs: _global_flags(top=False, outputs=outputs) for outputs in (OUTPUTS, LIST_OUTPUTS)}
    # `results` writes JSONL only; its -o names the file, as the command's users expect.
    flags[()] = _global_flags(top=False, outputs=(), with_output=False)

    def command(
        name: str, help_text: str, run: Callable[[Context], int], outputs: tuple[str, ...] = OUTPUTS
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[flags[outputs]],
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=run, outputs=outputs)
        return sub

    listing = command(
        "list", "campaigns with phase, progress, spend and blocked shards", run_list, LIST_OUTPUTS
    )
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="campaigns of every namespace")
    listing.add_argument("--no-headers", action="store_true", help="leave out the header line")

    status = command(
        "status",
        "counts per phase, running shards, oldest pending, breakers, budget, conditions, time left",
        run_status,
    )
    status.add_argument("name", help="campaign name")
    status.add_argument("-w", "--watch", action="store_true", help="redraw until Ctrl-C")
    status.add_argument(
        "--interval",
        type=_positive_float,
        default=WATCH_INTERVAL_SECONDS,
        help=f"seconds between redraws with --watch (default {WATCH_INTERVAL_SECONDS:g})",
    )

    plan = command(
        "plan",
        "dry run: what the scheduler would do on its next pass and what limits it; changes nothing",
        run_plan,
    )
    plan.add_argument("name", help="campaign name")

    events = command(
        "events", "a shard's timeline: history and Events (claimed, heartbeat, completed/failed)", run_events
    )
    events.add_argument("shard", help="shard name, for example mycampaign-00003")
    events.add_argument(
        "--s3-endpoint", metavar="URL", help="reach the S3 store at this URL (a shard folded into the ledger)"
    )

    results = command(
        "results",
        "every finished item's result in item order as JSONL (index, key, item, result, cost, shard, "
        "attempt); works while the campaign runs",
        run_results,
        outputs=(),
    )
    results.add_argument("name", help="campaign name")
    results.add_argument(
        "--format",
        choices=FORMATS,
        default="jsonl",
        help=(
            "jsonl (default) or openai: OpenAI's batch output file (custom_id from --custom-id, or the "
            "batch lines' own)"
        ),
    )
    results.add_argument(
        "--custom-id",
        default=DEFAULT_CUSTOM_ID,
        metavar="FIELD",
        help=f"with --format openai: the item field that is the custom_id (default {DEFAULT_CUSTOM_ID})",
    )
    results.add_argument(
        "--error-file",
        metavar="FILE",
        help="with --format openai: write the errored items' lines (OpenAI's error file) to FILE",
    )
    results.add_argument(
        "--failed",
        action="store_true",
        help="list the items not done (with their shard's lastError) and the errored ones instead",
    )
    results.add_argument(
        "-o",
        "--output",
        dest="output_file",
        metavar="FILE",
        help="write to FILE instead of stdout (a progress line on a terminal)",
    )
    results.add_argument(
        "--s3-endpoint",
        metavar="URL",
        help="reach the S3 store at this URL instead of the one the campaign records (e.g. a port-forward)",
    )

    apply = command(
        "apply",
        "create or update a Campaign from a manifest; --items uploads a local JSONL file as its input",
        run_apply,
    )
    apply.add_argument("-f", "--filename", required=True, metavar="FILE", help="the Campaign manifest (YAML)")
    apply.add_argument(
        "--items",
        metavar="JSONL",
        help="a local JSONL file (.gz: gzip) of items: checked, uploaded to S3, set as spec.itemsFrom.object",
    )
    apply.add_argument(
        "--bucket", help="bucket to upload to (default: the manifest's spec.resultStore.s3.bucket)"
    )
    apply.add_argument(
        "--s3-endpoint",
        metavar="URL",
        help="S3 API URL (default: the manifest's spec.resultStore.s3.endpoint)",
    )
    apply.add_argument("--prefix", help=f"key prefix (default: the manifest's, else {DEFAULT_S3_PREFIX})")

    purge = command(
        "purge",
        "delete a campaign and every result it stored (results otherwise outlive it); --yes to do it",
        run_purge,
    )
    purge.add_argument("name", help="campaign name")
    purge.add_argument("--yes", action="store_true", help="really delete (without it: say what would go)")
    purge.add_argument("--s3-endpoint", metavar="URL", help="reach the S3 store at this URL instead")

    report = command(
        "report", "closing report and checklist (exit 1 when a checklist line fails)", run_report
    )
    report.add_argument("name", help="campaign name")

    suspend = command(
        "suspend", "stop claiming new shards (spec.suspend=true); running ones finish", run_suspend
    )
    suspend.add_argument("name", help="campaign name")

    resume = command("resume", "claim again (spec.suspend=false; withdraws a cancel)", run_resume)
    resume.add_argument("name", help="campaign name")

    retry = command(
        "retry",
        "send Blocked/Failed shards back to Pending, attempts reset (bumps spec.retry.generation)",
        run_retry,
    )
    retry.add_argument("name", help="campaign name")
    retry.add_argument("--blocked", action="store_true", help="only Blocked shards")
    retry.add_argument("--failed", action="store_true", help="only Failed shards")
    retry.add_argument(
        "--shard",
        action="append",
        default=[],
        metavar="SHARD",
        help="only this shard (repeatable); it must be Blocked or Failed",
    )
    retry.add_argument(
        "--errored",
        action="store_true",
        help="instead: rerun just the items that errored in Done shards (same keys; the others stay)",
    )

    cancel = command(
        "cancel",
        "suspend and mark cancelled (annotation shardops.dev/cancelled); --delete deletes it",
        run_cancel,
    )
    cancel.add_argument("name", help="campaign name")
    cancel.add_argument(
        "--delete",
        action="store_true",
        help="delete the Campaign (its shards and worker Jobs go with it; stored results stay)",
    )
    completion = command(
        "completion",
        "print a shell completion script for kubectl-campaign: source <(kubectl campaign completion bash); "
        "`kubectl campaign <TAB>` completes through kubectl itself (kubectl_complete-campaign)",
        run_completion,
        outputs=(),
    )
    completion.add_argument("shell", choices=SHELLS, help="bash or zsh")
    return parser


def run_completion(ctx: Context) -> int:
    ctx.stdout.write(script(ctx.args.shell))
    return EXIT_OK


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The flags, with an -o given before the command checked against what the command prints
    (argparse exits 2 otherwise)."""
    args = parser.parse_args(list(argv))
    if not args.outputs:
        if args.output != "human":
            parser.error(f"argument -o/--output: {args.command} writes JSONL; after it, -o names a file")
        return args
    if args.output not in args.outputs:
        parser.error(
            f"argument -o/--output: {args.command} prints {', '.join(args.outputs)}, not {args.output}"
        )
    return args


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _request_timeout(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid timeout {text!r}: a whole number of seconds, or a number followed by its unit "
            "(e.g. 1s | 2m | 3h); 0 for no timeout"
        ) from None


def client_for(args: argparse.Namespace) -> Client:
    """The client the connection flags ask for, as kubectl reads them."""
    return Client(
        connect(
            args.kubeconfig, context=args.context, impersonate=args.impersonate, timeout=args.request_timeout
        )
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    make_client: Callable[[argparse.Namespace], Client] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    clock: Callable[[], dt.datetime] = utcnow,
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == [COMPLETE_COMMAND]:
        return print_candidates(parser, words[1:], out, kubectl=False)
    try:
        # argparse prints usage errors and --help itself: to the streams given.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parse_args(parser, words)
    except SystemExit as stop:
        return int(stop.code) if isinstance(stop.code, int) else EXIT_USAGE
    factory = make_client or client_for
    ctx = Context(args=args, make_client=lambda: factory(args), stdout=out, stderr=err, clock=clock)
    try:
        result: int = args.run(ctx)
        return result
    except CliError as error:
        ctx.err(f"error: {error.message}")
        return error.exit_code
    except ApiError as error:
        ctx.err(f"error: the API server answered {error.status} {error.reason}: {error.message}")
        return EXIT_BAD_STATE if error.status < 500 else EXIT_NO_ACCESS
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())


def kubectl_complete_main() -> int:
    """`kubectl_complete-campaign`: kubectl passes the words after `kubectl campaign`."""
    return print_candidates(build_parser(), sys.argv[1:], sys.stdout, kubectl=True)
