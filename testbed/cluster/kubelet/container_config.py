"""What a container process is started with: argv and environment, built from the pod spec (pure).

Pods and containers are the API's JSON (camelCase dicts), as everywhere in this package.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from testbed.cluster.kubelet.host import HOST_IP, NODE_CAPACITY, POD_IP

# Kept out of pods: the kubelet's admin credentials, and the in-cluster discovery variables that
# would send client libraries to look for /var/run/secrets/... before reading $KUBECONFIG.
STRIPPED_ENV = frozenset({"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"})


class EntrypointUnsupported(Exception):
    """A container without `command`: only the image's entrypoint could run it, and images are not used."""


class EnvResolutionError(Exception):
    """The container's environment cannot be built yet (missing ConfigMap/Secret/key, bad reference)."""


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion, as in k8s.io/kubernetes/third_party/forked/golang/expansion.

    `$(NAME)` becomes the value of NAME when defined and stays as written otherwise; `$$` is an
    escaped `$` (so `$$(NAME)` yields the literal `$(NAME)`); an unterminated `$(` and any other
    `$x` are kept literally.
    """
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        char = value[i]
        if char != "$" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        following = value[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = value.find(")", i + 2)
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = value[i + 2 : close]
                out.append(env.get(name, f"$({name})"))
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def build_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """argv = command + args with `$(VAR)` expanded from the container's environment."""
    command = list(container.get("command") or [])
    if not command:
        raise EntrypointUnsupported(
            f"container {container.get('name')!r} has no command: the process-kubelet runs "
            f"`command + args` on the host and cannot use the entrypoint of image "
            f"{container.get('image')!r}; set `command` in the pod spec"
        )
    return [expand(str(part), env) for part in [*command, *(container.get("args") or [])]]


def missing_entrypoints(containers: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Container name -> why it cannot run, for the containers that have no `command`."""
    missing: dict[str, str] = {}
    for container in containers:
        try:
            build_argv(container, {})
        except EntrypointUnsupported as exc:
            missing[container["name"]] = str(exc)
    return missing


_SUBSCRIPT_FIELD = re.compile(r"^metadata\.(labels|annotations)\[(['\"])(.+)\2\]$")


def field_ref_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The downward-API value of `field_path` for env vars (the paths the API server allows there)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    match = _SUBSCRIPT_FIELD.match(field_path)
    if match:
        # A missing label or annotation yields "", as with a real kubelet.
        return str((meta.get(match.group(1)) or {}).get(match.group(3), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
    }
    if field_path not in simple:
        raise EnvResolutionError(f"fieldRef {field_path!r} is not supported in env")
    value = simple[field_path]
    return "" if value is None else str(value)


_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_QUANTITY_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(text: str | int | float) -> Decimal:
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise EnvResolutionError(f"invalid quantity {text!r}")
    try:
        return Decimal(match.group(1)) * _QUANTITY_SUFFIX[match.group(2) or ""]
    except InvalidOperation as exc:
        raise EnvResolutionError(f"invalid quantity {text!r}") from exc


def resource_field_value(container: Mapping[str, Any], resource: str, divisor: str | None) -> str:
    """resourceFieldRef for env: the container's request/limit, limits defaulting to node allocatable."""
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise EnvResolutionError(f"resourceFieldRef {resource!r} is not supported")
    declared = ((container.get("resources") or {}).get(kind)) or {}
    if name in declared:
        quantity = parse_quantity(declared[name])
    elif kind == "limits":
        quantity = parse_quantity(NODE_CAPACITY.get(name, "0"))
    else:
        quantity = Decimal(0)
    unit = parse_quantity(divisor or "1")
    if unit <= 0:
        raise EnvResolutionError(f"resourceFieldRef {resource!r} has a non-positive divisor")
    return str(math.ceil(quantity / unit))


# (kind "ConfigMap" | "Secret", name) -> decoded data, or None when the object does not exist.
SourceLookup = Callable[[str, str], Mapping[str, str] | None]


def _key_ref_value(ref: Mapping[str, Any], kind: str, lookup: SourceLookup) -> str | None:
    data = lookup(kind, str(ref.get("name", "")))
    key = str(ref.get("key", ""))
    if data is not None and key in data:
        return data[key]
    if ref.get("optional"):
        return None
    if data is None:
        # The real kubelet's words (CreateContainerConfigError): secret "NAME" not found.
        raise EnvResolutionError(f'{kind.lower()} "{ref.get("name")}" not found')
    raise EnvResolutionError(f"couldn't find key {key} in {kind} {ref.get('name')}")


def resolve_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    lookup: SourceLookup,
    context: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's declared environment (envFrom, then env), resolved like a kubelet does.

    `$(VAR)` in a literal value refers to `context` (variables the kubelet provides) and to the
    variables declared before it; valueFrom values are never expanded. Optional references that
    cannot be resolved are skipped; required ones raise EnvResolutionError.
    """
    declared: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(ref_key)
            if not ref:
                continue
            data = lookup(kind, str(ref.get("name", "")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvResolutionError(f'{kind.lower()} "{ref.get("name")}" not found')
            for key, item in data.items():
                # The kubelet skips keys that cannot be environment variable names.
                if "=" not in key and key:
                    declared[prefix + key] = item
    for var in container.get("env") or []:
        name = str(var["name"])
        value_from = var.get("valueFrom")
        value: str | None
        if value_from:
            if "fieldRef" in value_from:
                value = field_ref_value(pod, str(value_from["fieldRef"].get("fieldPath", "")))
            elif "resourceFieldRef" in value_from:
                ref = value_from["resourceFieldRef"]
                value = resource_field_value(container, str(ref.get("resource", "")), ref.get("divisor"))
            elif "configMapKeyRef" in value_from:
                value = _key_ref_value(value_from["configMapKeyRef"], "ConfigMap", lookup)
            elif "secretKeyRef" in value_from:
                value = _key_ref_value(value_from["secretKeyRef"], "Secret", lookup)
            else:
                raise EnvResolutionError(f"env {name}: unsupported valueFrom {sorted(value_from)}")
            if value is None:
                continue
        else:
            value = expand(str(var.get("value") or ""), {**(context or {}), **declared})
        declared[name] = value
    return declared


def process_env(
    inherited: Mapping[str, str],
    injected: Mapping[str, str],
    declared: Mapping[str, str],
    python_bin_dir: str,
) -> dict[str, str]:
    """The full environment of a container process: host env < kubelet-provided < pod-declared."""
    env = {key: value for key, value in inherited.items() if key not in STRIPPED_ENV}
    path = inherited.get("PATH") or os.defpath
    env["PATH"] = f"{python_bin_dir}{os.pathsep}{path}" if python_bin_dir else path
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(injected)
    env.update(declared)
    return env
