"""`kubectl campaign` end to end against an in-memory API server: flags, exit codes, error messages,
and what each action writes (and that no action writes shard status)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from shardops.api.names import CANCELLED_ANNOTATION
from shardops.cli import campaign as cli
from shardops.cli.campaign_client import REPORTING_CONTROLLER, Client, connect, default_namespace
from shardops.cli.campaign_status import watch_status
from shardops.cli.command import Context
from shardops.k8s.api import CONFIGMAPS, Conflict, Forbidden
from shardops.store.configmap import ConfigMapStore
from shardops.store.records import ItemRecord, ResultMeta, StoredResult, encode_result
from tests.clikit import (
    NOW,
    campaign_body,
    cluster,
    done_status,
    forbidden,
    run,
    shard_body,
    unauthorized,
)
from tests.fakekube import Call, FakeKube


def papers(*, fail: Any = None, **spec: Any) -> FakeKube:
    kube = cluster(
        campaign_body(items=3, **spec),
        shard_body("papers", 0, "Done", status=done_status(60)),
        shard_body(
            "papers",
            1,
            "Blocked",
            attempt=3,
            status={"lastError": {"class": "timeout", "message": "slow", "event": "e1"}},
        ),
        shard_body(
            "papers",
            2,
            "Failed",
            status={"lastError": {"class": "invalid-input", "message": "bad", "event": "e2"}},
        ),
    )
    if fail is not None:
        kube.fail = fail
    return kube


def no_shard_status_writes(kube: FakeKube) -> None:
    for call in kube.writes():
        assert "/shards" not in call.path, f"an action wrote a shard: {call}"


# --- flags and usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "ns", "-o", "json", "status", "papers"],
        ["status", "papers", "-n", "ns", "-o", "json"],
        ["-o", "json", "status", "-n", "ns", "papers"],
    ],
)
def test_global_flags_work_before_and_after_the_command(argv: list[str]) -> None:
    result = run(papers(), *argv)
    assert result.code == 0, result.err
    assert result.json()["name"] == "papers"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["status"],
        ["status", "papers", "-o", "xml"],
        ["status", "papers", "-A"],
        ["status", "papers", "--watch", "--interval", "0"],
        ["frobnicate", "papers"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    result = run(papers(), *argv)
    assert result.code == 2
    assert result.err  # argparse says what is wrong


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for line in (
        "0  ok",
        "1  the thing asked about is in a bad state",
        "2  usage error",
        "3  not found",
        "4  no cluster access",
    ):
        assert line in text


# --- errors -------------------------------------------------------------------------------------------


def test_a_missing_campaign_is_exit_3_and_names_the_ones_there() -> None:
    result = run(papers(), "-n", "ns", "status", "nope")
    assert result.code == 3
    assert (
        result.err.strip() == 'error: campaign "nope" not found in namespace "ns" (campaigns there: papers)'
    )


def test_a_missing_campaign_in_an_empty_namespace_points_to_list_all() -> None:
    result = run(papers(), "-n", "other", "report", "nope")
    assert result.code == 3
    assert "no campaigns in that namespace; try kubectl campaign list -A" in result.err


@pytest.mark.parametrize("argv", [["status", "papers"], ["list"], ["list", "-A"], ["events", "papers-00001"]])
def test_a_missing_crd_is_exit_3_with_how_to_install(argv: list[str]) -> None:
    result = run(cluster(served=set()), "-n", "ns", *argv)
    assert result.code == 3
    assert "CRD is not installed on https://fake.example:6443" in result.err
    assert "kubectl apply --server-side -f crds/" in result.err


def test_forbidden_is_exit_4_with_the_api_servers_reason() -> None:
    kube = papers(fail=lambda call: forbidden(call) if call.method == "LIST" else None)
    result = run(kube, "-n", "ns", "status", "papers")
    assert result.code == 4
    assert result.err.startswith(
        "error: forbidden: cannot list at /apis/shardops.dev/v1alpha1/namespaces/ns/shards"
    )
    assert "list the shards of campaign papers needs that permission" in result.err


def test_rejected_credentials_are_exit_4() -> None:
    result = run(papers(fail=unauthorized), "-n", "ns", "list")
    assert result.code == 4
    assert "rejected the credentials (401 Unauthorized)" in result.err


def test_an_unreachable_api_server_is_exit_4() -> None:
    def refused(call: Call) -> BaseException:
        return urllib3.exceptions.MaxRetryError(None, "/x", ConnectionRefusedError(111, "Connection refused"))  # type: ignore[arg-type]

    result = run(papers(fail=refused), "-n", "ns", "list")
    assert result.code == 4
    assert "cannot reach the Kubernetes API server at https://fake.example:6443" in result.err
    assert "Connection refused" in result.err


def test_a_missing_kubeconfig_is_exit_4(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--kubeconfig", str(tmp_path / "nope"), "list"], stdout=out, stderr=err)
    assert code == 4
    assert "does not exist" in err.getvalue()
    with pytest.raises(cli.CliError):
        connect(str(tmp_path / "nope"))


def test_the_namespace_defaults_to_the_kubeconfig_context(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [
            {"name": "with", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
            {"name": "without", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "with",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert default_namespace(str(path)) == "team-a"
    path.write_text(yaml.safe_dump({**config, "current-context": "without"}))
    assert default_namespace(str(path)) == "default"


# --- reads -------------------------------------------------------------------------------------------


def test_report_exit_code_follows_the_checklist() -> None:
    clean = cluster(
        campaign_body(items=1, status={"phase": "Succeeded", "spent": 0.0}),
        shard_body("papers", 0, "Done", status=done_status(60)),
    )
    assert run(clean, "-n", "ns", "report", "papers").code == 0
    dirty = cluster(
        campaign_body(items=1, status={"phase": "Succeeded", "spent": 0.0}),
        shard_body("papers", 0, "Done", status=done_status(60), managers=("kubectl-patch",)),
    )
    result = run(dirty, "-n", "ns", "-o", "json", "report", "papers")
    assert result.code == 1
    assert result.json()["passed"] is False


def test_plan_of_a_campaign_whose_items_configmap_is_missing_is_exit_1() -> None:
    body = campaign_body(items=0)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "input", "key": "items.jsonl"}
    result = run(cluster(body), "-n", "ns", "plan", "papers")
    assert result.code == 1
    assert "its items are unavailable (ItemsNotFound)" in result.err
    assert "ConfigMap input in namespace ns" in result.err


def test_plan_counts_the_items_of_the_configmap() -> None:
    body = campaign_body(items=0)
    del body["spec"]["items"]
    body["spec"]["itemsFrom"] = {"configMapName": "input", "key": "items.jsonl"}
    kube = cluster(body)
    kube.add(
        CONFIGMAPS,
        {"metadata": {"name": "input", "namespace": "ns"}, "data": {"items.jsonl": '{"a": 1}\n\n{"a": 2}\n'}},
    )
    result = run(kube, "-n", "ns", "-o", "json", "plan", "papers")
    assert result.code == 0, result.err
    data = result.json()
    assert data["observed"]["itemsTotal"] == 2
    assert data["plan"]["materialize"] == 2
    assert not kube.writes()  # a dry run


def test_events_falls_back_to_history_when_events_are_not_readable() -> None:
    kube = papers(fail=lambda call: forbidden(call) if "events" in call.path else None)
    result = run(kube, "-n", "ns", "events", "papers-00001")
    assert result.code == 0, result.err
    assert "warning: events not readable (Forbidden" in result.out


def test_events_of_a_missing_shard_is_exit_3() -> None:
    result = run(papers(), "-n", "ns", "events", "papers-00009")
    assert result.code == 3
    assert 'shard "papers-00009" not found in namespace "ns"' in result.err


def test_list_prints_nothing_on_stdout_when_there_is_nothing() -> None:
    result = run(cluster(), "-n", "ns", "list")
    assert (result.code, result.out) == (0, "")
    assert result.err.strip() == "No campaigns found in namespace ns."


# --- watch --------------------------------------------------------------------------------------------


def _context(kube: FakeKube, *argv: str) -> tuple[Context, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(list(argv))
    ctx = Context(args=args, make_client=lambda: Client(kube), stdout=out, stderr=err, clock=lambda: NOW)  # type: ignore[arg-type]
    return ctx, out, err


def test_watch_ends_with_exit_3_when_the_campaign_is_deleted() -> None:
    kube = papers()
    ctx, out, err = _context(kube, "-n", "ns", "-o", "json", "status", "papers", "--watch")
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        kube.objects.pop(("campaigns", "ns", "papers"))

    assert watch_status(ctx, "papers", 2.0, sleep=sleep) == 3
    frames = out.getvalue().splitlines()
    assert len(frames) == 1 and json.loads(frames[0])["name"] == "papers"
    assert naps == [2.0]
    assert "campaign ns/papers is gone (deleted while watching)" in err.getvalue()


def test_watch_redraws_until_ctrl_c_and_survives_a_lost_connection() -> None:
    kube = papers()
    ctx, out, err = _context(kube, "-n", "ns", "status", "papers", "--watch")
    naps = 0

    def sleep(_: float) -> None:
        nonlocal naps
        naps += 1
        if naps == 1:
            kube.fail = lambda call: urllib3.exceptions.ProtocolError("connection reset")
        elif naps == 2:
            kube.fail = lambda call: None
        elif naps == 3:
            raise KeyboardInterrupt

    assert watch_status(ctx, "papers", 2.0, sleep=sleep) == 0
    assert out.getvalue().count("Campaign ns/papers:") == 2
    assert "cannot reach the Kubernetes API server" in err.getvalue()
    assert "(retrying in 2s)" in err.getvalue()


def test_watch_of_a_missing_campaign_fails_at_once() -> None:
    ctx, out, _ = _context(cluster(), "-n", "ns", "status", "nope", "--watch")
    with pytest.raises(cli.CliError) as error:
        watch_status(ctx, "nope", 2.0, sleep=lambda _: None)
    assert error.value.exit_code == 3
    assert out.getvalue() == ""


# --- actions ------------------------------------------------------------------------------------------


def _events(kube: FakeKube) -> list[dict]:
    return kube.events()


def test_suspend_patches_the_spec_and_records_an_event_once() -> None:
    kube = papers()
    result = run(kube, "-n", "ns", "suspend", "papers")
    assert result.code == 0, result.err
    campaign = kube.objects[("campaigns", "ns", "papers")]
    assert campaign["spec"]["suspend"] is True
    [event] = _events(kube)
    assert (event["reason"], event["reportingController"], event["reportingInstance"]) == (
        "SuspendRequested",
        REPORTING_CONTROLLER,
        "alice",
    )
    assert event["regarding"]["kind"] == "Campaign" and event["regarding"]["name"] == "papers"
    assert "by alice, kubectl campaign suspend" in event["note"]
    assert f"recorded as Event {event['metadata']['name']} (by alice)" in result.out
    writes = len(kube.writes())
    again = run(kube, "-n", "ns", "suspend", "papers")
    assert again.code == 0
    assert "already suspended" in again.out
    assert len(kube.writes()) == writes  # nothing written the second time
    no_shard_status_writes(kube)


def test_resume_withdraws_a_cancel() -> None:
    kube = papers(suspend=True, annotations={CANCELLED_ANNOTATION: "2026-03-01T10:00:00Z"})
    result = run(kube, "-n", "ns", "-o", "json", "resume", "papers")
    assert result.code == 0, result.err
    campaign = kube.objects[("campaigns", "ns", "papers")]
    assert campaign["spec"]["suspend"] is False
    assert CANCELLED_ANNOTATION not in (campaign["metadata"].get("annotations") or {})
    assert result.json()["event"] == _events(kube)[0]["metadata"]["name"]
    assert _events(kube)[0]["reason"] == "ResumeRequested"
    assert "nothing changed" in run(kube, "-n", "ns", "resume", "papers").out


def test_cancel_suspends_and_marks_or_deletes() -> None:
    kube = papers()
    assert run(kube, "-n", "ns", "cancel", "papers").code == 0
    campaign = kube.objects[("campaigns", "ns", "papers")]
    assert campaign["spec"]["suspend"] is True
    assert campaign["metadata"]["annotations"][CANCELLED_ANNOTATION] == "2026-03-01T12:00:00Z"
    assert [e["reason"] for e in _events(kube)] == ["CancelRequested"]
    assert "already cancelled" in run(kube, "-n", "ns", "cancel", "papers").out
    assert run(kube, "-n", "ns", "cancel", "papers", "--delete").code == 0
    assert ("campaigns", "ns", "papers") not in kube.objects
    assert sorted(e["reason"] for e in _events(kube)) == ["CancelRequested", "DeleteRequested"]
    no_shard_status_writes(kube)


def test_retry_blocked_writes_the_shard_list_into_the_spec_with_a_resource_version_precondition() -> None:
    kube = papers()
    result = run(kube, "-n", "ns", "retry", "papers", "--blocked")
    assert result.code == 0, result.err
    [patch] = [c for c in kube.writes() if c.method == "PATCH"]
    assert patch.query == {"rv": "100"}
    assert patch.body == {"spec": {"retry": {"generation": 1, "shards": ["papers-00001"]}}}
    campaign = kube.objects[("campaigns", "ns", "papers")]
    assert campaign["spec"]["retry"] == {"generation": 1, "shards": ["papers-00001"]}
    assert "shardops.dev/retry-shards" not in (campaign["metadata"].get("annotations") or {})
    [event] = _events(kube)
    assert event["reason"] == "RetryRequested"
    assert "1 shard(s) to retry (only these shards): papers-00001" in event["note"]
    no_shard_status_writes(kube)


def test_retry_reads_again_after_a_conflict() -> None:
    kube = papers()
    conflicts = iter([True])

    def once(call: Call) -> BaseException | None:
        if call.method == "PATCH" and next(conflicts, False):
            return Conflict(409, "Conflict", "the object has been modified")
        return None

    kube.fail = once
    result = run(kube, "-n", "ns", "retry", "papers")
    assert result.code == 0, result.err
    assert [c.method for c in kube.calls].count("PATCH") == 2
    assert kube.objects[("campaigns", "ns", "papers")]["spec"]["retry"] == {"generation": 1}


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["--shard", "papers-00000"], 1, "shard papers-00000 is Done, not Blocked or Failed"),
        (["--shard", "papers-00042"], 3, 'shard "papers-00042" is not a shard of campaign papers'),
    ],
)
def test_retry_refusals_write_nothing(argv: list[str], code: int, text: str) -> None:
    kube = papers()
    result = run(kube, "-n", "ns", "retry", "papers", *argv)
    assert result.code == code
    assert text in result.err
    assert kube.writes() == []


def test_an_action_whose_event_cannot_be_written_still_succeeds_with_a_warning() -> None:
    kube = papers(
        fail=lambda call: (
            Forbidden(403, "Forbidden", "no events")
            if call.method == "POST" and "events" in call.path
            else None
        )
    )
    result = run(kube, "-n", "ns", "suspend", "papers")
    assert result.code == 0
    assert kube.objects[("campaigns", "ns", "papers")]["spec"]["suspend"] is True
    warning = "warning: the request is recorded in the Campaign, but its Event (SuspendRequested) could not"
    assert f"{warning} be created" in result.out


def test_a_forbidden_action_is_exit_4_and_changes_nothing() -> None:
    kube = papers(fail=lambda call: forbidden(call) if call.method == "PATCH" else None)
    result = run(kube, "-n", "ns", "suspend", "papers")
    assert result.code == 4
    assert "patch campaign papers needs that permission" in result.err
    assert kube.objects[("campaigns", "ns", "papers")]["spec"].get("suspend") is None
    assert _events(kube) == []


def test_purge_with_the_configmap_store_deletes_the_keys_results_and_the_campaigns_attempts() -> None:
    kube = papers()
    store = ConfigMapStore(kube, "ns")  # type: ignore[arg-type]

    def stored(key: str, campaign: str, token: int) -> StoredResult:
        text = encode_result(key, [(0, "k", token)])
        return store.store_result(key, text, ResultMeta(campaign, f"{campaign}-00000", "w", 1, token), 1)[0]

    live = stored("key-0", "papers", 2)
    stored("key-0", "papers", 1)  # a stale holder's: committed by nothing, purged all the same
    store.commit("key-0", live)
    store.save_items("key-0", "papers", {"k": ItemRecord(1)}, "papers-00000", 2)
    others = stored("key-0", "other", 7)  # another campaign's claim of the same key: its Done may name it
    unrelated = stored("key-9", "papers", 1)  # not a key of the campaign's shards
    result = run(kube, "-n", "ns", "purge", "papers", "--yes")
    assert result.code == 0, result.err
    assert "4 stored object(s) of 3 shard key(s)" in result.out, result.out
    left = sorted(name for (plural, _, name) in kube.objects if plural == "configmaps")
    assert left == sorted([others.name, unrelated.name])
