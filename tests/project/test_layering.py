"""`logic/` stays pure: no Kubernetes, no network or file I/O, no clock or randomness it was not handed.

The checker resolves import aliases, so `import datetime as dt; dt.datetime.now()` is caught too,
and it is itself tested against known-bad and known-good snippets so a pass means something.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LOGIC_DIR = Path(__file__).resolve().parents[2] / "operator" / "shardops" / "logic"
LOGIC_PACKAGE = "shardops.logic"

# Everything logic may import. A new stdlib module must be added here on purpose, after checking
# that it does no I/O and reads no clock.
ALLOWED_IMPORTS = frozenset(
    {
        "__future__",
        "bisect",
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "math",
        "operator",
        # Only for the `random.Random` type of an injected generator; module functions are refused below.
        "random",
        "re",
        "signal",
        "statistics",
        "string",
        "typing",
        "shardops.api.enums",
        # Amounts: pure decimal parsing and printing (no pydantic, no I/O).
        "shardops.api.money",
    }
)
NAMED_OFFENDERS = {
    "kopf": "the operator framework",
    "kubernetes": "the Kubernetes client",
    "requests": "network I/O",
    "urllib": "network I/O",
    "urllib3": "network I/O",
    "http": "network I/O",
    "httpx": "network I/O",
    "aiohttp": "network I/O",
    "socket": "network I/O",
    "subprocess": "process I/O",
    "os": "environment and file I/O",
    "time": "the wall clock",
    "pathlib": "file I/O",
    "io": "file I/O",
    "shutil": "file I/O",
    "tempfile": "file I/O",
    "logging": "log I/O: return a reason string instead",
    "secrets": "uninjectable randomness",
    "uuid": "uninjectable randomness",
    "pydantic": "the api models: logic takes its own dataclasses",
}
FORBIDDEN_NAMES = {
    "os.environ": "environment access",
    "os.getenv": "environment access",
    "os.putenv": "environment access",
    "os.urandom": "uninjectable randomness",
    "time.time": "the wall clock",
    "time.time_ns": "the wall clock",
    "time.monotonic": "the clock",
    "time.monotonic_ns": "the clock",
    "time.perf_counter": "the clock",
    "time.perf_counter_ns": "the clock",
    "time.process_time": "the clock",
    "time.sleep": "sleeping",
    "datetime.datetime.now": "the wall clock: take `now` as a parameter",
    "datetime.datetime.utcnow": "the wall clock: take `now` as a parameter",
    "datetime.datetime.today": "the wall clock: take `now` as a parameter",
    "datetime.date.today": "the wall clock: take `now` as a parameter",
    "uuid.uuid1": "uninjectable randomness",
    "uuid.uuid4": "uninjectable randomness",
    "open": "file I/O",
    "input": "terminal I/O",
    "print": "terminal I/O",
    "breakpoint": "debugging left in",
    "eval": "dynamic code",
    "exec": "dynamic code",
    "__import__": "dynamic imports dodge this check",
}
# random.Random is the type of an injected generator; every other attribute is the shared global one.
RANDOM_ALLOWED = frozenset({"random.Random"})


def _import_allowed(module: str) -> bool:
    if module == LOGIC_PACKAGE or module.startswith(LOGIC_PACKAGE + "."):
        return True
    return module in ALLOWED_IMPORTS


def _check_import(module: str, line: int) -> list[str]:
    root = module.partition(".")[0]
    if root in NAMED_OFFENDERS:
        return [f"line {line}: imports {module} ({NAMED_OFFENDERS[root]})"]
    if not _import_allowed(module):
        return [f"line {line}: imports {module}, which is not on the logic allowlist"]
    return []


def _absolute(node: ast.ImportFrom, module_name: str) -> str:
    if node.level == 0:
        return node.module or ""
    package = module_name.split(".")[: -node.level]
    return ".".join([*package, *([node.module] if node.module else [])])


class _Checker(ast.NodeVisitor):
    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        self.aliases: dict[str, str] = {}
        self.problems: list[str] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.problems += _check_import(alias.name, node.lineno)
            bound = alias.asname or alias.name.partition(".")[0]
            self.aliases[bound] = alias.name if alias.asname else bound

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _absolute(node, self.module_name)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            # `from pkg import module` imports a module; `from module import name` imports a name.
            target = full if _import_allowed(full) or base.startswith(LOGIC_PACKAGE) else base
            self.problems += _check_import(target, node.lineno)
            self.aliases[alias.asname or alias.name] = full
            self._check_name(full, node.lineno)

    def visit_Name(self, node: ast.Name) -> None:
        self._check_name(self.aliases.get(node.id, node.id), node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted is None:
            self.generic_visit(node)
            return
        self._check_name(dotted, node.lineno)

    def _dotted(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def _check_name(self, dotted: str, line: int) -> None:
        parts = dotted.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix in FORBIDDEN_NAMES:
                self.problems.append(f"line {line}: uses {prefix} ({FORBIDDEN_NAMES[prefix]})")
                return
        if parts[0] == "random" and len(parts) > 1 and ".".join(parts[:2]) not in RANDOM_ALLOWED:
            self.problems.append(
                f"line {line}: uses {'.'.join(parts[:2])} (module-level randomness: inject a Random)"
            )


def violations(source: str, module_name: str = f"{LOGIC_PACKAGE}.example") -> list[str]:
    checker = _Checker(module_name)
    checker.visit(ast.parse(source))
    return checker.problems


def _logic_modules() -> list[Path]:
    return sorted(LOGIC_DIR.glob("*.py"))


def test_logic_package_is_found() -> None:
    names = {p.name for p in _logic_modules()}
    assert {"planner.py", "leases.py", "transitions.py"} <= names


@pytest.mark.parametrize("path", _logic_modules(), ids=lambda p: p.name)
def test_logic_module_is_pure(path: Path) -> None:
    problems = violations(path.read_text(encoding="utf-8"), f"{LOGIC_PACKAGE}.{path.stem}")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source",
    [
        "import kopf",
        "import kubernetes.client",
        "from kubernetes import client",
        "import requests",
        "from urllib.request import urlopen",
        "import socket",
        "import subprocess",
        "import os\nos.environ['X']",
        "from os import environ",
        "from os import getenv as g",
        "import time\ntime.time()",
        "from time import monotonic",
        "from datetime import datetime\ndatetime.now()",
        "import datetime\ndatetime.datetime.utcnow()",
        "import datetime as dt\ndt.datetime.now()",
        "from datetime import date as D\nD.today()",
        "import random\nrandom.random()",
        "import random as r\nr.choice([1])",
        "from random import shuffle",
        "import random\ndef f(rng=random.random): pass",
        "open('x')",
        "print('hi')",
        "from shardops.api import models",
        "from shardops.api.campaign import CampaignSpec",
        "import shardops.k8s.api",
        "from ..k8s import api",
        "import pydantic",
        "import sqlite3",
    ],
)
def test_checker_catches(source: str) -> None:
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "from datetime import UTC, datetime, timedelta\nx = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(1)",
        "from datetime import datetime\ndef f(now: datetime) -> datetime:\n    return now",
        "import random\ndef f(rng: random.Random) -> float:\n    return rng.random()",
        "from random import Random\ndef f(rng: Random) -> float:\n    return rng.uniform(0, 1)",
        "from collections.abc import Callable\ndef f(rand: Callable[[], float]) -> float:\n    return rand()",
        "from shardops.api.enums import ShardPhase",
        "from shardops.api import enums",
        "from shardops.logic.shardview import ShardView",
        "from .views import ShardView",
        "from . import budget",
        "import hashlib, json, math",
        "x = obj.now()",
    ],
)
def test_checker_allows(source: str) -> None:
    assert violations(source) == []


# --- package layering -----------------------------------------------------------------------------
# Imports point down only: api < logic < k8s < store < state < {scheduler, worker, cli, llm,
# batchapi}; the entry packages never import each other. `shardops/__init__.py` (group and version)
# sits below everything; `shardops/main.py`, the `shardops` command, above everything: it only
# dispatches to the entry points.
PACKAGE_DIR = LOGIC_DIR.parent
PACKAGE_RANKS = {
    "api": 0,
    "logic": 1,
    "k8s": 2,
    "store": 3,
    "state": 4,
    "scheduler": 5,
    "worker": 5,
    "cli": 5,
    "llm": 5,
    "batchapi": 5,
}
# clock: the wall clock and its skew settings both entry packages share; proxies: the HTTP proxy of a
# URL from the environment (S3 and LLM clients); neither imports anything of shardops.
ROOT_MODULES = {"shardops": -1, "shardops.clock": -1, "shardops.proxies": -1, "shardops.main": 6}


def _rank(module: str) -> tuple[int, str] | None:
    """The layer of a `shardops` module (and the name it counts under); None for third-party ones."""
    parts = module.split(".")
    if parts[0] != "shardops":
        return None
    if len(parts) > 1 and parts[1] in PACKAGE_RANKS:
        return PACKAGE_RANKS[parts[1]], parts[1]
    if len(parts) > 1 and f"shardops.{parts[1]}" in ROOT_MODULES:
        return ROOT_MODULES[f"shardops.{parts[1]}"], f"shardops.{parts[1]}"
    if len(parts) <= 2:  # `from shardops import API_GROUP`: the package root
        return ROOT_MODULES["shardops"], "shardops"
    raise AssertionError(f"{module}: a package not in PACKAGE_RANKS; give it its layer")


def layering_violations(source: str, module_name: str) -> list[str]:
    """Imports of `module_name` that point up a layer or sideways into a sibling entry package."""
    own = _rank(module_name)
    assert own is not None
    own_rank, own_layer = own
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module_name)
            # `from shardops import API_GROUP` names the root; `from shardops.state import observe` a module.
            targets = [
                (f"{base}.{a.name}" if base != "shardops" or a.name == "main" else base, node.lineno)
                for a in node.names
            ]
        else:
            continue
        for target, line in targets:
            found = _rank(target)
            if found is None:
                continue
            rank, layer = found
            if layer == own_layer:
                continue
            if rank > own_rank:
                problems.append(f"line {line}: imports {target}, a layer above {own_layer}")
            elif rank == own_rank:
                problems.append(f"line {line}: imports {target}, a sibling of {own_layer}")
    return problems


def _all_modules() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_every_package_has_a_layer() -> None:
    on_disk = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert on_disk == set(PACKAGE_RANKS)


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_imports_point_down(path: Path) -> None:
    problems = layering_violations(path.read_text(encoding="utf-8"), _module_name(path))
    assert not problems, f"{path.relative_to(PACKAGE_DIR)}:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from shardops.scheduler import builders", "shardops.state.observe"),  # upward
        ("from shardops.state import observe", "shardops.k8s.api"),  # upward
        ("import shardops.k8s.api", "shardops.logic.planner"),  # upward
        ("from shardops.worker.runtime import Worker", "shardops.cli.campaign"),  # sibling
        ("from shardops.scheduler.settings import OperatorSettings", "shardops.worker.claim"),  # sibling
        ("from ..scheduler import builders", "shardops.cli.campaign"),  # relative sibling
        ("from shardops.main import main", "shardops.cli.campaign"),  # the root command is on top
        # The reconcile's parts are the scheduler's: none reaches into the CLI (sideways).
        ("from shardops.cli.campaign_summary import budget_dict", "shardops.scheduler.sweep"),
        ("from shardops.cli import campaign_status", "shardops.scheduler.fold"),
        ("from ..cli.campaign_summary import parse_shards", "shardops.scheduler.status"),
    ],
)
def test_layering_checker_catches(source: str, module: str) -> None:
    assert layering_violations(source, module)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from shardops.state import observe", "shardops.worker.claim"),
        ("from shardops.logic.planner import plan_dispatch", "shardops.state.observe"),
        ("from shardops import API_GROUP", "shardops.k8s.api"),
        ("from shardops.api.names import SHARD_KIND", "shardops.api.crdgen"),
        ("from .builders import shard_body", "shardops.scheduler.reconcile"),
        ("from shardops.scheduler.main import run_operator", "shardops.main"),
        ("import json", "shardops.cli.campaign"),
    ],
)
def test_layering_checker_allows(source: str, module: str) -> None:
    assert layering_violations(source, module) == []


# The reconcile's parts: each a module of scheduler/, so the layering check above covers it.
SCHEDULER_PARTS = (
    "memory",
    "observed",
    "stores",
    "writes",
    "items",
    "sweep",
    "history",
    "fold",
    "retry",
    "dispatch",
    "status",
)


def test_the_reconciles_parts_are_checked_and_import_no_cli() -> None:
    checked = {_module_name(path): path for path in _all_modules()}
    for part in SCHEDULER_PARTS:
        module = f"shardops.scheduler.{part}"
        assert module in checked, f"{module} is not among the modules the layering check reads"
        source = checked[module].read_text(encoding="utf-8")
        assert "shardops.cli" not in source and "from ..cli" not in source, f"{module} imports the CLI"
    sweep = checked["shardops.scheduler.sweep"].read_text(encoding="utf-8")
    fold = checked["shardops.scheduler.fold"].read_text(encoding="utf-8")
    assert layering_violations(sweep, "shardops.scheduler.sweep") == []
    assert layering_violations(fold, "shardops.scheduler.fold") == []


# The status a pass wants and the summary both sides use are computed without I/O or a clock: the
# logic checker's offenders and forbidden names, though (unlike logic/) they may read the api models.
PURE_ABOVE_LOGIC = ("scheduler/status.py", "state/summary.py", "state/observe.py")


@pytest.mark.parametrize("relative", PURE_ABOVE_LOGIC)
def test_the_status_and_the_summary_are_pure(relative: str) -> None:
    path = PACKAGE_DIR / relative
    problems = [
        problem
        for problem in violations(path.read_text(encoding="utf-8"), _module_name(path))
        if "not on the logic allowlist" not in problem and "imports pydantic" not in problem
    ]
    assert not problems, f"{relative}:\n" + "\n".join(problems)
    imported = {
        node.module or ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
    }
    io = {m for m in imported if m.startswith(("shardops.k8s", "shardops.store", "shardops.clock"))}
    assert not io, f"{relative} imports {sorted(io)}: I/O or the clock"


def test_the_purity_check_catches_a_clock_in_the_status() -> None:
    problems = violations("import datetime as dt\nnow = dt.datetime.now()", "shardops.scheduler.status")
    assert any("wall clock" in problem for problem in problems)


# `shardops llm` runs under the worker runtime as the user's command would, without API server
# credentials (the runtime drops KUBECONFIG): it needs only the models, the pure rules and the clock.
LLM_ALLOWED_LAYERS = frozenset({"shardops", "api", "logic", "llm", "clock", "proxies"})


def llm_import_violations(source: str, module_name: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, _absolute(node, module_name)))
    problems = []
    for line, name in found:
        parts = name.split(".")
        layer = parts[1] if len(parts) > 1 else parts[0]
        if parts[0] == "shardops" and layer not in LLM_ALLOWED_LAYERS:
            problems.append(f"line {line}: imports {name}")
    return problems


def test_the_llm_checker_catches_api_server_access() -> None:
    assert llm_import_violations("from shardops.k8s import api", "shardops.llm.main") == [
        "line 1: imports shardops.k8s"
    ]
    assert llm_import_violations("from ..state import observe", "shardops.llm.main") != []
    assert llm_import_violations("from shardops import __version__", "shardops.llm.main") == []


@pytest.mark.parametrize(
    "path", sorted((PACKAGE_DIR / "llm").rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_DIR))
)
def test_the_llm_command_imports_only_api_and_logic(path: Path) -> None:
    problems = llm_import_violations(path.read_text(encoding="utf-8"), _module_name(path))
    assert not problems, "\n".join(problems)


# The repository's top-level packages point down too: the product (operator/shardops) imports none
# of the test code; testbed/ (what e2e, the fault suite, the demo and the benchmarks share) imports
# none of its users. A literal `importlib.import_module("e2e...")` counts as an import.
REPO_ROOT = PACKAGE_DIR.parents[1]
TOP_LEVEL_FORBIDDEN = {
    "shardops": frozenset({"testbed", "e2e", "tests", "benchmarks"}),
    "testbed": frozenset({"e2e", "tests", "benchmarks"}),
}
TOP_LEVEL_DIRS = {"shardops": PACKAGE_DIR, "testbed": REPO_ROOT / "testbed"}


def _imported_names(source: str, module_name: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, _absolute(node, module_name)))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"})
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def top_level_violations(source: str, module_name: str) -> list[str]:
    """Imports of `module_name` (in shardops or testbed) that reach a top-level package it must not."""
    package = module_name.partition(".")[0]
    forbidden = TOP_LEVEL_FORBIDDEN[package]
    return [
        f"line {line}: imports {name}, which {package} must never import"
        for line, name in _imported_names(source, module_name)
        if name.partition(".")[0] in forbidden
    ]


def _top_level_modules() -> list[tuple[str, Path]]:
    modules = []
    for package, root in TOP_LEVEL_DIRS.items():
        modules += [(package, path) for path in sorted(root.rglob("*.py"))]
    return modules


def test_testbed_is_found() -> None:
    assert (REPO_ROOT / "testbed" / "__init__.py").exists()
    assert len(_top_level_modules()) > len(_all_modules())


@pytest.mark.parametrize(
    ("package", "path"),
    _top_level_modules(),
    ids=[str(p.relative_to(REPO_ROOT)) for _, p in _top_level_modules()],
)
def test_top_level_imports_point_down(package: str, path: Path) -> None:
    parts = list(path.relative_to(TOP_LEVEL_DIRS[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    module_name = ".".join([package, *parts])
    problems = top_level_violations(path.read_text(encoding="utf-8"), module_name)
    assert not problems, f"{path.relative_to(REPO_ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from testbed.harness import wait_for", "shardops.scheduler.main"),
        ("import e2e.conftest", "shardops.worker.runtime"),
        ("from tests import fakekube", "shardops.k8s.api"),
        ("from benchmarks.plan import PLANS", "shardops.cli.campaign"),
        ("importlib.import_module('testbed.upstream')", "shardops.llm.main"),
        ("from e2e import conftest", "testbed.kits.scheduler"),
        ("import benchmarks.target", "testbed.harness"),
        ("from tests.fakes3 import FakeS3", "testbed.faults.results"),
        ("__import__('e2e.test_smoke')", "testbed.demo"),
    ],
)
def test_top_level_checker_catches(source: str, module: str) -> None:
    assert top_level_violations(source, module)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from shardops.k8s.api import Kube", "testbed.kits.worker"),
        ("from testbed.cluster import lifecycle", "testbed.harness"),
        ("from .history import History", "testbed.faults.checker"),
        ("import kubernetes", "shardops.k8s.api"),
        ("from shardops.api.names import SHARD_KIND", "shardops.api.crdgen"),
    ],
)
def test_top_level_checker_allows(source: str, module: str) -> None:
    assert top_level_violations(source, module) == []
