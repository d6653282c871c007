"""`kubectl campaign` against a real API server, run as the kubectl plugin it is installed as.

The campaign's shards are moved through their life with `k8s.shards.apply_transition` under the
operator's and the worker's field managers, exactly the writes (status patches with a resourceVersion
precondition, one Event per transition) the operator and workers make; so the CLI reads real
managedFields, real Events (by field selector) and real history. No operator runs here: every
action must be a recorded request that changes no shard.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.harness import REPO_ROOT, Cluster
from testbed.kits import chart as chartkit

from shardops.api.campaign import Campaign
from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_KIND, CAMPAIGN_LABEL
from shardops.api.shard import Shard, ShardError, ShardResult
from shardops.cli import campaign as cli
from shardops.cli.campaign_client import REPORTING_CONTROLLER, Client, connect
from shardops.k8s import leases
from shardops.k8s.api import CAMPAIGNS, EVENTS, SHARDS, Kube, Resource
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.leases import Renewals
from shardops.logic.transitions import Action
from shardops.scheduler import builders

VENV_BIN = Path(sys.executable).parent
OPERATOR = Actor("shardops.dev/operator", "e2e-operator-standin")
WORKER = Actor("shardops.dev/worker", "e2e-worker-standin")
GUIDE = REPO_ROOT / "docs" / "user-guide.md"


# --- running the plugin ------------------------------------------------------------------------------


def plugin_env(cluster: Cluster, kubeconfig: Path | None = None) -> dict[str, str]:
    env = cluster.env()
    env["PATH"] = f"{cluster.bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def kc(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`kubectl campaign ...` through kubectl's plugin lookup (kubectl-campaign on the PATH)."""
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "campaign", *args],
        capture_output=True,
        text=True,
        check=False,
        env=plugin_env(cluster, kubeconfig),
        timeout=120,
    )


