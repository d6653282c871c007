"""The documentation is checked like code: the README stays a front door; user docs name no commit or
work session; every shardops manifest (and `spec:` fragment) in the docs is valid for the API models;
every `kubectl campaign` command line parses; links resolve; the S3 permissions and the alerts name
what the code uses; and docs/operate.md lists every metric the code exports."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardops.api import Campaign, Shard
from shardops.api.common import ResourceModel
from shardops.api.names import API_GROUP
from shardops.api.shared_sources import ClusterSharedSource, SharedSource
from shardops.cli import campaign as cli
from tests.docskit import (
    CONTRIBUTOR_DOCS,
    OPERATE,
    README,
    ROOT,
    Block,
    campaign_argvs,
    command_lines,
    documented_table,
    every_doc,
    fenced_blocks,
    metric_rows,
    metrics_table,
    relative,
    user_docs,
)

README_MAX_WORDS = 1500
# Every kind of the shardops.dev group and the model that validates it. A new kind gets its model here.
MODELS: dict[str, type[ResourceModel]] = {
    "Campaign": Campaign,
    "Shard": Shard,
    "Source": SharedSource,
    "ClusterSource": ClusterSharedSource,
}
REGENERATE = "run `.venv/bin/python tests/docskit.py` to regenerate docs/operate.md's metrics table"


# --- the README is a front door ---------------------------------------------------------------------


def test_the_readme_has_at_most_1500_words() -> None:
    words = len(README.read_text(encoding="utf-8").split())  # what `wc -w` counts
    assert words <= README_MAX_WORDS, (
        f"README.md has {words} words (at most {README_MAX_WORDS}): move details to a page under docs/"
    )


def test_the_readme_links_every_user_page() -> None:
    text = README.read_text(encoding="utf-8")
    pages = [relative(p) for p in user_docs() if p != README]
    assert {"docs/install.md", "docs/worker-command.md", "docs/sizing.md", "docs/operate.md"} <= set(pages)
    assert [p for p in pages if f"]({p}" not in text] == []


def test_the_doc_sets_are_found() -> None:
    users = {relative(p) for p in user_docs()}
    everything = {relative(p) for p in every_doc()}
    assert {"README.md", "docs/install.md", "docs/user-guide.md", "docs/operate.md"} <= users
    assert {"CONTRIBUTING.md", "docs/contributing/fault-suite.md"} <= everything - users
    assert not any(CONTRIBUTOR_DOCS in (ROOT / p).parents for p in users)


# --- links resolve -----------------------------------------------------------------------------------

# Pages other changes add at the same time as these docs (the tenancy model, the benchmark results'
# new home); a link to them is checked like any other once they exist.
WRITTEN_ELSEWHERE = {"docs/security.md", "benchmarks/results/RESULTS.md"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = CODE.sub("", path.read_text(encoding="utf-8").replace("`", ""))
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):
            continue
        name, _, fragment = target.partition("#")
        destination = (path.parent / name).resolve() if name else path
        if not destination.exists():
            if destination not in {ROOT / page for page in WRITTEN_ELSEWHERE}:
                broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading #{fragment} in {destination.name}")
    return broken


def test_anchors_are_githubs() -> None:
    assert anchor("One process for many shards: `spec.worker.persistent`".replace("`", "")) == (
        "one-process-for-many-shards-specworkerpersistent"
    )
    assert anchor("3. The result store (S3)") == "3-the-result-store-s3"


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n")
    page.write_text(
        "[ok](other.md#a-section) [gone](gone.md) [bad](other.md#no-such) `[code](x.md)` [web](https://x.y)\n"
    )
    assert broken_links(page) == [
        "gone.md: no such file",
        "other.md#no-such: no heading #no-such in other.md",
    ]


@pytest.mark.parametrize("path", every_doc(), ids=relative)
def test_every_link_of_the_docs_resolves(path: Path) -> None:
    assert broken_links(path) == []


# --- no commit hashes or work sessions in user docs ---------------------------------------------------

# A commit named by its hash: 7 to 40 hex digits, at least one digit and one letter, standing alone
# (not part of a pod name, an Event name or a digest, which are joined to other text by - . : or @).
COMMIT = re.compile(r"(?<![\w.:@/-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
# How the history of the work shows up in text: "stop 22", "session 3", "this session".
SESSION = re.compile(
    r"\b(?:sessions?|stops?)\s+\d+\b|\b(?:this|that|last|previous|next|earlier|same)\s+session\b",
    re.IGNORECASE,
)


def history_references(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if COMMIT.search(line) or SESSION.search(line)]


@pytest.mark.parametrize(
    "line",
    [
        "after the fold deletes each Lease (8c5e1b3)",
        "the cut-cursor fix (bcf726f, stop 22)",
        "Cold not re-measured this session",
        "measured in session 4",
        "see commit 0fbc4c3 and 40a95a3",
    ],
)
def test_the_checker_finds_history_references(line: str) -> None:
    assert history_references(f"before\n{line}\nafter") == [line]


@pytest.mark.parametrize(
    "line",
    [
        "scheduled by the leader shardops-operator-66474bffd6-78kcb",
        "(event survey-00005.68488ac952ae, at 2026-12-01T02:57:35Z)",
        "--set image.digest=sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
        "a deadbeef value, 1234567 items, e2e tests in one pytest session",
        "stop claiming for that source",
    ],
)
def test_the_checker_lets_plain_text_pass(line: str) -> None:
    assert history_references(line) == []


@pytest.mark.parametrize("path", user_docs(), ids=relative)
def test_user_docs_name_no_commit_or_session(path: Path) -> None:
    found = history_references(path.read_text(encoding="utf-8"))
    assert found == [], (
        f"{relative(path)} tells the project's history; say what is true now "
        "(timings and their history go to docs/contributing/):\n" + "\n".join(found)
    )


# --- every manifest in the docs is valid -------------------------------------------------------------


def yaml_blocks() -> list[Block]:
    return [b for path in every_doc() for b in fenced_blocks(path) if b.language in ("yaml", "yml")]


def shardops_manifests() -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for block in yaml_blocks():
        for number, doc in enumerate(yaml.safe_load_all(block.text)):
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith(f"{API_GROUP}/"):
                found.append((f"{block.where}#{number}", doc))
    return found


@pytest.mark.parametrize("block", yaml_blocks(), ids=lambda b: b.where)
def test_every_yaml_block_parses(block: Block) -> None:
    list(yaml.safe_load_all(block.text))


MANIFESTS = shardops_manifests()


def test_the_docs_hold_campaign_manifests() -> None:
    where = {where.split(":")[0] for where, doc in MANIFESTS if doc.get("kind") == "Campaign"}
    assert "README.md" in where


@pytest.mark.parametrize(("where", "doc"), MANIFESTS, ids=[where for where, _ in MANIFESTS])
def test_every_shardops_manifest_in_the_docs_is_valid(where: str, doc: dict[str, Any]) -> None:
    kind = doc.get("kind")
    assert kind in MODELS, f"{where}: kind {kind!r} of {API_GROUP} has no model in this test"
    MODELS[kind].parse(doc)


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if nested else value
    return out


def in_a_campaign(spec: dict[str, Any]) -> dict[str, Any]:
    """A Campaign around a documented `spec:` fragment, with the items and worker it may leave out."""
    base: dict[str, Any] = {"worker": {"image": "registry.example.com/agent:1", "command": ["agent"]}}
    if "itemsFrom" not in spec:
        base["items"] = [{"n": 1}]
    return {
        "apiVersion": f"{API_GROUP}/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": "fragment"},
        "spec": merged(base, spec),
    }


def spec_fragments() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{block.where}#{number}", doc["spec"])
        for block in yaml_blocks()
        for number, doc in enumerate(yaml.safe_load_all(block.text))
        if isinstance(doc, dict) and set(doc) == {"spec"}
    ]


FRAGMENTS = spec_fragments()


def test_the_docs_hold_spec_fragments() -> None:
    assert {where.split(":")[0] for where, _ in FRAGMENTS} >= {"docs/sizing.md", "docs/user-guide.md"}


@pytest.mark.parametrize(("where", "spec"), FRAGMENTS, ids=[where for where, _ in FRAGMENTS])
def test_every_spec_fragment_in_the_docs_is_valid_in_a_campaign(where: str, spec: dict[str, Any]) -> None:
    """Field names and values of a `spec:` snippet are the models' (unknown fields are refused)."""
    Campaign.parse(in_a_campaign(spec))


