"""The README's laptop quick start quotes the lines `make demo` ends with (testbed/demo.py), with this
checkout's paths as placeholders; e2e/test_demo.py pastes the real ones into a new shell."""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.cluster import lifecycle

from testbed import demo
from tests.docskit import README, fenced_blocks

KUBECTL_AND_HELM = "<kubectl and helm>"


def quoted(lines: list[str]) -> list[str]:
    """The lines as the README shows them: the checkout's path is <checkout>, its venv's .venv."""
    venv_bin = str(Path(sys.prefix) / "bin")
    return [
        line.replace(venv_bin, "<checkout>/.venv/bin").replace(str(demo.REPO_ROOT), "<checkout>")
        for line in lines
    ]


def test_the_readme_quotes_the_lines_the_demo_prints() -> None:
    kubeconfig = str(lifecycle.DEFAULT_DIR / "kubeconfig")
    printed = demo.try_lines(kubeconfig, Path(KUBECTL_AND_HELM), "demo", lifecycle.DEFAULT_DIR)
    blocks = [block.text.splitlines() for block in fenced_blocks(README)]
    assert quoted(printed) in blocks, "README.md quotes none of:\n" + "\n".join(quoted(printed))


def test_the_demo_prints_absolute_paths_and_stops_its_own_cluster(tmp_path: Path) -> None:
    printed = demo.try_lines("/k/kubeconfig", Path("/tools"), "demo", tmp_path)
    assert printed[0] == f"export KUBECONFIG=/k/kubeconfig PATH=/tools:{sys.prefix}/bin:$PATH"
    assert printed[-1].startswith(f"make -C {demo.REPO_ROOT} cluster-down CLUSTER_DIR={tmp_path} ")
    # Against a cluster the demo did not start (KUBECONFIG set), there is nothing of its to stop.
    assert "cluster-down" not in "\n".join(demo.try_lines("/k/kubeconfig", Path("/tools"), "demo", None))