def kc_json(cluster: Cluster, *args: str) -> Any:
    result = kc(cluster, *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- a campaign mid-run, written the way the operator and workers write it -------------------------


@dataclass
class Scenario:
    namespace: str
    campaign: str
    kube: Kube

    def shard(self, index: int) -> Shard:
        return Shard.parse(self.kube.get(SHARDS, self.namespace, f"{self.campaign}-{index:05d}"))

    def versions(self) -> dict[str, str]:
        """resourceVersion of the Campaign and every Shard: a read changes none of them."""
        found = {
            "campaign": self.kube.get(CAMPAIGNS, self.namespace, self.campaign)["metadata"]["resourceVersion"]
        }
        for body in self.kube.list(
            SHARDS, self.namespace, label_selector=f"{CAMPAIGN_LABEL}={self.campaign}"
        ):
            found[body["metadata"]["name"]] = body["metadata"]["resourceVersion"]
        return found

    def shard_versions(self) -> dict[str, str]:
        return {k: v for k, v in self.versions().items() if k != "campaign"}


ITEMS = [{"paper": f"p{i:02d}", "source": "large"} for i in range(8)]
BUDGET = 5.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def build_campaign(cluster: Cluster, namespace: str, name: str) -> Scenario:
    """Six of eight items cut into shards: Done, Running (with a live Lease), Blocked after three
    rate-limited attempts, Failed (invalid input), Pending, and one created but still Queued."""
    kubeconfig = str(cluster.kubeconfig)
    operator = Kube.from_environment("shardops-operator", kubeconfig)
    worker = Kube.from_environment("shardops-worker", kubeconfig)
    body = {
        "apiVersion": API_GROUP_VERSION,
        "kind": CAMPAIGN_KIND,
        "metadata": {"name": name},
        "spec": {
            "items": ITEMS,
            "shardSize": 1,
            "maxConcurrency": 2,
            "maxAttempts": 3,
            "leaseSeconds": 60,
            "heartbeatSeconds": 10,
            "sources": [{"name": "large", "fallback": "small"}, {"name": "small"}],
            "budget": {"limit": BUDGET},
            "worker": {"image": "shardops:dev", "command": ["shardops-example-agent"]},
        },
    }
    campaign = Campaign.parse(operator.create(CAMPAIGNS, namespace, body))

    def create(index: int) -> Shard:
        # The operator's own builder: the same name, labels, owner, items, source and key it would use.
        return Shard.parse(operator.create(SHARDS, namespace, builders.shard_body(campaign, index, ITEMS)))

    def step(kube: Kube, actor: Actor, shard: Shard, action: Action, message: str, **updates: Any) -> Shard:
        attempt = updates.pop("attempt", None)
        request = TransitionRequest(action, message, updates=updates, attempt=attempt)
        return apply_transition(kube, shard, request, actor, _now())

    def claim(shard: Shard, attempt: int, holder: str) -> Shard:
        return step(
            worker,
            WORKER,
            shard,
            Action.CLAIM,
            f"claimed by {holder} (attempt {attempt})",
            owner=holder,
            lease_until=_now() + dt.timedelta(seconds=60),
            last_heartbeat=_now(),
            source="large",
            attempt=attempt,
        )

    shards = [step(operator, OPERATOR, create(i), Action.MATERIALIZE, f"items {i}..{i}") for i in range(5)]
    create(5)  # Queued: created, not yet materialized

    done = claim(shards[0], 1, "worker-a")
    step(
        worker,
        WORKER,
        done,
        Action.COMPLETE,
        "1 item done",
        result=ShardResult(ref="shardops-result-x", fingerprint="sha256:" + "0" * 64, bytes=12),
        cost=Decimal("1.25"),
        owner=None,
    )

    running = claim(shards[1], 1, "worker-b")
    leases.acquire(
        worker, namespace, running.lease_name, "worker-b", 60, _now(), seen=Renewals(time.monotonic)
    )

    blocked = shards[2]
    for attempt in (1, 2, 3):
        blocked = claim(blocked, attempt, "worker-c")
        error = ShardError(
            error_class="rate-limited", source="large", message="429 Too Many Requests", at=_now()
        )
        action = Action.BLOCK if attempt == 3 else Action.FAIL_RETRYABLE
        blocked = step(
            worker,
            WORKER,
            blocked,
            action,
            f"rate-limited: 429 (attempt {attempt} of 3)",
            last_error=error,
            owner=None,
        )

    failed = claim(shards[3], 1, "worker-d")
    step(
        worker,
        WORKER,
        failed,
        Action.FAIL_FINAL,
        "invalid-input: not a paper",
        last_error=ShardError(error_class="invalid-input", message="not a paper", at=_now()),
        owner=None,
        cost=Decimal("0.5"),
    )
    # The campaign status as the operator writes it (spent = the shards' costs).
    operator.patch(
        CAMPAIGNS,
        namespace,
        name,
        {
            "status": {
                "phase": "Running",
                "observedGeneration": 1,
                "spent": "1.75",
                "itemsTotal": len(ITEMS),
                "shardsTotal": len(ITEMS),
                "counts": {
                    "queued": 3,
                    "pending": 1,
                    "running": 1,
                    "done": 1,
                    "failed": 1,
                    "blocked": 1,
                    "total": 8,
                },
            }
        },
        subresource="status",
    )
    return Scenario(namespace, name, Kube.from_environment("e2e-cli", kubeconfig))


@pytest.fixture(scope="module")
def scenario(cluster: Cluster, crds_installed: None) -> Iterator[Scenario]:
    namespace = f"e2e-cli-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        yield build_campaign(cluster, namespace, "papers")
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# --- reads -------------------------------------------------------------------------------------------


def test_kubectl_runs_the_plugin(cluster: Cluster) -> None:
    result = kc(cluster, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl campaign")
    assert "4  no cluster access" in result.stdout


def test_list_shows_the_campaign_across_namespaces(cluster: Cluster, scenario: Scenario) -> None:
    items = kc_json(cluster, "list", "-A")["items"]
    row = next(r for r in items if (r["namespace"], r["name"]) == (scenario.namespace, "papers"))
    assert row["phase"] == "Running"
    assert row["progress"] == {"done": 1, "total": 8}
    assert (row["blocked"], row["failed"], row["spent"], row["budget"]) == (1, 1, "1.75", "5")
    human = kc(cluster, "list", "-n", scenario.namespace)
    assert human.returncode == 0
    assert human.stdout.splitlines()[1].split()[:4] == ["papers", "Running", "1/8", "(12%)"]


def test_list_o_name_and_no_headers_print_what_kubectl_prints(cluster: Cluster, scenario: Scenario) -> None:
    names = kc(cluster, "list", "-n", scenario.namespace, "-o", "name")
    assert names.returncode == 0, names.stderr
    # The very text of kubectl get -o name for the same objects.
    kubectl_names = cluster.kubectl("get", "campaigns", "-n", scenario.namespace, "-o", "name").stdout
    assert names.stdout == kubectl_names == "campaign.shardops.dev/papers\n"
    bare = kc(cluster, "list", "-n", scenario.namespace, "--no-headers")
    assert bare.returncode == 0, bare.stderr
    [line] = bare.stdout.splitlines()
    assert line.split()[:4] == ["papers", "Running", "1/8", "(12%)"]


def _unreachable_server() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    return f"https://127.0.0.1:{port}"


def test_context_picks_the_kubeconfig_context_its_server_and_namespace(
    cluster: Cluster, scenario: Scenario, tmp_path: Path
) -> None:
    """A kubeconfig whose current context leads nowhere, and a second context that is the cluster under
    test with the scenario's namespace: --context picks that one, as kubectl's --context does."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    config["clusters"].append({"name": "nowhere", "cluster": {"server": _unreachable_server()}})
    config["contexts"] = [
        {"name": "nowhere", "context": {**current, "cluster": "nowhere"}},
        {"name": "e2e-cli", "context": {**current, "namespace": scenario.namespace}},
    ]
    config["current-context"] = "nowhere"
    path = tmp_path / "two-contexts.kubeconfig"
    path.write_text(yaml.safe_dump(config))

    assert kc(cluster, "list", kubeconfig=path).returncode == 4  # the current context: nothing listens
    chosen = kc(cluster, "list", "--context", "e2e-cli", "-o", "name", kubeconfig=path)
    assert chosen.returncode == 0, chosen.stderr
    # No -n: the namespace is the chosen context's, as for kubectl with the same flags.
    kubectl_names = cluster.kubectl(
        "--kubeconfig", str(path), "--context", "e2e-cli", "get", "campaigns", "-o", "name"
    ).stdout
    assert chosen.stdout == kubectl_names == "campaign.shardops.dev/papers\n"
    status = kc(cluster, "--context", "e2e-cli", "status", "papers", "-o", "json", kubeconfig=path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["namespace"] == scenario.namespace
    missing = kc(cluster, "list", "--context", "nope", kubeconfig=path)
    assert missing.returncode == 4
    assert 'context "nope" does not exist' in missing.stderr


def test_status_reports_live_counts_running_shards_and_budget(cluster: Cluster, scenario: Scenario) -> None:
    before = scenario.versions()
    status = kc_json(cluster, "status", "papers", "-n", scenario.namespace)
    counts = status["counts"]
    assert (counts["done"], counts["running"], counts["blocked"], counts["failed"]) == (1, 1, 1, 1)
    assert (counts["pending"], counts["queued"], counts["notYetCut"], counts["total"]) == (1, 1, 2, 8)
    [running] = status["running"]
    assert (running["name"], running["owner"], running["attempt"], running["maxAttempts"]) == (
        "papers-00001",
        "worker-b",
        1,
        3,
    )
    assert status["oldestPending"]["shard"] == "papers-00004"
    assert status["budget"]["spent"] == "1.75" and status["budget"]["limit"] == "5"
    assert status["estimate"]["remainingShards"] == 5
    breakers = {b["source"]: b for b in status["breakers"]}
    assert (breakers["large"]["state"], breakers["large"]["consecutiveFailures"]) == ("Open", 3)
    assert breakers["large"]["fallback"] == "small" and breakers["small"]["state"] == "Closed"
    text = kc(cluster, "-n", scenario.namespace, "status", "papers").stdout
    assert "1/8 shards done (12%)" in text
    assert "papers-00001   worker-b" in text
    assert scenario.versions() == before


def test_plan_is_the_planners_answer_and_changes_nothing(cluster: Cluster, scenario: Scenario) -> None:
    before = scenario.versions()
    plan = kc_json(cluster, "plan", "papers", "-n", scenario.namespace)
    assert plan["dryRun"] is True
    # One running of maxConcurrency 2: the Pending shard is handed out; the Queued one is promoted.
    assert plan["plan"]["claimable"] == ["papers-00004"]
    # The three rate-limited failures of papers-00002 opened the breaker of "large" (threshold 3),
    # folded from the shards' history as the operator does: the shard goes to the fallback.
    assert plan["plan"]["routes"]["papers-00004"] == {"source": "small", "probe": False}
    assert plan["plan"]["promote"] == ["papers-00005"]
    assert plan["plan"]["startWorkers"] == 1  # no worker Job alive, one shard to hand out
    assert plan["expiredClaims"] == []  # papers-00001's Lease is live
    assert plan["observed"]["itemsTotal"] == len(ITEMS)
    assert plan["plan"]["startSlots"] == 1
    assert plan["observed"]["workers"] == {
        "aliveJobs": 0,
        "aliveSlots": 0,
        "runningPods": 0,
        "stuckPendingPods": 0,
    }
    text = kc(cluster, "plan", "papers", "-n", scenario.namespace).stdout
    assert "nothing was changed" in text
    assert scenario.versions() == before


def test_events_merges_the_history_with_the_shards_events(cluster: Cluster, scenario: Scenario) -> None:
    timeline = kc_json(cluster, "events", "papers-00002", "-n", scenario.namespace)
    rows = timeline["timeline"]
    reasons = [r["reason"] for r in rows if r["origin"] != "status"]
    assert reasons == [
        "Materialized",
        "Claimed",
        "AttemptFailed",
        "Claimed",
        "AttemptFailed",
        "Claimed",
        "Blocked",
    ]
    transitions = [r for r in rows if r["origin"] != "status"]
    # What a person must see is counted in the campaign's Event for its reason (regarding the
    # Campaign, not listed with the shard): a Warning row naming it, the last with lastError's message.
    assert all(r["origin"] == "history" for r in transitions)
    warned = [r["event"] for r in transitions if r["type"] == "Warning"]
    assert warned == ["papers.attemptfailed", "papers.attemptfailed", "papers.blocked"]
    assert [r["attempt"] for r in transitions] == [1, 1, 1, 2, 2, 3, 3]
    claims = [r for r in transitions if r["reason"] == "Claimed"]
    assert all(r["leaseUntil"] for r in claims)
    assert transitions[-1]["type"] == "Warning" and "rate-limited" in transitions[-1]["note"]
    assert timeline["lastError"]["class"] == "rate-limited"
    assert timeline["lastError"]["event"] == transitions[-1]["event"]


def test_report_checklist_passes_for_a_clean_campaign(cluster: Cluster, scenario: Scenario) -> None:
    result = kc(cluster, "report", "papers", "-n", scenario.namespace, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True
    assert [c["check"] for c in report["checklist"] if c["passed"]] == [
        "result-fingerprints",
        "failure-records",
        "attempt-distribution",
        "spend-matches",
        "no-manual-changes",
    ]
    assert {g["name"] for g in report["left"]["gaveUp"]} == {"papers-00002", "papers-00003"}


def test_report_fails_on_a_status_changed_by_hand(
    cluster: Cluster, crds_installed: None, namespace: str
) -> None:
    scenario = build_campaign(cluster, namespace, "edited")
    # An admin "fixes" a blocked shard by hand: the API server records the manager.
    cluster.kubectl(
        "patch",
        "shard",
        "edited-00002",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Done"}}',
    )
    result = kc(cluster, "report", "edited", "-n", namespace)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[FAIL] no sign of a manual state change" in result.stdout
    assert "edited-00002: status written by kubectl-patch" in result.stdout
    # The hand-made Done has no result fingerprint either.
    assert "[FAIL] every Done shard has a result fingerprint" in result.stdout
    assert scenario.shard(2).phase == "Done"


# --- actions --------------------------------------------------------------------------------------------


def campaign_events(scenario: Scenario) -> list[dict[str, Any]]:
    found = scenario.kube.list(
        EVENTS, scenario.namespace, fieldSelector=f"regarding.name={scenario.campaign}"
    )
    return sorted(
        (e for e in found if e.get("reportingController") == REPORTING_CONTROLLER),
        key=lambda e: e["eventTime"],
    )


def test_actions_are_recorded_requests_that_never_touch_shards(
    cluster: Cluster, crds_installed: None, namespace: str
) -> None:
    scenario = build_campaign(cluster, namespace, "acted")
    shards_before = scenario.shard_versions()

    def campaign() -> dict[str, Any]:
        return scenario.kube.get(CAMPAIGNS, namespace, "acted")

    assert kc(cluster, "suspend", "acted", "-n", namespace).returncode == 0
    assert campaign()["spec"]["suspend"] is True
    assert "already suspended" in kc(cluster, "suspend", "acted", "-n", namespace).stdout

    assert kc(cluster, "resume", "acted", "-n", namespace).returncode == 0
    assert campaign()["spec"]["suspend"] is False

    result = kc(cluster, "retry", "acted", "--blocked", "-n", namespace)
    assert result.returncode == 0, result.stderr
    body = campaign()
    assert body["spec"]["retry"] == {"generation": 1, "shards": ["acted-00002"]}
    # Without an operator the request stays pending: a second one is refused, not merged.
    again = kc(cluster, "retry", "acted", "-n", namespace)
    assert again.returncode == 1
    assert "still waiting for the operator" in again.stderr

    assert kc(cluster, "cancel", "acted", "-n", namespace).returncode == 0
    body = campaign()
    assert body["spec"]["suspend"] is True
    assert "shardops.dev/cancelled" in body["metadata"]["annotations"]
    assert body["spec"]["retry"] == {"generation": 1, "shards": ["acted-00002"]}

    events = campaign_events(scenario)
    assert [e["reason"] for e in events] == [
        "SuspendRequested",
        "ResumeRequested",
        "RetryRequested",
        "CancelRequested",
    ]
    assert all(e["regarding"]["kind"] == "Campaign" for e in events)
    assert "acted-00002" in events[2]["note"]
    assert scenario.shard_versions() == shards_before, "an action wrote a shard"
    # Every write was made as kubectl-campaign: the field manager of the Campaign's spec.
    managers = {m["manager"] for m in campaign()["metadata"]["managedFields"]}
    assert "kubectl-campaign" in managers

    deleted = kc(cluster, "cancel", "acted", "--delete", "-n", namespace, "-o", "json")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["changed"] is True
    assert kc(cluster, "status", "acted", "-n", namespace).returncode == 3


# --- errors -------------------------------------------------------------------------------------------


def test_a_missing_campaign_and_shard_are_exit_3(cluster: Cluster, scenario: Scenario) -> None:
    result = kc(cluster, "status", "nope", "-n", scenario.namespace)
    assert result.returncode == 3
    assert (
        f'campaign "nope" not found in namespace "{scenario.namespace}" (campaigns there: papers)'
        in result.stderr
    )
    assert kc(cluster, "events", "papers-00042", "-n", scenario.namespace).returncode == 3


def test_a_missing_crd_is_exit_3(cluster: Cluster, scenario: Scenario) -> None:
    """The real API server's answer for a resource type it does not serve (an API group with no CRD)."""
    missing = Resource("not-installed.shardops.dev", "v1alpha1", "campaigns")
    for argv in (["status", "papers"], ["list"]):
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(
            ["-n", scenario.namespace, *argv],
            make_client=lambda _: Client(connect(str(cluster.kubeconfig)), campaigns=missing),
            stdout=out,
            stderr=err,
        )
        assert code == 3, err.getvalue()
        assert "campaigns.not-installed.shardops.dev CRD is not installed" in err.getvalue()


def test_an_unreachable_api_server_is_exit_4(cluster: Cluster, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "unreachable.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    result = kc(cluster, "list", kubeconfig=path)
    assert result.returncode == 4
    assert f"cannot reach the Kubernetes API server at https://127.0.0.1:{port}" in result.stderr


def _guide_roles() -> list[dict[str, Any]]:
    """The Roles docs/user-guide.md tells people to create, as written there."""
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S)
    roles = [
        doc for block in blocks for doc in yaml.safe_load_all(block) if doc and doc.get("kind") == "Role"
    ]
    assert {r["metadata"]["name"] for r in roles} == {"campaign-viewer", "campaign-operator"}
    return roles


def test_rbac_from_the_user_guide_is_enough_and_missing_rbac_is_exit_4(
    cluster: Cluster, scenario: Scenario, tmp_path: Path
) -> None:
    namespace = scenario.namespace
    for role in _guide_roles():
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(role))
    for account in ("nobody", "viewer", "operator"):
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "viewer",
        "-n",
        namespace,
        "--role=campaign-viewer",
        f"--serviceaccount={namespace}:viewer",
    )
    for role in ("campaign-viewer", "campaign-operator"):
        cluster.kubectl(
            "create",
            "rolebinding",
            f"operator-{role}",
            "-n",
            namespace,
            f"--role={role}",
            f"--serviceaccount={namespace}:operator",
        )
    configs = {
        a: chartkit.token_kubeconfig(cluster, namespace, a, tmp_path / f"{a}.kubeconfig")
        for a in ("nobody", "viewer", "operator")
    }

    denied = kc(cluster, "status", "papers", kubeconfig=configs["nobody"])
    assert denied.returncode == 4
    assert "forbidden" in denied.stderr and f"system:serviceaccount:{namespace}:nobody" in denied.stderr

    # The kubeconfig's namespace is the default (-n not needed).
    for argv in (["status", "papers"], ["plan", "papers"], ["events", "papers-00002"], ["list"]):
        result = kc(cluster, *argv, kubeconfig=configs["viewer"])
        assert result.returncode == 0, f"{argv}: {result.stderr}"
        assert "warning" not in result.stdout, result.stdout
    report = kc(cluster, "report", "papers", kubeconfig=configs["viewer"])
    assert report.returncode == 0, report.stderr

    refused = kc(cluster, "suspend", "papers", kubeconfig=configs["viewer"])
    assert refused.returncode == 4
    assert "patch campaign papers needs that permission" in refused.stderr
    assert scenario.kube.get(CAMPAIGNS, namespace, "papers")["spec"].get("suspend") is not True

    allowed = kc(cluster, "suspend", "papers", "-o", "json", kubeconfig=configs["operator"])
    assert allowed.returncode == 0, allowed.stderr
    outcome = json.loads(allowed.stdout)
    assert outcome["event"] and outcome["warnings"] == []
    assert outcome["user"] == f"system:serviceaccount:{namespace}:operator"
    assert kc(cluster, "resume", "papers", kubeconfig=configs["operator"]).returncode == 0


