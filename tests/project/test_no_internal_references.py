"""What users read states its rules itself: no product file and no text `kubectl campaign` prints cites
a source document that is not in the repository ("seed 000", "seed 001 §2.2") or DESIGN.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from shardops.cli import campaign as cli
from shardops.k8s.api import EVENTS, LEASES
from tests.clikit import campaign_body, cluster, done_status, history, run, shard_body, t
from tests.fakekube import FakeKube

REPO = Path(__file__).resolve().parents[2]
# What users, operators and contributors of shardops read: the docs, the chart, the README, the
# contributors' guide and the code itself.
PRODUCT = [REPO / "docs", REPO / "charts", REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "operator"]
INTERNAL = re.compile(r"\bseeds?\b[\s/_-]*\d|\bDESIGN\.md\b", re.IGNORECASE)


def internal_references(text: str) -> list[str]:
    """The lines of `text` that cite an internal document."""
    return [line.strip() for line in text.splitlines() if INTERNAL.search(line)]


@pytest.mark.parametrize(
    "text",
    [
        "Closing checklist (seed 000)",
        "Seed 000's order, with the command for each step",
        "fenced (seed 001 §2.2).",
        "the seeds 000 and 001",
        "see seeds/002_trade-offs",
        "See DESIGN.md, 'Shard state machine'.",
    ],
)
def test_the_checker_finds_internal_references(text: str) -> None:
    assert internal_references(f"before\n{text}\nafter") == [text.strip()]


@pytest.mark.parametrize(
    "text",
    [
        "Closing checklist",
        "random.seed(0) and a seeded Random",
        "seeds the planner with 3 shards",
        "docs/architecture.md, section Leases",
        "REDESIGN.mdx",
    ],
)
def test_the_checker_lets_plain_text_pass(text: str) -> None:
    assert internal_references(text) == []


def product_files() -> list[Path]:
    files: list[Path] = []
    for root in PRODUCT:
        found = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files += [p for p in found if "__pycache__" not in p.parts]
    return files


def test_the_product_files_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in product_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/user-guide.md", "charts/shardops/Chart.yaml"} <= names
    assert {"docs/worker-command.md", "docs/contributing/fault-suite.md"} <= names
    assert "operator/shardops/cli/campaign_report.py" in names


def test_no_product_file_cites_an_internal_document() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in product_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if internal_references(line)
    ]
    assert not found, "state the rule itself, or cite a document in the repository:\n" + "\n".join(found)


# --- what kubectl campaign prints ---------------------------------------------------------------------


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_help_texts_cite_no_internal_document() -> None:
    texts = {"kubectl campaign": cli.build_parser().format_help()}
    texts |= {name: parser.format_help() for name, parser in commands().items()}
    assert set(texts) >= {
        "list",
        "status",
        "plan",
        "events",
        "report",
        "suspend",
        "resume",
        "retry",
        "cancel",
    }
    found = {name: internal_references(text) for name, text in texts.items() if internal_references(text)}
    assert not found


def every_kind_of_shard() -> FakeKube:
    """A campaign with a shard in every phase, a breaker, a budget, conditions, Events and a Lease:
    every part of every view has something to show."""
    status = {
        "phase": "Running",
        "observedGeneration": 1,
        "spent": 0.75,
        "shardsTotal": 7,
        "counts": {"done": 1, "running": 1, "pending": 1, "blocked": 1, "failed": 1},
        "breakers": [{"source": "large", "state": "Open", "openedAt": t(100), "reason": "3 rate-limited"}],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "SpecValid",
                "message": "6",
                "lastTransitionTime": t(9),
            }
        ],
    }
    kube = cluster(
        campaign_body(
            items=6,
            budget={"limit": 2.0},
            sources=[{"name": "large", "fallback": "small"}, {"name": "small"}],
            finalize={"image": "x", "command": ["merge"]},
            status=status,
        ),
        shard_body("papers", 0, "Done", status=done_status(300, cost=0.5)),
        shard_body(
            "papers",
            1,
            "Running",
            attempt=2,
            source="large",
            status={
                "owner": "w-7",
                "leaseUntil": t(-40),
                "lastHeartbeat": t(5),
                "progress": {"done": 3, "total": 5},
                "cost": 0.25,
                "history": history(
                    ("Running", "Claimed", 150, 1, {"owner": "w-1", "event": "ev-c1"}),
                    ("Pending", "AttemptFailed", 120, 1, {"event": "ev-f1", "errorClass": "rate-limited"}),
                    ("Running", "Claimed", 60, 2, {"owner": "w-7"}),
                ),
            },
        ),
        shard_body(
            "papers",
            2,
            "Blocked",
            attempt=3,
            status={"lastError": {"class": "timeout", "message": "slow", "event": "ev-b2", "at": t(50)}},
        ),
        shard_body("papers", 3, "Failed", status={"lastError": {"class": "invalid-input", "message": "bad"}}),
        shard_body("papers", 4, "Pending", status={"history": history(("Pending", "Materialized", 90, 1))}),
        shard_body("papers", 5, None),
        shard_body("papers", 6, "Paused", managers=("kubectl-patch",)),
    )
    for name, reason, seconds in (("ev-c1", "Claimed", 150), ("ev-s1", "Stalled", 100)):
        kube.add(
            EVENTS,
            {
                "metadata": {"name": name, "namespace": "ns"},
                "eventTime": t(seconds),
                "reason": reason,
                "note": f"{reason} note",
                "regarding": {"kind": "Shard", "name": "papers-00001", "uid": "uid-papers-00001"},
            },
        )
    kube.add(
        LEASES,
        {
            "metadata": {"name": "papers-00001", "namespace": "ns"},
            "spec": {"holderIdentity": "w-7", "leaseDurationSeconds": 60, "renewTime": t(5)},
        },
    )
    return kube


READS = [
    ["list"],
    ["list", "-A"],
    ["status", "papers"],
    ["plan", "papers"],
    ["events", "papers-00001"],
    ["events", "papers-00002"],
    ["report", "papers"],
]
ACTIONS = [["suspend", "papers"], ["resume", "papers"], ["retry", "papers"], ["cancel", "papers"]]


@pytest.mark.parametrize("output", ["human", "json", "yaml"])
@pytest.mark.parametrize("argv", READS + ACTIONS, ids=" ".join)
def test_every_view_cites_no_internal_document(argv: list[str], output: str) -> None:
    result = run(every_kind_of_shard(), "-n", "ns", "-o", output, *argv)
    assert result.code in (0, 1), result.err  # report exits 1 on a failing checklist line
    assert result.out.strip()
    assert internal_references(result.out + result.err) == []
