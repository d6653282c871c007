"""`make demo` end to end, as a newcomer meets it: the demo runs its campaign to completion, and every
line it prints to try, pasted as printed into a new shell (no profile, a bare PATH, no KUBECONFIG),
exits 0 with what it should show; the last of them stops the demo's control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testbed.cluster import lifecycle
from testbed.harness import REPO_ROOT, external_kubeconfig

from testbed import demo

# Printed after each pasted line, with that line's exit status: where one line's output ends.
STATUS_MARK = "@@try-line-exit="


def printed_try_lines(output: str) -> list[str]:
    """The lines the demo printed to try: the indented lines after its TRY_HEADING."""
    after = output.split(demo.TRY_HEADING + "\n", 1)[1]
    lines = []
    for line in after.splitlines():
        if not line.startswith("  "):
            break
        lines.append(line[2:])
    return lines


def paste_into_new_shell(lines: list[str]) -> list[tuple[int, str]]:
    """Each line's exit status and output, the lines typed in order into one new bash whose
    environment is what a login leaves at the least: HOME and PATH=/usr/bin:/bin."""
    script = "".join(f"{line}\necho {STATUS_MARK}$?\n" for line in lines)
    shell = subprocess.run(
        ["bash", "--noprofile", "--norc"],
        input=script,
        env={"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = []
    output = shell.stdout
    for _ in lines:
        before, _, rest = output.partition(STATUS_MARK)
        status, _, output = rest.partition("\n")
        results.append((int(status) if status else -1, before))
    assert shell.returncode == 0, shell.stderr
    return results


@pytest.mark.long
def test_demo_try_lines_work_pasted_into_a_new_shell(tmp_path: Path) -> None:
    if external_kubeconfig() is not None:
        pytest.skip("about the local control plane the demo starts")
    cluster_dir = tmp_path / "cluster"
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "testbed.demo", f"--dir={cluster_dir}"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        lines = printed_try_lines(run.stdout)
        assert len(lines) == 5, lines
        assert lines[-1].startswith(f"make -C {REPO_ROOT} cluster-down CLUSTER_DIR={cluster_dir.resolve()}")

        results = paste_into_new_shell(lines)
        failed = [(line, result) for line, result in zip(lines, results, strict=True) if result[0] != 0]
        assert not failed, failed
        (_, exported), (_, listed), (_, status), (_, results_out), (_, stopped) = results
        assert exported == ""
        assert listed.splitlines()[1].split()[:2] == ["demo", "Succeeded"], listed
        assert "Succeeded" in status, status
        answers = [json.loads(line) for line in results_out.splitlines()]
        assert len(answers) == 24, results_out  # examples/demo.yaml's items
        assert "local control plane stopped" in stopped, stopped
        assert not lifecycle.leftovers(cluster_dir.resolve())
    finally:
        # Whatever failed above: the demo's supervisor and every process of its cluster end here.
        lifecycle.main(["down", f"--dir={cluster_dir}"])
