"""`kubectl campaign`: status, plan, events, report and recorded actions on campaigns.

Installed as the console script `kubectl-campaign`, so kubectl finds it as a plugin. Reads go through
`cli.campaign_client`, decisions come from `operator.observe` and `logic/` (the operator's own code),
and the views and their text are pure (`cli.campaign_views`, `cli.render`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from pydantic import ValidationError

from shardops.api.campaign import Campaign
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard
from shardops.cli import campaign_actions as actions
from shardops.cli import campaign_views as views
from shardops.cli import render
from shardops.cli.campaign_client import (
    EXIT_BAD_STATE,
    EXIT_NO_ACCESS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CliError,
    bad_state,
    connect,
    default_namespace,
)
from shardops.k8s.api import ApiError, Conflict
from shardops.k8s.campaigns import ItemsUnavailable

JSON = dict[str, Any]
OUTPUTS = ("human", "json", "yaml")
WATCH_INTERVAL_SECONDS = 2.0
CONFLICT_ROUNDS = 3

EPILOG = """\
exit codes:
  0  ok
  1  the thing asked about is in a bad state (report: a checklist line failed; retry: nothing to
     retry or a retry still pending; plan: the operator could not read the items)
  2  usage error
  3  not found: the campaign, the shard, or the shardops CRDs themselves
  4  no cluster access: no kubeconfig, API server unreachable, credentials rejected, or forbidden (RBAC)

