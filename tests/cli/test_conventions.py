"""What every CLI on a user's machine is expected to do: say its version, complete in the shell, and
install as a kubectl plugin (krew) under the names kubectl looks for."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from shardops import __version__
from shardops.cli import campaign as cli
from shardops.cli.campaign_completion import NO_FILE_COMPLETION, candidates
from shardops.main import build_parser as shardops_parser

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
KREW = ROOT / "plugins" / "krew" / "campaign.yaml"


def test_shardops_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        shardops_parser().parse_args(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"shardops {__version__}"
    assert __version__ == PYPROJECT["project"]["version"]


def test_kubectl_campaign_says_its_version() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["--version"], stdout=out, stderr=err) == 0
    assert out.getvalue().strip() == f"kubectl-campaign (shardops) {__version__}"


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([""], ["apply", "cancel", "completion", "events", "list", "plan", "purge", "report", "results"]),
        (["re"], ["report", "results", "resume", "retry"]),
        (["status", "--w"], ["--watch"]),
        (["-n", "team", "retry", "x", "--s"], ["--shard"]),
        (["completion", ""], ["bash", "zsh"]),
        (["status", ""], []),  # a campaign name: the user's
    ],
)
def test_completion_offers_commands_then_their_flags(words: list[str], expected: list[str]) -> None:
    found = candidates(cli.build_parser(), words)
    assert found[: len(expected)] == expected if words == [""] else found == expected


def test_completion_through_the_cli_and_kubectl_plugin_completion() -> None:
    out = io.StringIO()
    assert cli.main(["__complete", "sus"], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue().splitlines() == ["suspend"]
    scripts = PYPROJECT["project"]["scripts"]
    # kubectl 1.26+ runs kubectl_complete-<plugin> for `kubectl campaign <TAB>`.
    assert scripts["kubectl_complete-campaign"] == "shardops.cli.campaign:kubectl_complete_main"
    program = (
        "import sys; from shardops.cli.campaign import kubectl_complete_main as m; "
        "sys.argv = ['kubectl_complete-campaign', 'pl']; sys.exit(m())"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["plan", NO_FILE_COMPLETION]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_call_back_into_the_cli(shell: str, tmp_path: Path) -> None:
    out = io.StringIO()
    assert cli.main(["completion", shell], stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    assert "kubectl-campaign __complete" in text
    if shell == "bash":
        (tmp_path / "c.bash").write_text(text)
        checked = subprocess.run(
            ["bash", "-n", str(tmp_path / "c.bash")], check=False, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stderr


def test_the_krew_manifest_installs_the_plugin_kubectl_finds() -> None:
    """plugins/krew/campaign.yaml follows krew's Plugin schema (krew.googlecontainertools.github.com
    /v1alpha2): a name, a version, and per platform a selector, an archive URI with its sha256 and
    the binary krew links as kubectl-<name>."""
    plugin = yaml.safe_load(KREW.read_text())
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert plugin["kind"] == "Plugin" and plugin["metadata"]["name"] == "campaign"
    spec = plugin["spec"]
    assert spec["version"] == f"v{__version__}"
    assert spec["shortDescription"] and len(spec["shortDescription"]) <= 50 and spec["homepage"]
    assert spec["platforms"]
    for platform in spec["platforms"]:
        assert set(platform) >= {"selector", "uri", "sha256", "bin", "files"}
        assert platform["uri"].startswith("https://") and f"v{__version__}" in platform["uri"]
        # Written by the release (the manifest's header says how); never anything else.
        assert re.fullmatch(r"[0-9a-f]{64}|REPLACE_WITH_SHA256_AT_RELEASE", platform["sha256"])
        assert platform["bin"] == "kubectl-campaign"
        assert {"from", "to"} <= set(platform["files"][0])
        assert set(platform["selector"]["matchLabels"]) <= {"os", "arch"}


def test_the_license_is_the_one_pyproject_names() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS" in text
