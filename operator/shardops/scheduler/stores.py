"""Whether a campaign's workers can reach its S3 store: the namespace's store Secret is there."""

from __future__ import annotations

from shardops.api.campaign import Campaign
from shardops.api.enums import StoreType
from shardops.k8s.api import SECRETS, Forbidden, KubeClient, NotFound


def store_secret_problem(kube: KubeClient, campaign: Campaign, namespace_secret: str | None) -> str | None:
    """Why the campaign's workers cannot start: its S3 store's keys come from the namespace's store
    Secret (`namespace_secret`, the installation's setting), which is not in its namespace (the pods
    would sit in CreateContainerConfigError); the message names the Secret and the command that
    creates it. None when it is there, when the store uses a Secret the campaign named itself (a
    missing one is named by WorkersFailing, from its pods), or when the operator may not look."""
    location = campaign.current_status.result_store
    if location is None or location.type is not StoreType.S3 or namespace_secret is None:
        return None
    if location.credentials_secret != namespace_secret:
        return None
    namespace = campaign.namespace
    try:
        kube.get(SECRETS, namespace, namespace_secret)
        return None
    except Forbidden:
        return None
    except NotFound:
        pass
    return (
        f"Secret {namespace_secret} is missing in namespace {namespace}: the workers get their store keys "
        f"from it, so none is started. Create it with keys that reach only s3://{location.bucket}/"
        f"{location.area(namespace)} (docs/install.md, Adding a namespace): kubectl -n {namespace} "
        f"create secret generic {namespace_secret} --from-literal=AWS_ACCESS_KEY_ID=<key> "
        "--from-literal=AWS_SECRET_ACCESS_KEY=<secret>"
    )
