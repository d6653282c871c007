"""Kueue in the local control plane: its CRDs, its controller manager (built by build.sh) and its
admission webhooks, served on loopback with the cluster CA's webhook certificate.

Only what the worker Jobs need: the batch/job integration, with manageJobsWithoutQueueName false,
so Kueue manages exactly the Jobs labelled kueue.x-k8s.io/queue-name. Its Job webhooks carry an
objectSelector on that label besides: every other Job the session creates never calls Kueue, so a
test that started it costs the tests after it nothing, and Kueue stopped (or not yet ready) refuses
only the Jobs meant for it. The webhooks of its other integrations (pods, Deployments, ...) are not
registered at all: their failurePolicy is Fail, and nothing serves them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.cluster import pki as pki_mod

CLUSTER_DIR = Path(__file__).resolve().parent
MODULE = "sigs.k8s.io/kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The API groups whose webhooks are registered: Kueue's own objects and batch/v1 Jobs.
WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
WEBHOOK_CONFIGURATION_NAMES = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhooks",
    "ValidatingWebhookConfiguration": "kueue-validating-webhooks",
}
NAMESPACE = "kueue-system"
# Kueue v0.17 without its internal certificate management reads its metrics server's certificate
# from this fixed path at start (cmd/kueue/main.go), and exits when it is missing, even with the
# metrics server off (bindAddress "0", as here: nothing is ever served with it). No flag moves it.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def module_dir() -> Path:
    """Where the Go module cache holds the Kueue module build.sh built from (its CRDs and webhook
    manifests); never downloads: build.sh has put it there."""
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", GOPROXY="off")
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", MODULE],
        cwd=CLUSTER_DIR / "kueue",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def crd_files(module: Path) -> list[Path]:
    return sorted((module / "config" / "components" / "crd" / "bases").glob("*.yaml"))


def webhook_configurations(module: Path, port: int, ca_cert: Path) -> list[dict[str, Any]]:
    """Kueue's own webhook manifests, its Job and kueue.x-k8s.io webhooks only, each pointed at
    https://127.0.0.1:<port><its path> with the cluster CA as caBundle instead of a Service."""
    manifests = (module / "config" / "components" / "webhook" / "manifests.yaml").read_text()
    ca_bundle = base64.b64encode(ca_cert.read_bytes()).decode()
    configurations = []
    for document in yaml.safe_load_all(manifests):
        if not document:
            continue
        kept = []
        for webhook in document["webhooks"]:
            groups = {group for rule in webhook["rules"] for group in rule["apiGroups"]}
            if not groups <= WEBHOOK_GROUPS:
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            if "batch" in groups:
                webhook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            kept.append(webhook)
        document["metadata"] = {"name": WEBHOOK_CONFIGURATION_NAMES[document["kind"]]}
        document["webhooks"] = kept
        configurations.append(document)
    return configurations


def configuration(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): one replica, every port on loopback,
    certificates from the cluster CA (no internal certificate management: it would issue its own for
    a Service), no metrics server and no visibility API server (nothing here reads them)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


@dataclass(frozen=True)
class KueueFiles:
    config: Path
    webhooks: Path


def ensure_metrics_cert(pki: pki_mod.Pki, directory: Path = METRICS_CERT_DIR) -> None:
    """Put a certificate where Kueue looks for its metrics one, when none is there: any pair will
    do (it is never served), so one cluster's, written once per machine and kept; each file
    written whole (a rename), so clusters starting at once never read half of one."""
    if (directory / "tls.crt").exists() and (directory / "tls.key").exists():
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, source in (("tls.key", pki.webhook_key), ("tls.crt", pki.webhook_cert)):
            partial = directory / f".{name}.{os.getpid()}"
            partial.write_bytes(source.read_bytes())
            partial.chmod(0o600)
            partial.replace(directory / name)
    except PermissionError as error:
        raise PermissionError(
            f"Kueue needs a certificate in {directory} (any; its metrics server is off) and this "
            "user may not write it: create tls.crt and tls.key there once (for example copies of "
            f"{pki.webhook_cert} and {pki.webhook_key})"
        ) from error


def write_files(
    directory: Path, module: Path, pki: pki_mod.Pki, *, webhook_port: int, health_port: int
) -> KueueFiles:
    """Kueue's configuration, its serving certificate under the names controller-runtime reads
    (tls.crt, tls.key), and the webhook configurations to apply once it serves."""
    ensure_metrics_cert(pki)
    cert_dir = directory / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name, source in (("tls.crt", pki.webhook_cert), ("tls.key", pki.webhook_key)):
        target = cert_dir / name
        target.unlink(missing_ok=True)
        target.symlink_to(source)
    config = directory / "config.json"
    config.write_text(
        json.dumps(configuration(webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir))
    )
    webhooks = directory / "webhooks.json"
    webhooks.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": webhook_configurations(module, webhook_port, pki.ca_cert),
            }
        )
    )
    return KueueFiles(config=config, webhooks=webhooks)