def test_a_misspelled_fragment_is_refused() -> None:
    with pytest.raises(ValueError, match="shardSise"):
        Campaign.parse(in_a_campaign({"shardSise": 3}))


def test_an_invalid_manifest_is_refused() -> None:
    """The check above can fail: a Campaign without a worker is refused by the models."""
    with pytest.raises(ValueError, match="worker"):
        Campaign.parse(
            {
                "apiVersion": f"{API_GROUP}/v1alpha1",
                "kind": "Campaign",
                "metadata": {"name": "x"},
                "spec": {"items": [{}]},
            }
        )


# --- every kubectl campaign command line parses -------------------------------------------------------


def documented_commands() -> list[tuple[str, list[str]]]:
    return [
        (where, argv)
        for path in every_doc()
        for block in fenced_blocks(path)
        for where, line in command_lines(block)
        for argv in campaign_argvs(line)
    ]


COMMANDS = documented_commands()


def parse_error(argv: list[str]) -> str | None:
    """None when `kubectl campaign` accepts `argv`; else argparse's message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            cli.build_parser().parse_args(argv)
    except SystemExit as stop:
        return None if stop.code == 0 else stderr.getvalue().strip() or f"exit {stop.code}"
    return None


def test_the_docs_hold_command_lines_of_every_kind() -> None:
    used = {cli.build_parser().parse_args(argv).command for _, argv in COMMANDS if parse_error(argv) is None}
    assert {"status", "plan", "results", "report", "apply", "purge", "retry", "suspend"} <= used


def test_the_command_check_can_fail() -> None:
    assert parse_error(["status"]) is not None  # no campaign name
    assert parse_error(["statsu", "x"]) is not None
    assert parse_error(["status", "x", "-n", "team-a"]) is None


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[f"{w} {' '.join(a)}" for w, a in COMMANDS])
def test_every_documented_command_line_parses(where: str, argv: list[str]) -> None:
    error = parse_error(argv)
    assert error is None, f"{where}: kubectl campaign {' '.join(argv)}\n{error}"


def test_command_lines_are_read_as_a_shell_would() -> None:
    block = Block(
        README,
        1,
        "console",
        "$ kubectl campaign results demo \\\n    -o out.jsonl  # a comment\n"
        "kubectl campaign suspend|resume demo\nkubectl campaign list -A | head\nkubectl get shards\n"
        'KUBECONFIG=x kubectl campaign report demo; echo "exit $?"\n',
    )
    lines = [line for _, line in command_lines(block)]
    assert [argv for line in lines for argv in campaign_argvs(line)] == [
        ["results", "demo", "-o", "out.jsonl"],
        ["suspend", "demo"],
        ["resume", "demo"],
        ["list", "-A"],
        ["report", "demo"],
    ]


# --- docs/install.md names every S3 call the store makes ------------------------------------------

S3_STORE = ROOT / "operator" / "shardops" / "store" / "s3.py"
INSTALL = ROOT / "docs" / "install.md"
# The boto3 methods the store calls (`self._call(what, "method", ...)`) and the S3 API each sends.
S3_CALL = re.compile(r"self\._call\(\s*[^,]+,\s*\"(\w+)\"")
TRANSFERS = {"upload_fileobj": "PutObject"}  # boto3's managed upload: PutObject or a multipart upload


def s3_operation(method: str) -> str:
    return TRANSFERS.get(method) or "".join(part.capitalize() for part in method.split("_"))


def test_install_md_names_every_s3_call_of_the_store() -> None:
    methods = set(S3_CALL.findall(S3_STORE.read_text(encoding="utf-8")))
    assert {"get_object", "put_object", "list_objects_v2", "delete_objects", "head_bucket"} <= methods
    permissions = INSTALL.read_text(encoding="utf-8").split("**Permissions.**", 1)[1].split("\n\n**", 1)[0]
    missing = sorted(s3_operation(m) for m in methods if s3_operation(m) not in permissions)
    assert not missing, f"docs/install.md, Permissions: add {missing} and the IAM action each needs"


# --- docs/operate.md lists every metric ---------------------------------------------------------------


def test_every_metric_in_the_code_is_in_operate_md_with_its_labels() -> None:
    table = documented_table(OPERATE.read_text(encoding="utf-8"))
    documented = {
        cells[0].strip("` "): tuple(label.strip("` ") for label in cells[3].split(",") if label.strip("` —"))
        for cells in (row.strip("|").split(" | ") for row in table.splitlines()[2:])
    }
    exported = {row.name: row.labels for row in metric_rows()}
    assert len(exported) >= 25  # the operator's and the worker's registries were both read
    missing = {name: labels for name, labels in exported.items() if documented.get(name) != labels}
    assert not missing, f"docs/operate.md misses or mislabels {sorted(missing)}: {REGENERATE}"
    gone = sorted(set(documented) - set(exported))
    assert not gone, f"docs/operate.md lists metrics the code does not export: {gone}: {REGENERATE}"


def alert_expressions() -> list[tuple[str, str]]:
    """(alert, expression) of every PrometheusRule in the docs."""
    found = []
    for block in yaml_blocks():
        for doc in yaml.safe_load_all(block.text):
            if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
                for group in doc["spec"]["groups"]:
                    found += [(f"{block.where} {rule['alert']}", rule["expr"]) for rule in group["rules"]]
    return found


def test_alerts_query_only_exported_metrics_and_labels() -> None:
    alerts = alert_expressions()
    assert len(alerts) >= 5
    labels_of = {row.name: set(row.labels) for row in metric_rows()}
    for alert, expr in alerts:
        names = re.findall(r"\b(shardops_\w+)", expr)
        assert names, f"{alert}: names no shardops metric"
        assert [n for n in names if n not in labels_of] == [], f"{alert}: {expr}"
        used = {label for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
        used |= set(re.findall(r"\{(\w+)=", expr))
        known = set().union(*(labels_of[n] for n in names))
        assert {label.strip() for label in used} <= known, f"{alert}: labels {used} not in {known}"


def test_the_metrics_table_is_the_generated_one() -> None:
    assert documented_table(OPERATE.read_text(encoding="utf-8")) == metrics_table(), REGENERATE


# --- what the docs say is tested -------------------------------------------------------------------


def test_the_litellm_version_the_docs_call_tested_is_the_pinned_one() -> None:
    pins = (ROOT / "testbed" / "litellm" / "versions.env").read_text()
    (pinned,) = re.findall(r"^LITELLM_VERSION=(\S+)$", pins, flags=re.MULTILINE)
    said = {
        (relative(path), version)
        for path in user_docs()
        for version in re.findall(r"LiteLLM (\d+\.\d+\.\d+)", path.read_text())
    }
    assert said, "the user docs no longer say which LiteLLM is tested (e2e/test_litellm.py)"
    assert {version for _, version in said} == {pinned}, said