def test_as_impersonates_the_user_for_every_request(cluster: Cluster, scenario: Scenario) -> None:
    """--as sends Impersonate-User: RBAC then judges that user (the admin may impersonate anyone)."""
    can = cluster.kubectl("auth", "can-i", "impersonate", "users", check=False)
    if can.stdout.strip() != "yes":
        pytest.skip("the kubeconfig's user may not impersonate")
    namespace = scenario.namespace
    viewer_role = next(r for r in _guide_roles() if r["metadata"]["name"] == "campaign-viewer")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(viewer_role))
    viewer = f"system:serviceaccount:{namespace}:as-viewer"
    cluster.kubectl(
        "create", "rolebinding", "as-viewer", "-n", namespace, "--role=campaign-viewer", f"--user={viewer}"
    )
    allowed = kc(cluster, "status", "papers", "-n", namespace, "--as", viewer)
    assert allowed.returncode == 0, allowed.stderr
    refused = kc(cluster, "suspend", "papers", "-n", namespace, "--as", viewer)
    assert refused.returncode == 4
    assert f'User "{viewer}" cannot patch resource "campaigns"' in refused.stderr
    nobody = kc(cluster, "--as", "nobody-at-all", "list", "-n", namespace)
    assert nobody.returncode == 4
    assert 'User "nobody-at-all" cannot list resource "campaigns"' in nobody.stderr
    assert scenario.kube.get(CAMPAIGNS, namespace, "papers")["spec"].get("suspend") is not True


