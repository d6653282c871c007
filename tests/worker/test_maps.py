"""The module maps at the top of worker/, k8s/, cli/, scheduler/ and state/'s `__init__.py`: every module of
the package is listed once, and lowest first — a module imports only the modules listed above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "operator" / "shardops"
# A map line: four spaces, a module file name, then its description.
_ENTRY = re.compile(r"^    (\w+\.py)\s", re.MULTILINE)


def listed(package: str) -> list[str]:
    doc = ast.get_docstring(ast.parse((PACKAGES / package / "__init__.py").read_text())) or ""
    return _ENTRY.findall(doc)


def imported_siblings(package: str, module: str) -> set[str]:
    """The modules of `package` that `module` imports (any form of `shardops.<package>...` import)."""
    tree = ast.parse((PACKAGES / package / module).read_text())
    prefix = f"shardops.{package}"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == prefix:
                found.update(f"{alias.name}.py" for alias in node.names)
            elif node.module.startswith(prefix + "."):
                found.add(node.module.removeprefix(prefix + ".").split(".")[0] + ".py")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(prefix + "."):
                    found.add(alias.name.removeprefix(prefix + ".").split(".")[0] + ".py")
    return found - {module}


@pytest.mark.parametrize("package", ["worker", "k8s", "cli", "scheduler", "state"])
def test_the_map_lists_every_module_once(package: str) -> None:
    on_disk = sorted(p.name for p in (PACKAGES / package).glob("*.py") if p.name != "__init__.py")
    entries = listed(package)
    assert len(entries) == len(set(entries)), f"{package}/__init__.py lists a module twice: {entries}"
    assert sorted(entries) == on_disk, (
        f"{package}/__init__.py lists {sorted(entries)}, the package has {on_disk}"
    )


@pytest.mark.parametrize("package", ["worker", "k8s", "cli", "scheduler", "state"])
def test_the_map_is_lowest_first(package: str) -> None:
    entries = listed(package)
    for position, module in enumerate(entries):
        above = set(entries[:position])
        later = imported_siblings(package, module) - above
        assert not later, f"{package}/{module} imports {sorted(later)}, listed below it in the map"
