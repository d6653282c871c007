"""`make demo`: a local control plane (unless KUBECONFIG is set), the operator installed by its Helm
chart, and a sample campaign run to completion, with its progress shown as it goes. It ends with
lines to try that work pasted into a new shell (e2e/test_demo.py runs them so).

    python -m testbed.demo [--dir DIR]   # DIR: the local control plane's state (.shardops/cluster)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import config

from shardops.api.store import DEFAULT_STORE_SECRET
from testbed import tenants
from testbed.cluster import lifecycle

REPO_ROOT = Path(__file__).resolve().parents[1]
RELEASE = "shardops"
OPERATOR_NAMESPACE = "shardops-system"
DEMO_NAMESPACE = "shardops-demo"
CAMPAIGN = REPO_ROOT / "examples" / "demo.yaml"
# The installation's keys, for the operator only (chart value resultStore.s3.credentialsSecret).
OPERATOR_STORE_SECRET = "shardops-s3"
# The line before the lines to try (each indented by two spaces): e2e/test_demo.py finds them by it.
TRY_HEADING = "Done. Paste these lines into a shell to look around:"


def _run(
    env: dict[str, str], *argv: str, check: bool = True, quiet: bool = False
) -> subprocess.CompletedProcess[str]:
    if not quiet:
        print(f"$ {' '.join(argv)}", flush=True)
    result = subprocess.run(argv, env=env, text=True, capture_output=True, check=False)
    if result.stdout.strip() and not quiet:
        print(result.stdout.rstrip(), flush=True)
    if check and result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        raise SystemExit(f"demo failed at: {' '.join(argv)}")
    return result


def _environment(cluster_dir: Path, binaries: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{binaries}{os.pathsep}{env.get('PATH', '')}"
    if not env.get("KUBECONFIG"):
        if lifecycle.main(["up", f"--dir={cluster_dir}"]) != 0:
            raise SystemExit("could not start the local control plane")
        env["KUBECONFIG"] = str(cluster_dir / "kubeconfig")
    return env


def try_lines(kubeconfig: str, binaries: Path, name: str, cluster_dir: Path | None) -> list[str]:
    """What to try next, as lines that work pasted into a new shell, whose PATH has neither the
    cluster's kubectl (in `binaries`) nor this venv's kubectl-campaign plugin: absolute paths in
    one export line. `cluster_dir`: the local control plane the demo started, which the last line
    stops."""
    plugin_dir = Path(sys.prefix) / "bin"  # this venv: kubectl-campaign, kubectl_complete-campaign
    lines = [
        f"export KUBECONFIG={kubeconfig} PATH={binaries}:{plugin_dir}:$PATH",
        f"kubectl get campaigns -n {DEMO_NAMESPACE}",
        f"kubectl campaign status {name} -n {DEMO_NAMESPACE}",
        f"kubectl campaign results {name} -n {DEMO_NAMESPACE}",
    ]
    if cluster_dir is not None:
        where = "" if cluster_dir == lifecycle.DEFAULT_DIR else f" CLUSTER_DIR={cluster_dir}"
        lines.append(f"make -C {REPO_ROOT} cluster-down{where}   # stops the local control plane")
    return lines


def _campaign_phase(env: dict[str, str], name: str) -> tuple[str, str]:
    result = _run(
        env, "kubectl", "get", "campaign", name, "-n", DEMO_NAMESPACE, "-o", "json", check=False, quiet=True
    )
    if result.returncode != 0:
        return "", ""
    status = json.loads(result.stdout).get("status") or {}
    return status.get("phase") or "", status.get("progressText") or ""


def _store_values(env: dict[str, str], store: lifecycle.ObjectStore, cluster_dir: Path) -> list[str]:
    """Results in the local SeaweedFS: the installation's keys in a Secret of the operator's namespace
    (the operator's only), the demo namespace's own keys that reach only its area (provision_namespace,
    the administrator's step when adding a namespace), and the chart's resultStore values."""
    api = config.new_client_from_config(config_file=env["KUBECONFIG"])
    tenants.put_store_secret(api, OPERATOR_NAMESPACE, OPERATOR_STORE_SECRET, store)
    tenants.provision_namespace(api, DEMO_NAMESPACE, directory=cluster_dir, store=store)
    print(
        f"results go to s3://{store.bucket}/shardops/ at {store.endpoint}; namespace {DEMO_NAMESPACE}'s "
        f"workers get Secret {DEFAULT_STORE_SECRET}, whose keys reach only shardops/{DEMO_NAMESPACE}/"
    )
    values = {
        "resultStore.type": "S3",
        "resultStore.s3.endpoint": store.endpoint,
        "resultStore.s3.region": store.region,
        "resultStore.s3.bucket": store.bucket,
        "resultStore.s3.credentialsSecret": OPERATOR_STORE_SECRET,
    }
    return [argument for key, value in values.items() for argument in ("--set", f"{key}={value}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=lifecycle.DEFAULT_DIR, help="the local control plane's state directory"
    )
    cluster_dir = parser.parse_args(argv).dir.resolve()
    binaries = lifecycle.bin_dir()
    env = _environment(cluster_dir, binaries)
    local = env["KUBECONFIG"] == str(cluster_dir / "kubeconfig")
    _run(env, "kubectl", "create", "namespace", DEMO_NAMESPACE, check=False)
    _run(env, "kubectl", "create", "namespace", OPERATOR_NAMESPACE, check=False)
    chart_values = ["--set", f"watch.namespaces={{{DEMO_NAMESPACE}}}"]
    if local:
        # The process-kubelet runs every pod on the host network: two replicas would both bind the
        # metrics port. One replica here; a real cluster gets the chart's default of two.
        chart_values += ["--set", "operator.replicas=1"]
        store = lifecycle.running_object_store(cluster_dir)
        if store is not None:
            chart_values += _store_values(env, store, cluster_dir)
    _run(
        env,
        "helm", "upgrade", "--install", RELEASE, str(REPO_ROOT / "charts" / "shardops"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace", *chart_values,
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    _run(env, "kubectl", "apply", "-n", DEMO_NAMESPACE, "-f", str(CAMPAIGN))
    name = "demo"
    started = time.monotonic()
    deadline = started + 600
    last = None
    while time.monotonic() < deadline:
        phase, progress = _campaign_phase(env, name)
        if (phase, progress) != last:
            print(
                f"[{time.monotonic() - started:5.1f}s] campaign {name}: {phase or '-'} {progress}", flush=True
            )
            last = (phase, progress)
        if phase in ("Succeeded", "Completed"):
            break
        time.sleep(2)
    else:
        raise SystemExit("the demo campaign did not finish within 10 minutes; see `kubectl get shards -A`")
    _run(env, "kubectl", "get", "campaigns,shards", "-n", DEMO_NAMESPACE)
    lines = try_lines(env["KUBECONFIG"], binaries, name, cluster_dir if local else None)
    print(f"\n{TRY_HEADING}\n" + "\n".join(f"  {line}" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