def test_rejected_credentials_are_exit_4(cluster: Cluster, scenario: Scenario, tmp_path: Path) -> None:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": u["name"], "user": {"token": "not-a-token"}} for u in config["users"]]
    path = tmp_path / "bad-token.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    result = kc(cluster, "list", "-n", scenario.namespace, kubeconfig=path)
    assert result.returncode == 4
    assert "rejected the credentials (401 Unauthorized)" in result.stderr


# --- watch ----------------------------------------------------------------------------------------------


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "no frame within the timeout"
    return process.stdout.readline()


def test_watch_redraws_and_ends_when_the_campaign_is_deleted(
    cluster: Cluster, crds_installed: None, namespace: str
) -> None:
    build_campaign(cluster, namespace, "watched")
    process = subprocess.Popen(
        [
            str(cluster.bin_dir / "kubectl"),
            "campaign",
            "status",
            "watched",
            "-n",
            namespace,
            "--watch",
            "-o",
            "json",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(cluster),
    )
    try:
        first = json.loads(_read_line(process, 30))
        second = json.loads(_read_line(process, 30))
        assert first["name"] == second["name"] == "watched"
        assert second["now"] >= first["now"]
        cluster.kubectl("delete", "campaign", "watched", "-n", namespace)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 3
    assert process.stderr is not None
    assert f"campaign {namespace}/watched is gone (deleted while watching)" in process.stderr.read()