Global flags (-n, --kubeconfig, -o) go before or after the command.
Actions are recorded requests on the Campaign (spec.suspend, spec.retry, an annotation for cancel)
plus an Event; shard status is never written: the operator acts on the request.
See docs/user-guide.md.
"""


@dataclass
class Context:
    """What a command needs: a client (made on first use), where to print, and the clock."""

    args: argparse.Namespace
    make_client: Callable[[], Client]
    stdout: TextIO
    stderr: TextIO
    clock: Callable[[], dt.datetime]
    _client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.make_client()
        return self._client

    @functools.cached_property
    def namespace(self) -> str:
        namespace: str | None = self.args.namespace
        return namespace or default_namespace(self.args.kubeconfig)

    @property
    def output(self) -> str:
        return str(self.args.output)

    def out(self, text: str) -> None:
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(text if text.endswith("\n") else text + "\n")
        self.stderr.flush()

    def show(self, view: Any, human: Callable[[Any], str]) -> None:
        self.out(formatted(self.output, view, human))


def formatted(output: str, view: Any, human: Callable[[Any], str]) -> str:
    if output == "json":
        return render.as_json(view.as_dict())
    if output == "yaml":
        return render.as_yaml(view.as_dict())
    return human(view)


# --- parser ----------------------------------------------------------------------------------------


def _global_flags(top: bool) -> argparse.ArgumentParser:
    """The same flags on the top parser and on every command, so they work before or after it.
    On commands the default is SUPPRESS: a flag given before the command is not reset after it."""
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
        "-o", "--output", choices=OUTPUTS, default=default("human"), help="output format (default: human)"
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl campaign",
        description="Look into shardops campaigns and record actions on them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_flags(top=True)],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    flags = _global_flags(top=False)

    def command(name: str, help_text: str, run: Callable[[Context], int]) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[flags],
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=run)
        return sub

    listing = command("list", "campaigns with phase, progress, spend and blocked shards", run_list)
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="campaigns of every namespace")

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
    return parser


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


# --- reading ---------------------------------------------------------------------------------------


def parse_campaign(body: JSON) -> Campaign:
    try:
        return Campaign.parse(body)
    except ValidationError as error:
        name = (body.get("metadata") or {}).get("name")
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_state(
            f"campaign {name} does not parse ({where}: {first.get('msg')}); "
            f"see kubectl get campaign {name} -o yaml"
        ) from None


def load(ctx: Context, name: str) -> tuple[JSON, Campaign, list[JSON], list[Shard]]:
    namespace = ctx.namespace
    body = ctx.client.get_campaign(namespace, name)
    campaign = parse_campaign(body)
    shard_bodies = ctx.client.list_shards(namespace, name)
    try:
        shards = views.parse_shards(shard_bodies)
    except ValueError as error:
        raise bad_state(str(error)) from None
    return body, campaign, shard_bodies, shards


# --- commands ------------------------------------------------------------------------------------


def run_list(ctx: Context) -> int:
    all_namespaces = bool(ctx.args.all_namespaces)
    namespace = None if all_namespaces else ctx.namespace
    rows = views.campaign_rows(ctx.client.list_campaigns(namespace), ctx.clock())
    if ctx.output != "human":
        data = {"items": [r.as_dict() for r in rows]}
        ctx.out(render.as_json(data) if ctx.output == "json" else render.as_yaml(data))
        return EXIT_OK
    if not rows:
        ctx.err("No campaigns found" + ("." if all_namespaces else f" in namespace {namespace}."))
        return EXIT_OK
    ctx.out(render.render_list(rows, all_namespaces=all_namespaces))
    return EXIT_OK


def status_frame(ctx: Context, name: str) -> views.StatusView:
    _, campaign, _, shards = load(ctx, name)
    return views.status_view(campaign, shards, ctx.clock())


def run_status(ctx: Context) -> int:
    name = ctx.args.name
    if not ctx.args.watch:
        ctx.show(status_frame(ctx, name), render.render_status)
        return EXIT_OK
    return watch_status(ctx, name, ctx.args.interval)


CLEAR_SCREEN = "\x1b[H\x1b[2J"


def watch_status(
    ctx: Context, name: str, interval: float, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Redraw every `interval` seconds until Ctrl-C: the screen on a terminal, one JSON document per line
    with -o json, YAML documents with -o yaml. A deleted campaign ends the watch (exit 3); a lost
    connection is reported and retried."""
    tty = ctx.output == "human" and ctx.stdout.isatty()
    drawn = False
    try:
        while True:
            try:
                view = status_frame(ctx, name)
            except CliError as error:
                if error.exit_code == EXIT_NOT_FOUND and drawn:
                    ctx.err(f"campaign {ctx.namespace}/{name} is gone (deleted while watching)")
                    return EXIT_NOT_FOUND
                if error.exit_code == EXIT_NO_ACCESS and drawn:
                    ctx.err(f"{error.message} (retrying in {interval:g}s)")
                    sleep(interval)
                    continue
                raise
            if ctx.output == "json":
                frame = json.dumps(view.as_dict(), ensure_ascii=False)
            elif ctx.output == "yaml":
                frame = "---\n" + render.as_yaml(view.as_dict())
            elif tty:
                frame = (
                    CLEAR_SCREEN + render.render_status(view) + f"\n\n(every {interval:g}s; Ctrl-C to stop)"
                )
            else:
                frame = render.render_status(view) + "\n"
            ctx.out(frame)
            drawn = True
            sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK


def items_total_for_plan(ctx: Context, campaign: Campaign) -> int:
    """What the operator counts: inline items, or the lines of the itemsFrom ConfigMap key."""
    inline = campaign.spec.inline_items_total
    if inline is not None:
        return inline
    source = campaign.spec.items_from
    if source is None:  # pragma: no cover - the model requires one of the two
        raise bad_state("the campaign has neither items nor itemsFrom")
    try:
        return ctx.client.count_items(campaign.namespace, source)
    except ItemsUnavailable as problem:
        raise bad_state(
            f"the operator would not plan campaign {campaign.name}: its items are unavailable "
            f"({problem.reason}): {problem.message}"
        ) from None


