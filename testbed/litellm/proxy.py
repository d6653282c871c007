"""The LiteLLM proxy (`litellm --config`) on a free loopback port, serving one mocked model: every
chat completion it is asked for answers `mock_response` without reaching any provider. Installed by
install.sh beside this module, into a venv of its own; `installed()` runs it (a no-op when warm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.cluster.lifecycle import free_port, parent_death_signal
from testbed.harness import wait_for

INSTALL = Path(__file__).with_name("install.sh")
# LiteLLM reads a .env of its working directory and fetches its model price map from the internet
# at import unless told not to; the proxy runs without either (and without a database: no DATABASE_URL).
QUIET_ENV = {"LITELLM_MODE": "PRODUCTION", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# What of the test's environment must not reach the proxy's own Python.
FOREIGN_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "DATABASE_URL")


class LiteLlmUnavailable(Exception):
    """The pinned LiteLLM could not be installed on this machine (no PyPI): the message says why."""


def installed() -> Path:
    """The bin directory of the pinned LiteLLM, installed first when it is not."""
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-5:]
        raise LiteLlmUnavailable(f"{INSTALL.relative_to(INSTALL.parents[2])} failed: " + " | ".join(why))
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class LiteLlmProxy:
    base_url: str  # up to /v1, as a Source's baseUrl
    api_key: str  # its master key: the only key it accepts
    model: str  # the model name its config serves
    mock_response: str  # what that model answers
    log: Path

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.base_url.removesuffix('/v1')}/health/liveliness", timeout=2
            ) as r:
                return bool(r.status == 200)
        except OSError:
            return False


@contextlib.contextmanager
def litellm_proxy(
    bin_dir: Path, directory: Path, *, api_key: str, model: str = "mocked-gpt", mock_response: str
) -> Iterator[LiteLlmProxy]:
    """The proxy started from `bin_dir` with its config, log and working directory in `directory`,
    answering before this yields; stopped after. `api_key` must start with `sk-` (LiteLLM's rule for
    a master key)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_list": [
            {
                "model_name": model,
                # An OpenAI-compatible provider that is never called: mock_response answers instead.
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_key": "unused",
                    "mock_response": mock_response,
                },
            }
        ],
        "general_settings": {"master_key": api_key},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    proxy = LiteLlmProxy(
        f"http://127.0.0.1:{port}/v1", api_key, model, mock_response, directory / "litellm.log"
    )
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV} | QUIET_ENV
    with proxy.log.open("ab") as log:
        process = subprocess.Popen(
            [str(bin_dir / "litellm"), "--config", "config.yaml", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=directory,
            # Its own process group, ended whole (any worker it forks with it); killed with the test.
            start_new_session=True,
            # Only prctl runs between fork and exec, which is safe even with threads around.
            preexec_fn=parent_death_signal(signal.SIGKILL),  # noqa: PLW1509
        )
    try:

        def started() -> bool:
            if process.poll() is not None:
                tail = proxy.log.read_text(errors="replace").splitlines()[-20:]
                raise AssertionError(f"LiteLLM exited with {process.returncode}:\n" + "\n".join(tail))
            return proxy.alive()

        wait_for("the LiteLLM proxy to answer /health/liveliness", started, timeout=120, interval=0.5)
        yield proxy
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
