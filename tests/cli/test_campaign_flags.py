"""The kubectl flags `kubectl campaign` takes as kubectl spells and reads them: --context, --as and
--request-timeout on every command, -o name and --no-headers on list (no cluster)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client
from kubernetes.client import rest

from shardops.cli import campaign as cli
from shardops.cli.campaign_client import connect, default_namespace
from shardops.cli.text import parse_duration
from shardops.k8s.api import DEFAULT_TIMEOUT_SECONDS, IMPERSONATE_USER_HEADER
from tests.clikit import campaign_body, cluster, run

SERVER_A = "https://127.0.0.1:1"
SERVER_B = "https://127.0.0.2:1"
EMPTY_LIST = b'{"kind": "List", "items": []}'


def kubeconfig(tmp_path: Path) -> Path:
    """Two contexts on two servers, each with its namespace; `a` is the current one."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ca", "cluster": {"server": SERVER_A}},
            {"name": "cb", "cluster": {"server": SERVER_B}},
        ],
        "users": [{"name": "ua", "user": {"token": "token-a"}}, {"name": "ub", "user": {"token": "token-b"}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "ca", "user": "ua", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "cb", "user": "ub", "namespace": "team-b"}},
        ],
        "current-context": "a",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Sent:
    url: str
    headers: dict[str, str]
    timeout: Any


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    """Every request the real client would send (built by the kubernetes client itself from the
    kubeconfig), answered with an empty list as the client's own response type, without a network."""
    sent: list[Sent] = []

    def call_api(
        self: client.ApiClient,
        method: str,
        url: str,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> rest.RESTResponse:
        sent.append(Sent(url, dict(header_params or {}), _request_timeout))
        return rest.RESTResponse(urllib3.HTTPResponse(body=EMPTY_LIST, status=200, preload_content=True))

    monkeypatch.setattr(client.ApiClient, "call_api", call_api)
    return sent


def main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# --- --context, --as, --request-timeout -----------------------------------------------------------------


def test_without_flags_the_current_context_is_used_as_itself_with_the_default_timeout(
    tmp_path: Path, wire: list[Sent]
) -> None:
    code, _, err = main("--kubeconfig", str(kubeconfig(tmp_path)), "list")
    assert code == 0, err
    assert err.strip() == "No campaigns found in namespace team-a."
    [sent] = wire
    assert sent.url.startswith(f"{SERVER_A}/apis/shardops.dev/v1alpha1/namespaces/team-a/campaigns")
    assert sent.headers["authorization"] == "Bearer token-a"
    assert IMPERSONATE_USER_HEADER not in sent.headers
    assert sent.timeout == DEFAULT_TIMEOUT_SECONDS


def test_context_as_and_request_timeout_reach_every_request(tmp_path: Path, wire: list[Sent]) -> None:
    path = str(kubeconfig(tmp_path))
    code, _, err = main(
        "list", "--kubeconfig", path, "--context", "b", "--as", "bob", "--request-timeout", "1m"
    )
    assert code == 0, err
    # The namespace is context b's, the server and the credentials too.
    assert err.strip() == "No campaigns found in namespace team-b."
    [sent] = wire
    assert sent.url.startswith(f"{SERVER_B}/apis/shardops.dev/v1alpha1/namespaces/team-b/campaigns")
    assert sent.headers["authorization"] == "Bearer token-b"
    assert sent.headers[IMPERSONATE_USER_HEADER] == "bob"
    assert sent.timeout == 60.0


def test_the_flags_also_work_before_the_command_and_zero_waits_forever(
    tmp_path: Path, wire: list[Sent]
) -> None:
    path = str(kubeconfig(tmp_path))
    code, _, err = main(
        "--context=b",
        "--as=system:serviceaccount:team-b:ci",
        "--request-timeout=0",
        "--kubeconfig",
        path,
        "list",
    )
    assert code == 0, err
    [sent] = wire
    assert sent.url.startswith(SERVER_B)
    assert sent.headers[IMPERSONATE_USER_HEADER] == "system:serviceaccount:team-b:ci"
    assert sent.timeout is None  # no bound, as kubectl's --request-timeout=0


def test_an_unknown_context_is_exit_4_and_names_the_ones_there(tmp_path: Path, wire: list[Sent]) -> None:
    code, out, err = main("--kubeconfig", str(kubeconfig(tmp_path)), "--context", "nope", "status", "x")
    assert (code, out) == (4, "")
    assert err.startswith(f'error: context "nope" does not exist in kubeconfig {tmp_path}')
    assert "(contexts there: a, b;" in err
    assert wire == []


def test_connect_builds_the_client_the_flags_describe(tmp_path: Path) -> None:
    path = str(kubeconfig(tmp_path))
    kube = connect(path, context="b", impersonate="bob", timeout=5.0)
    assert kube.api_client.configuration.host == SERVER_B
    assert kube.api_client.default_headers[IMPERSONATE_USER_HEADER] == "bob"
    assert kube.timeout == 5.0
    plain = connect(path)
    assert plain.api_client.configuration.host == SERVER_A
    assert IMPERSONATE_USER_HEADER not in plain.api_client.default_headers
    assert plain.timeout == DEFAULT_TIMEOUT_SECONDS


def test_the_default_namespace_follows_the_chosen_context(tmp_path: Path) -> None:
    path = str(kubeconfig(tmp_path))
    assert default_namespace(path) == "team-a"
    assert default_namespace(path, "b") == "team-b"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0", 0.0),
        ("30s", 30.0),
        ("1m", 60.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("+5s", 5.0),
    ],
)
def test_request_timeout_takes_kubectls_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    args = cli.parse_args(cli.build_parser(), ["--request-timeout", text, "list"])
    assert args.request_timeout == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "1m5", "-1s", "-5", "1e3s", " 5s"])
