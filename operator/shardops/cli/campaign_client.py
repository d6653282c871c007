"""`kubectl campaign`'s reads and writes, all through `shardops.k8s.api.Kube`, and the translation of
what can go wrong into messages a person can act on and exit codes a script can rely on.

Exit codes (also in `kubectl campaign --help` and docs/user-guide.md):
  0 ok; 1 the thing asked about is in a bad state; 2 usage error;
  3 not found (campaign, shard, or the CRD itself); 4 no cluster access, or forbidden.
"""

from __future__ import annotations

import base64
import datetime as dt
import getpass
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import urllib3
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from shardops import API_GROUP
from shardops.api.common import JSON, Item
from shardops.api.items import ItemsFrom
from shardops.api.names import CAMPAIGN_LABEL, CLI_FIELD_MANAGER
from shardops.k8s import campaigns, jobs, kueue
from shardops.k8s.api import (
    CAMPAIGNS,
    DEFAULT_TIMEOUT_SECONDS,
    EVENTS,
    LEASES,
    SECRETS,
    SHARDS,
    ApiError,
    Forbidden,
    Kube,
    NotFound,
    Resource,
)
from shardops.k8s.shards import Actor
from shardops.logic.queues import QueueState

T = TypeVar("T")

EXIT_OK = 0
EXIT_BAD_STATE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_NO_ACCESS = 4

REPORTING_CONTROLLER = f"{API_GROUP}/kubectl-campaign"
CORE_EVENTS = Resource("", "v1", "events")
SELF_SUBJECT_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
INSTALL_HINT = (
    "install the CRDs (kubectl apply --server-side -f crds/, or helm install the shardops chart "
    "from charts/shardops)"
)


