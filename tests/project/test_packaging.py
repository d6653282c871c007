"""Packaging: every third-party package the shipped code imports is a declared dependency in pyproject.toml.

A package that only arrives as a dependency of a dependency (urllib3 through kubernetes, botocore
through boto3) can go away or move to an incompatible version with that dependency's next release.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The code the wheel ships (pyproject's packages.find): the operator, the CLIs, the example agent.
SHIPPED = [ROOT / "operator" / "shardops", ROOT / "examples" / "agent"]
OWN = {"shardops", "shardops_example_agent"}


def _imported_top_level_modules() -> dict[str, str]:
    """Top-level module -> one file importing it (absolute imports only; stdlib and own excluded)."""
    found: dict[str, str] = {}
    for root in SHIPPED:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OWN:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normalized(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    distributions = packages_distributions()
    missing = []
    for module, where in sorted(_imported_top_level_modules().items()):
        names = {_normalized(d) for d in distributions.get(module, [module])}
        if not names & declared:
            missing.append(f"{module} (imported by {where}; distribution {sorted(names)})")
    assert not missing, f"add to [project] dependencies in pyproject.toml: {missing}"