def test_a_request_timeout_kubectl_would_not_take_is_exit_2(text: str) -> None:
    result = run(cluster(), "list", f"--request-timeout={text}")
    assert result.code == 2
    assert "invalid timeout" in result.err
    assert "(e.g. 1s | 2m | 3h)" in result.err


@pytest.mark.parametrize(
    "problem",
    [
        urllib3.exceptions.ReadTimeoutError(None, "/x", "Read timed out. (read timeout=30.0)"),  # type: ignore[arg-type]
        urllib3.exceptions.MaxRetryError(
            None,  # type: ignore[arg-type]
            "/x",
            urllib3.exceptions.ConnectTimeoutError(
                None, "Connection to 10.0.0.1 timed out. (connect timeout=30)"
            ),
        ),
    ],
)
def test_a_request_that_times_out_says_so_and_names_the_flag(problem: BaseException) -> None:
    result = run(cluster(campaign_body(), fail=lambda call: problem), "-n", "ns", "status", "papers")
    assert result.code == 4
    assert result.err.startswith(
        "error: no answer from the Kubernetes API server at https://fake.example:6443 within 30s"
    )
    assert "--request-timeout" in result.err


def test_a_refused_connection_is_not_called_a_timeout() -> None:
    """urllib3's NewConnectionError is a ConnectTimeoutError by inheritance; it is not one."""
    refused = urllib3.exceptions.MaxRetryError(
        None,  # type: ignore[arg-type]
        "/x",
        urllib3.exceptions.NewConnectionError(
            None, "Failed to establish a new connection: [Errno 111] Connection refused"
        ),  # type: ignore[arg-type]
    )
    result = run(cluster(campaign_body(), fail=lambda call: refused), "-n", "ns", "status", "papers")
    assert result.code == 4
    assert result.err.startswith("error: cannot reach the Kubernetes API server at https://fake.example:6443")
    assert "Connection refused" in result.err


# --- list -o name, --no-headers ------------------------------------------------------------------------


def two_campaigns() -> Any:
    return cluster(
        campaign_body("papers", "ns", status={"phase": "Running", "shardsTotal": 4, "counts": {"done": 1}}),
        campaign_body("longer-name", "ns"),
        campaign_body("elsewhere", "other"),
    )


def test_list_o_name_prints_kind_group_and_name_like_kubectl() -> None:
    result = run(two_campaigns(), "-n", "ns", "list", "-o", "name")
    assert result.code == 0, result.err
    assert result.out == "campaign.shardops.dev/longer-name\ncampaign.shardops.dev/papers\n"
    assert result.err == ""
    # kubectl get -A -o name prints no namespace either.
    every = run(two_campaigns(), "list", "-A", "-o", "name")
    assert every.out.splitlines() == [
        "campaign.shardops.dev/longer-name",
        "campaign.shardops.dev/papers",
        "campaign.shardops.dev/elsewhere",
    ]


def test_list_o_name_of_nothing_prints_nothing_at_all() -> None:
    result = run(cluster(), "-n", "ns", "list", "-o", "name")
    assert (result.code, result.out, result.err) == (0, "", "")


def test_list_no_headers_leaves_out_the_header_and_sizes_columns_by_the_rows() -> None:
    with_headers = run(two_campaigns(), "-n", "ns", "list").out.splitlines()
    result = run(two_campaigns(), "-n", "ns", "list", "--no-headers")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert len(lines) == 2
    assert [line.split() for line in lines] == [line.split() for line in with_headers[1:]]
    # As in kubectl, the header no longer widens the columns: RUNNING .. SPENT/BUDGET shrink to the rows.
    assert lines[0] == "longer-name   New       0/0 (-)     0   0   0   0   0/-   1h00m"
    assert not any(line.startswith("NAME") for line in lines)


def test_list_no_headers_of_nothing_still_says_so_on_stderr() -> None:
    result = run(cluster(), "-n", "ns", "list", "--no-headers")
    assert (result.code, result.out) == (0, "")
    assert result.err.strip() == "No campaigns found in namespace ns."


@pytest.mark.parametrize(
    "argv", [["status", "papers"], ["plan", "papers"], ["report", "papers"], ["suspend", "papers"]]
)
def test_o_name_is_for_list_only(argv: list[str]) -> None:
    before = run(two_campaigns(), "-n", "ns", "-o", "name", *argv)
    assert before.code == 2
    assert f"argument -o/--output: {argv[0]} prints human, json, yaml, not name" in before.err
    after = run(two_campaigns(), "-n", "ns", *argv, "-o", "name")
    assert after.code == 2
    assert "argument -o/--output: invalid choice: 'name' (choose from 'human', 'json', 'yaml')" in after.err


def test_no_headers_is_a_list_flag() -> None:
    assert run(two_campaigns(), "-n", "ns", "status", "papers", "--no-headers").code == 2