def run_plan(ctx: Context) -> int:
    _, campaign, _, shards = load(ctx, ctx.args.name)
    items_total = items_total_for_plan(ctx, campaign)
    jobs, pods = ctx.client.list_workers(campaign.namespace, campaign.name)
    leases = {
        s.name: ctx.client.get_lease(campaign.namespace, s.lease_name)
        for s in shards
        if s.phase is ShardPhase.RUNNING
    }
    view = views.plan_view(campaign, shards, jobs, pods, leases, ctx.clock(), items_total)
    ctx.show(view, render.render_plan)
    return EXIT_OK


def run_events(ctx: Context) -> int:
    namespace = ctx.namespace
    body = ctx.client.get_shard(namespace, ctx.args.shard)
    try:
        shard = Shard.parse(body)
    except ValidationError as error:
        raise bad_state(f"shard {ctx.args.shard} does not parse: {error.errors()[0].get('msg')}") from None
    found, warning = ctx.client.shard_events(namespace, shard.name)
    warnings = [warning] if warning else []
    lease_seconds = max_attempts = None
    try:
        campaign = parse_campaign(ctx.client.get_campaign(namespace, shard.campaign_name))
        lease_seconds, max_attempts = campaign.spec.lease_seconds, campaign.spec.max_attempts
    except CliError as error:
        if error.exit_code not in (EXIT_NOT_FOUND, EXIT_NO_ACCESS, EXIT_BAD_STATE):
            raise
        warnings.append(f"campaign {shard.campaign_name} not readable ({error.message}): no lease times")
    view = views.timeline_view(
        shard, found, ctx.clock(), lease_seconds=lease_seconds, max_attempts=max_attempts, warnings=warnings
    )
    ctx.show(view, render.render_timeline)
    return EXIT_OK


def run_report(ctx: Context) -> int:
    _, campaign, shard_bodies, _ = load(ctx, ctx.args.name)
    view = views.report_view(campaign, shard_bodies, ctx.clock())
    ctx.show(view, render.render_report)
    return EXIT_OK if view.passed else EXIT_BAD_STATE


# --- actions -----------------------------------------------------------------------------------------


def _record(
    ctx: Context,
    action: str,
    body: JSON,
    *,
    reason: str,
    note: str,
    message: str,
    patch: JSON | None,
) -> actions.ActionResult:
    user = ctx.client.who_am_i()
    event = ctx.client.record_event(
        body, reason=reason, note=f"{note} (by {user}, kubectl campaign {action})", user=user, now=ctx.clock()
    )
    warnings: tuple[str, ...] = ()
    if event is None:
        warnings = (
            f"the request is recorded in the Campaign, but its Event ({reason}) could not be created",
        )
    metadata = body.get("metadata") or {}
    return actions.ActionResult(
        action=action,
        namespace=str(metadata.get("namespace")),
        name=str(metadata.get("name")),
        changed=True,
        message=message,
        patch=patch,
        event=event,
        user=user,
        warnings=warnings,
    )


def _unchanged(action: str, campaign: Campaign, message: str) -> actions.ActionResult:
    return actions.ActionResult(action, campaign.namespace, campaign.name, changed=False, message=message)


def _finish(ctx: Context, result: actions.ActionResult) -> int:
    ctx.show(result, render.render_action)
    for warning in result.warnings if ctx.output != "human" else ():
        ctx.err(f"warning: {warning}")
    return EXIT_OK


