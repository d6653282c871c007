"""The Dockerfile, read rather than built (no container runtime here): what it calls exists and works.

The image runs `shardops operator` (the chart's Deployment spells the same command) and, in worker
Jobs, `shardops worker --campaign X`. These tests keep the Dockerfile, the chart and the Python
entry points in step, and build the wheel from exactly the files the Dockerfile copies.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from shardops.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = [
    line.strip()
    for line in (ROOT / ".dockerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
CHART_VALUES = yaml.safe_load((ROOT / "charts" / "shardops" / "values.yaml").read_text())
DEPLOYMENT_TEMPLATE = (ROOT / "charts" / "shardops" / "templates" / "deployment.yaml").read_text()
VENV_BIN = Path(sys.executable).parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def exec_form(instruction: str) -> list[str]:
    (args,) = [rest for word, rest in instructions() if word == instruction]
    value: list[str] = json.loads(args)
    return value


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(n for n, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_both_stages_use_the_one_debian_base() -> None:
    (arg,) = [rest for word, rest in instructions() if word == "ARG" and rest.startswith("DEBIAN_IMAGE=")]
    assert re.fullmatch(r"DEBIAN_IMAGE=debian:bookworm-slim(@sha256:[0-9a-f]{64})?", arg), arg
    froms = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert froms == ["${DEBIAN_IMAGE}", "${DEBIAN_IMAGE}"], "the venv must find the build stage's interpreter"


def test_multi_stage_and_small_runtime() -> None:
    steps = instructions()
    assert next(rest for word, rest in steps if word == "FROM").endswith("AS build")
    runtime = final_stage()
    copies = [rest for word, rest in runtime if word == "COPY"]
    assert copies == ["--from=build /opt/shardops /opt/shardops"], "the runtime stage gets the venv only"
    (install,) = [rest for word, rest in runtime if word == "RUN"]
    assert "python3-venv" not in install and "pip" not in install, "the runtime stage installs no build tools"
    assert "pip uninstall --yes pip" in DOCKERFILE


def test_runs_as_the_charts_non_root_user() -> None:
    (user,) = [rest for word, rest in final_stage() if word == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, "a numeric non-root UID, so runAsNonRoot can be verified"
    assert int(uid) == CHART_VALUES["operator"]["podSecurityContext"]["runAsUser"]
    assert int(gid) == CHART_VALUES["operator"]["podSecurityContext"]["runAsGroup"]


def test_entrypoint_is_the_shardops_console_script_and_the_charts_command() -> None:
    entrypoint, cmd = exec_form("ENTRYPOINT"), exec_form("CMD")
    assert entrypoint == ["shardops"]
    assert cmd == ["operator"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["shardops"] == "shardops.main:main"
    # The Deployment spells the image's entry point out (clusters that run commands, not images).
    assert 'command: ["shardops", "operator"]' in DEPLOYMENT_TEMPLATE
    assert entrypoint + cmd == ["shardops", "operator"]


def test_the_image_commands_exist_in_the_cli() -> None:
    parser = build_parser()
    assert parser.parse_args(["operator"]).command == "operator"
    worker = parser.parse_args(["worker", "--campaign", "demo"])
    assert (worker.command, worker.campaign) == ("worker", "demo")


@pytest.mark.parametrize("command", [["operator", "--help"], ["worker", "--help"], ["--help"]])
def test_console_script_runs(command: list[str]) -> None:
    """The installed `shardops` script (what the image's PATH resolves) starts and parses its commands."""
    script = VENV_BIN / "shardops"
    if not script.exists():
        pytest.skip(f"no console script at {script}: run `make venv`")
    result = subprocess.run([str(script), *command], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "usage: shardops" in result.stdout


def copied_sources() -> list[str]:
    sources = []
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *srcs, _dest = rest.split()
            sources += [s.rstrip("/") for s in srcs]
    return sources


def ignored(path: str) -> bool:
    """Docker's .dockerignore rule for one path, for the pattern forms used there (`*`, `dir/`,
    `**/name`, `!` to re-include): a pattern matching the path or one of its parent directories
    decides, and the last one that matches wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in DOCKERIGNORE:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if glob.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, glob[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, glob) for prefix in prefixes)
        if hit:
            excluded = not negate
    return excluded


def test_copied_sources_exist_and_are_in_the_build_context() -> None:
    sources = copied_sources()
    assert sources == ["pyproject.toml", "constraints.txt", "README.md", "operator", "examples"]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
    for kept_out in (".venv", ".git", ".shardops", "tests", "e2e", "charts", "operator/shardops/__pycache__"):
        assert ignored(kept_out), f"{kept_out} is sent to the docker daemon"


def test_the_copied_files_build_the_package_with_its_entry_points(tmp_path: Path) -> None:
    """What `pip install .` does in the build stage, on exactly the files the Dockerfile copies."""
    context = tmp_path / "context"
    context.mkdir()
    for source in copied_sources():
        src = ROOT / source
        if src.is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(src, context / source, ignore=skip)
        else:
            shutil.copy2(src, context / source)
    dist = tmp_path / "dist"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(dist),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    offline = re.search(r"connection|resolve|No matching distribution|network", result.stderr, re.I)
    if result.returncode != 0 and offline:
        pytest.skip(f"pip could not fetch the build backend (setuptools):\n{result.stderr[-500:]}")
    assert result.returncode == 0, result.stderr
    (wheel,) = dist.glob("shardops-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points_file,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(entry_points_file).decode()
    assert "shardops/main.py" in names and "shardops/worker/main.py" in names
    assert "shardops = shardops.main:main" in entry_points
    # The sample campaigns' command, for `kubectl apply -f crds/samples/...` on the image as is.
    assert "shardops-example-agent = shardops_example_agent.agent:main" in entry_points
    assert any(n.startswith("shardops_example_agent/") for n in names)
