"""`make image` (hack/image.sh) and the Dockerfile build the same image: read, not built.

hack/image.sh builds without Docker (mmdebstrap + buildah); the Dockerfile is for users with Docker.
Their base (Debian's suite and its python3), packages, venv path, user, working directory,
entry point, command, environment and labels must agree, and the archive's name must be the one
the chart installs by default. e2e/test_image.py inspects the built archive itself.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from tests.image.test_dockerfile import exec_form, final_stage, instructions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "hack" / "image.sh").read_text()
CHART = yaml.safe_load((ROOT / "charts" / "shardops" / "Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts" / "shardops" / "values.yaml").read_text())


def script_variable(name: str) -> str:
    (value,) = re.findall(rf"^{name}=(.*)$", SCRIPT, re.M)
    return value.strip().strip('"')


def buildah_config_flags() -> list[tuple[str, str]]:
    """(flag, value) of the `buildah config` call, quotes resolved as the shell would."""
    (call,) = re.findall(
        r"buildah \"\$\{buildah_store\[@\]\}\" config \\\n(.*?)\"\$container\"", SCRIPT, re.S
    )
    words = shlex.split(call.replace("\\\n", " "))
    return list(zip(words[::2], words[1::2], strict=True))


def dockerfile_assignments(instruction: str) -> dict[str, str]:
    """KEY=VALUE pairs of every `instruction` (ENV, LABEL) in the final stage."""
    pairs: dict[str, str] = {}
    for word, rest in final_stage():
        if word == instruction:
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                pairs[key] = value
    return pairs


def apt_packages(stage: list[tuple[str, str]]) -> set[str]:
    (run,) = [rest for word, rest in stage if word == "RUN" and "apt-get install" in rest]
    words = run.split("apt-get install", 1)[1].split("&&")[0].split()
    return {w for w in words if not w.startswith("-")}


def build_stage() -> list[tuple[str, str]]:
    steps = instructions()
    second_from = [n for n, (word, _) in enumerate(steps) if word == "FROM"][1]
    return steps[:second_from]


def test_same_debian_suite_and_python_from_debian() -> None:
    suite = script_variable("suite")
    # Debian's -slim images are debootstrap's minbase: what mmdebstrap's minbase resembles.
    assert script_variable("variant") == "minbase"
    (arg,) = [rest for word, rest in instructions() if word == "ARG" and rest.startswith("DEBIAN_IMAGE=")]
    assert arg.split("=", 1)[1].split("@")[0] == f"debian:{suite}-slim"
    runtime = set(script_variable("runtime_packages").split(","))
    assert "python3" in runtime
    assert apt_packages(final_stage()) == runtime
    assert apt_packages(build_stage()) == {"python3", *script_variable("build_packages").split(",")}


def test_same_venv_installed_with_the_constraints_and_without_pip() -> None:
    venv = script_variable("venv")
    assert [rest for word, rest in final_stage() if word == "COPY"] == [f"--from=build {venv} {venv}"]
    assert "python3 -m venv $venv" in SCRIPT
    assert "--constraint /wheels/constraints.txt shardops" in SCRIPT
    assert "--no-index" in SCRIPT, "the rootfs installs from the wheels pip fetched, nothing else"
    assert "$venv/bin/pip uninstall --quiet --yes pip" in SCRIPT


def test_same_user_workdir_entrypoint_command() -> None:
    flags = dict(buildah_config_flags())
    (user,) = [rest for word, rest in final_stage() if word == "USER"]
    (workdir,) = [rest for word, rest in final_stage() if word == "WORKDIR"]
    assert script_variable("image_user") == user
    assert flags["--user"] == "$image_user"
    assert script_variable("image_workdir") == workdir
    assert json.loads(flags["--entrypoint"]) == exec_form("ENTRYPOINT") == ["shardops"]
    assert json.loads(flags["--cmd"]) == exec_form("CMD") == ["operator"]


def test_same_named_user() -> None:
    """kopf names its peering identity after getpass.getuser(): UID 65532 must have a passwd entry."""
    (runtime_run,) = [rest for word, rest in final_stage() if word == "RUN"]
    passwd, group = script_variable("passwd_entry"), script_variable("group_entry")
    assert f"echo '{passwd}' >>/etc/passwd" in runtime_run
    assert f"echo '{group}' >>/etc/group" in runtime_run
    uid, gid = script_variable("image_user").split(":")
    assert passwd.split(":")[2:4] == [uid, gid] and group.split(":")[2] == gid


def test_same_environment_and_labels() -> None:
    venv = script_variable("venv")
    flags = buildah_config_flags()
    env = dict(value.replace("$venv", venv).split("=", 1) for flag, value in flags if flag == "--env")
    labels = dict(value.split("=", 1) for flag, value in flags if flag == "--label")
    assert env == dockerfile_assignments("ENV")
    assert env["PATH"].split(":")[0] == f"{venv}/bin"
    assert labels == dockerfile_assignments("LABEL")


def test_the_archive_is_named_as_the_charts_default_image() -> None:
    name = script_variable("image_name")
    assert name == f"{VALUES['image']['repository']}:$version"
    assert VALUES["image"]["tag"] == "", "the chart's default tag is its appVersion"
    version = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None and CHART["appVersion"] == version.group(1)