def run_suspend(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    if campaign.spec.suspend:
        return _finish(
            ctx, _unchanged("suspend", campaign, "already suspended (spec.suspend is true); nothing changed")
        )
    patch = actions.suspend_patch()
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    return _finish(
        ctx,
        _record(
            ctx,
            "suspend",
            patched,
            reason=actions.SUSPEND_REQUESTED,
            note="spec.suspend=true: no new claims or workers; running shards finish",
            message="suspend requested (spec.suspend=true): no new claims; running shards finish",
            patch=patch,
        ),
    )


def run_resume(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    cancelled = views.cancelled_at(campaign)
    if not campaign.spec.suspend and cancelled is None:
        return _finish(
            ctx, _unchanged("resume", campaign, "not suspended (spec.suspend is false); nothing changed")
        )
    patch = actions.resume_patch(campaign)
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    withdrawn = f"; the cancellation of {cancelled} is withdrawn" if cancelled else ""
    return _finish(
        ctx,
        _record(
            ctx,
            "resume",
            patched,
            reason=actions.RESUME_REQUESTED,
            note=f"spec.suspend=false: claiming resumes{withdrawn}",
            message=f"resume requested (spec.suspend=false){withdrawn}",
            patch=patch,
        ),
    )


def run_retry(ctx: Context) -> int:
    args = ctx.args
    for _ in range(CONFLICT_ROUNDS):
        _, campaign, _, shards = load(ctx, args.name)
        try:
            selection = actions.select_retry(
                campaign, shards, blocked=args.blocked, failed=args.failed, names=args.shard
            )
            patch = actions.retry_patch(campaign, selection)
        except actions.ActionRefused as refused:
            raise CliError(refused.exit_code, refused.message) from None
        try:
            patched = ctx.client.patch_campaign(
                campaign.namespace, campaign.name, patch, resource_version=campaign.metadata.resource_version
            )
        except Conflict:
            continue  # changed since we read it: read again and decide again
        generation = campaign.spec.retry.generation + 1
        scope = "every Blocked and Failed shard" if selection.everything else "only these shards"
        names = render.names_text(list(selection.shards), limit=20)
        count = len(selection.shards)
        return _finish(
            ctx,
            _record(
                ctx,
                "retry",
                patched,
                reason=actions.RETRY_REQUESTED,
                note=f"spec.retry.generation={generation}: {count} shard(s) to retry ({scope}): {names}",
                message=(
                    f"retry requested (spec.retry.generation={generation}): {count} shard(s), {scope}: "
                    f"{names}; the operator sends them back to Pending with attempts reset"
                ),
                patch=patch,
            ),
        )
    raise bad_state(f"campaign {args.name} kept changing while recording the retry; try again")


def run_cancel(ctx: Context) -> int:
    body = ctx.client.get_campaign(ctx.namespace, ctx.args.name)
    campaign = parse_campaign(body)
    if ctx.args.delete:
        user = ctx.client.who_am_i()
        event = ctx.client.record_event(
            body,
            reason=actions.DELETE_REQUESTED,
            note=f"campaign deleted by {user} (kubectl campaign cancel --delete)",
            user=user,
            now=ctx.clock(),
        )
        ctx.client.delete_campaign(campaign.namespace, campaign.name)
        result = actions.ActionResult(
            "cancel",
            campaign.namespace,
            campaign.name,
            changed=True,
            message="deleted: its shards and worker Jobs are garbage-collected; stored results stay",
            event=event,
            user=user,
        )
        return _finish(ctx, result)
    already = views.cancelled_at(campaign)
    if already is not None and campaign.spec.suspend:
        return _finish(
            ctx, _unchanged("cancel", campaign, f"already cancelled at {already}; nothing changed")
        )
    now = ctx.clock()
    patch = actions.cancel_patch(now)
    patched = ctx.client.patch_campaign(campaign.namespace, campaign.name, patch)
    return _finish(
        ctx,
        _record(
            ctx,
            "cancel",
            patched,
            reason=actions.CANCEL_REQUESTED,
            note="cancelled: spec.suspend=true and annotation shardops.dev/cancelled set",
            message=(
                "cancelled: suspended (spec.suspend=true) and marked shardops.dev/cancelled; "
                "running shards finish"
            ),
            patch=patch,
        ),
    )


# --- entry point ---------------------------------------------------------------------------------


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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
    try:
        # argparse prints usage errors and --help itself: to the streams given.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:
        return int(stop.code) if isinstance(stop.code, int) else EXIT_USAGE
    factory = make_client or (lambda a: Client(connect(a.kubeconfig)))
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