class CliError(Exception):
    """Ends the command with `message` on stderr and `exit_code`."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


def not_found(message: str) -> CliError:
    return CliError(EXIT_NOT_FOUND, message)


def no_access(message: str) -> CliError:
    return CliError(EXIT_NO_ACCESS, message)


def bad_state(message: str) -> CliError:
    return CliError(EXIT_BAD_STATE, message)


# Errors below the HTTP layer: refused connection, DNS, TLS, timeouts. The kubernetes client wraps
# TLS failures in an ApiException with status 0.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)
# Any failure of a best-effort call (a hint, the user's name): ignored.
ANY_CALL_ERROR: tuple[type[BaseException], ...] = (ApiError, ApiException, *CONNECTION_ERRORS)


def timed_out(error: BaseException) -> bool:
    """No answer in time. urllib3 makes a refused connection (NewConnectionError) a kind of connect
    timeout, for old callers: that one is not."""
    timeouts = (urllib3.exceptions.TimeoutError, TimeoutError)
    return isinstance(error, timeouts) and not isinstance(error, urllib3.exceptions.NewConnectionError)


def connection_error(error: BaseException, server: str, timeout: float | None = None) -> CliError:
    reason = error.reason if isinstance(error, urllib3.exceptions.MaxRetryError) else None
    detail = str(reason if reason is not None else error) or type(error).__name__
    if timed_out(reason or error):
        within = f" within {timeout:g}s" if timeout else ""
        return no_access(
            f"no answer from the Kubernetes API server at {server}{within}: {detail}. "
            "Allow more time with --request-timeout (0 waits as long as it takes), or check that the "
            "cluster is up (kubectl cluster-info)."
        )
    return no_access(
        f"cannot reach the Kubernetes API server at {server}: {detail}. "
        "Check the kubeconfig (--kubeconfig, $KUBECONFIG) and that the cluster is up "
        "(kubectl cluster-info)."
    )


def kubeconfig_contexts(kubeconfig: str | None) -> tuple[list[JSON], JSON | None]:
    """The contexts of the kubeconfig ($KUBECONFIG, else ~/.kube/config, when None) and the current one."""
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return list(contexts or []), current


def default_namespace(kubeconfig: str | None, context: str | None = None) -> str:
    """The namespace of the kubeconfig context (`context`, else the current one); in a pod, the
    service account's; else "default"."""
    try:
        contexts, current = kubeconfig_contexts(kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
        namespace = ((chosen or {}).get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    except (config.ConfigException, OSError, TypeError, ValueError, KeyError):
        pass
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def connect(
    kubeconfig: str | None,
    *,
    context: str | None = None,
    impersonate: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Kube:
    """A Kube for the kubeconfig (or in-cluster config) as kubectl's --kubeconfig, --context, --as and
    --request-timeout choose it; a missing or broken kubeconfig, or an unknown context, is exit 4."""
    if kubeconfig and not Path(kubeconfig.split(os.pathsep)[0]).expanduser().exists():
        raise no_access(f"kubeconfig {kubeconfig} does not exist")
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        if context:
            names = [str(c.get("name")) for c in kubeconfig_contexts(kubeconfig)[0]]
            if context not in names:
                raise no_access(
                    f'context "{context}" does not exist in kubeconfig {where} '
                    f"(contexts there: {', '.join(names) or 'none'}; kubectl config get-contexts lists them)"
                )
        return Kube.from_environment(
            CLI_FIELD_MANAGER, kubeconfig, context=context, impersonate=impersonate, timeout=timeout
        )
    except (config.ConfigException, OSError, TypeError, ValueError) as error:
        raise no_access(f"no usable cluster configuration (kubeconfig {where}): {error}") from None


@dataclass
class Client:
    """The API calls of `kubectl campaign`. `campaigns`/`shards` are where those kinds live (a test
    points them at an API group that is not installed to see the missing-CRD answer)."""

    kube: Kube
    campaigns: Resource = CAMPAIGNS
    shards: Resource = SHARDS

    @property
    def server(self) -> str:
        return str(getattr(self.kube.api_client.configuration, "host", "") or "?")

    # --- error translation ------------------------------------------------------------------------

    def call(self, what: str, action: Callable[[], T]) -> T:
        """Run one API call; turn transport and auth failures into CliErrors (exit 4)."""
        try:
            return action()
        except Forbidden as error:
            raise no_access(
                f"forbidden: {error.message}. {what} needs that permission; ask a cluster admin for a "
                "Role granting it (docs/user-guide.md, 'Permissions', lists what each command needs)"
            ) from None
        except ApiError as error:
            if error.status == 401:
                raise no_access(
                    f"the API server at {self.server} rejected the credentials (401 Unauthorized) while "
                    f"trying to {what}: log in again or fix the kubeconfig user"
                ) from None
            raise
        except ApiException as error:
            raise no_access(
                f"cannot talk to the Kubernetes API server at {self.server}: {error.reason}"
            ) from None
        except CONNECTION_ERRORS as error:
            raise connection_error(error, self.server, self.kube.timeout) from None

    def crd_missing(self, resource: Resource) -> bool:
        """True when the API server does not serve `resource` (its CRD is not installed)."""
        path = f"/apis/{resource.group}/{resource.version}"
        try:
            found = self.call("discover the shardops API", lambda: self.kube.request("GET", path))
        except NotFound:
            return True
        names = {str(r.get("name")) for r in found.get("resources") or []}
        return resource.plural not in names

    def missing_crd_error(self, resource: Resource) -> CliError:
        return not_found(
            f"the {resource.plural}.{resource.group} CRD is not installed on {self.server} "
            f"(no {resource.plural} in {resource.group}/{resource.version}): {INSTALL_HINT}"
        )

    def _check_crd(self, resource: Resource) -> None:
        if self.crd_missing(resource):
            raise self.missing_crd_error(resource)

    # --- reads --------------------------------------------------------------------------------------

    def get_campaign(self, namespace: str, name: str) -> JSON:
        try:
            return self.call(f"get campaign {name}", lambda: self.kube.get(self.campaigns, namespace, name))
        except NotFound:
            self._check_crd(self.campaigns)
            raise not_found(self._campaign_missing(namespace, name)) from None

    def _campaign_missing(self, namespace: str, name: str) -> str:
        message = f'campaign "{name}" not found in namespace "{namespace}"'
        try:
            others = sorted(str(c["metadata"]["name"]) for c in self.kube.list(self.campaigns, namespace))
        except ANY_CALL_ERROR:
            return message
        if others:
            shown = ", ".join(others[:10]) + (", ..." if len(others) > 10 else "")
            return f"{message} (campaigns there: {shown})"
        return f"{message} (no campaigns in that namespace; try kubectl campaign list -A)"

    def list_campaigns(self, namespace: str | None) -> list[JSON]:
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        try:
            return self.call(f"list campaigns {where}", lambda: self.kube.list(self.campaigns, namespace))
        except NotFound:
            # A list only 404s when the resource type itself is not served.
            raise self.missing_crd_error(self.campaigns) from None

    def list_shards(self, namespace: str, campaign: str) -> list[JSON]:
        selector = f"{CAMPAIGN_LABEL}={campaign}"
        try:
            return self.call(
                f"list the shards of campaign {campaign}",
                lambda: self.kube.list(self.shards, namespace, label_selector=selector),
            )
        except NotFound:
            raise self.missing_crd_error(self.shards) from None

    def get_shard(self, namespace: str, name: str) -> JSON:
        try:
            return self.call(f"get shard {name}", lambda: self.kube.get(self.shards, namespace, name))
        except NotFound:
            self._check_crd(self.shards)
            raise not_found(
                f'shard "{name}" not found in namespace "{namespace}" (shards are named '
                "<campaign>-<index:05d>; kubectl get shards -l shardops.dev/campaign=<campaign> lists them)"
            ) from None

    def list_workers(self, namespace: str, campaign: str) -> tuple[list[JSON], list[JSON]]:
        """The campaign's worker Jobs and their pods."""
        found_jobs = self.call(
            f"list the worker Jobs of campaign {campaign}",
            lambda: jobs.list_workers(self.kube, namespace, campaign),
        )
        found_pods = self.call(
            f"list the worker pods of campaign {campaign}",
            lambda: jobs.list_worker_pods(self.kube, namespace, campaign),
        )
        return found_jobs, found_pods

    def failed_creates(self, namespace: str, job_names: Sequence[str]) -> dict[str, str]:
        """Why the named Jobs got no pod (their FailedCreate Events); {} for a user who may not list
        Events: the plan then says the Jobs are stuck without the reason."""
        try:
            return jobs.failed_creates(self.kube, namespace, job_names)
        except Forbidden:
            return {}

    def queue_state(self, namespace: str, jobs: Sequence[JSON]) -> QueueState | None:
        """What Kueue says of the suspended worker Jobs (`k8s.kueue.queue_state`); it reads what the
        user may read and leaves out the rest."""
        return self.call(
            "read the Kueue queue of the worker Jobs", lambda: kueue.queue_state(self.kube, namespace, jobs)
        )

    def get_lease(self, namespace: str, name: str) -> JSON | None:
        try:
            return self.call(f"get lease {name}", lambda: self.kube.get(LEASES, namespace, name))
        except NotFound:
            return None

    def read_items(self, namespace: str, source: ItemsFrom) -> list[Item]:
        """The items of the itemsFrom ConfigMap; ItemsUnavailable as the operator would see it."""
        items, _ = self.call(
            f"read ConfigMap {source.config_map_name} (spec.itemsFrom)",
            lambda: campaigns.read_items(self.kube, namespace, source),
        )
        return items

    def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """The decoded keys of a Secret (the result store's credentials)."""
        try:
            secret = self.call(f"get secret {name}", lambda: self.kube.get(SECRETS, namespace, name))
        except NotFound:
            what = f"secret {name} (the result store's credentials)"
            raise not_found(f"{what} not found in namespace {namespace}") from None
        data = secret.get("data") or {}
        return {key: base64.b64decode(value).decode("utf-8") for key, value in data.items()}

    def count_items(self, namespace: str, source: ItemsFrom) -> int:
        """Number of items in the itemsFrom ConfigMap; ItemsUnavailable as the operator would see it."""
        return len(self.read_items(namespace, source))

    def shard_events(self, namespace: str, shard: str) -> tuple[list[JSON], str | None]:
        """Events regarding the shard, normalized to events.k8s.io/v1 field names; and a warning when
        they could not be read (the timeline then comes from the shard's history alone)."""

        def read() -> tuple[list[JSON], str | None]:
            try:
                return self.kube.list(EVENTS, namespace, fieldSelector=f"regarding.name={shard}"), None
            except (Forbidden, NotFound) as first:
                try:
                    core = self.kube.list(
                        CORE_EVENTS, namespace, fieldSelector=f"involvedObject.name={shard}"
                    )
                except (Forbidden, NotFound):
                    return [], f"events not readable ({first.reason}: {first.message}); showing history only"
                return [core_event_as_v1(e) for e in core], None

        return self.call(f"list the Events of shard {shard}", read)

    # --- writes -------------------------------------------------------------------------------------

    def patch_campaign(
        self, namespace: str, name: str, patch: JSON, *, resource_version: str | None = None
    ) -> JSON:
        try:
            return self.call(
                f"patch campaign {name}",
                lambda: self.kube.patch(
                    self.campaigns, namespace, name, patch, resource_version=resource_version
                ),
            )
        except NotFound:
            raise not_found(f'campaign "{name}" not found in namespace "{namespace}" (deleted?)') from None

    def delete_campaign(self, namespace: str, name: str) -> None:
        try:
            self.call(f"delete campaign {name}", lambda: self.kube.delete(self.campaigns, namespace, name))
        except NotFound:
            raise not_found(f'campaign "{name}" not found in namespace "{namespace}" (deleted?)') from None

    def who_am_i(self) -> str:
        """The user the API server sees (SelfSubjectReview), else the local user and host."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            answer = self.kube.request("POST", SELF_SUBJECT_REVIEW, body=body)
            user = ((answer.get("status") or {}).get("userInfo") or {}).get("username")
            if user:
                return str(user)
        except ANY_CALL_ERROR:
            pass
        return f"{getpass.getuser()}@{socket.gethostname()}"

    def record_event(
        self, campaign: JSON, *, reason: str, note: str, user: str, now: dt.datetime
    ) -> str | None:
        """An Event on the Campaign recording the request; its name, or None if it could not be written."""
        actor = Actor(controller=REPORTING_CONTROLLER, instance=user)
        return campaigns.record_event(self.kube, campaign, reason=reason, note=note, actor=actor, now=now)


def core_event_as_v1(event: JSON) -> JSON:
    """A core/v1 Event in the field names of events.k8s.io/v1 (what the timeline reads)."""
    return {
        "metadata": event.get("metadata") or {},
        "eventTime": event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp"),
        "reason": event.get("reason"),
        "note": event.get("message"),
        "type": event.get("type"),
        "action": event.get("action"),
        "reportingController": event.get("reportingComponent")
        or (event.get("source") or {}).get("component"),
        "reportingInstance": event.get("reportingInstance") or (event.get("source") or {}).get("host"),
        "regarding": event.get("involvedObject") or {},
        "deprecatedCount": event.get("count"),
    }
