"""The policy the installed webhook runs with, read from the cluster: what `explain`, `inventory` and
`quota` use on a live cluster when no `--policy FILE` is given, so they answer as the webhook does.

The webhook's Deployment (`gpupool-system/gpupool-webhook` unless told otherwise) says where its policy
is: `serve`'s `--policy` argument, else its GPUPOOL_POLICY variable, names a file; the container's
volume mount that holds that file names a volume; a `configMap` volume names the ConfigMap (the shipped
manifests' `gpupool-policy`, or whatever name a kustomization gave it: an older install's has
kustomize's hash suffix) and, through its `items`, the key. Following the path rather than assuming the
volume's name, the ConfigMap's or the key keeps this right for a kustomization that mounts the policy
differently. `serve` follows its policy file, so a change of the ConfigMap reaches the Pods without a
restart, unless the file is mounted by `subPath` (which the kubelet never updates): the note says which.

`locate_policy` is that reading of the Deployment, pure; `read_installed_policy` does the two GETs.
Whatever cannot be found (no such Deployment, no right to read it, a policy that is not in a ConfigMap)
gives the built-in default with a note that says why: the same answer the commands gave before they
looked, now said out loud.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3
from kubernetes import client

from webhook.domain.errors import ConfigError

WEBHOOK_DEPLOYMENT = "gpupool-system/gpupool-webhook"
WEBHOOK_CONTAINER = "webhook"  # manifests/base/deployment.yaml
POLICY_FLAG, POLICY_ENV = "--policy", "GPUPOOL_POLICY"  # serve's, as webhook.commands.serve reads them
READ_TIMEOUT = 10.0  # seconds for each GET: a cluster that does not answer is reported, not waited on


@dataclass(frozen=True, slots=True)
class PolicyLocation:
    """Where a Deployment's policy file comes from: a key of a ConfigMap in its namespace."""

    namespace: str
    configmap: str
    key: str
    sub_path: bool = False  # mounted by subPath: the kubelet never updates the file, the Pods see no change

    def __str__(self) -> str:
        return f"ConfigMap {self.namespace}/{self.configmap} (key {self.key})"


@dataclass(frozen=True, slots=True)
class InstalledPolicy:
    """The policy text the webhook runs with (None: the built-in default) and a note saying which."""

    text: str | None
    source: str  # names the text in policy errors
    note: str


class NotLocated(Exception):
    """Where the Deployment's policy comes from cannot be told; the message says why."""


def locate_policy(deployment: Mapping[str, Any]) -> PolicyLocation | None:
    """Where the Deployment's webhook container reads its policy from; None when it names no policy file
    (it runs with the built-in default). NotLocated when that cannot be told."""
    meta = _map(deployment.get("metadata"))
    namespace = meta["namespace"] if isinstance(meta.get("namespace"), str) else ""
    pod_spec = _map(_map(_map(deployment.get("spec")).get("template")).get("spec"))
    containers = [c for c in _list(pod_spec.get("containers")) if isinstance(c, dict)]
    container = next(
        (c for c in containers if c.get("name") == WEBHOOK_CONTAINER), containers[0] if containers else None
    )
    if container is None:
        raise NotLocated("its Pod template has no container")
    path = _policy_path(container)
    if path is None:
        return None
    mounts = [
        m for m in _list(container.get("volumeMounts")) if isinstance(m, dict) and isinstance(m.get("mountPath"), str)
    ]
    mount = max((m for m in mounts if _under(path, m["mountPath"])), key=lambda m: len(m["mountPath"]), default=None)
    if mount is None:
        raise NotLocated(f"its policy file {path} is on no volume (a file of the image)")
    inside = posixpath.relpath(path, mount["mountPath"]) if path != mount["mountPath"] else ""
    sub = mount.get("subPath") if isinstance(mount.get("subPath"), str) else ""
    file_in_volume = posixpath.join(sub, inside) if sub and inside else (sub or inside)
    volume = next(
        (v for v in _list(pod_spec.get("volumes")) if isinstance(v, dict) and v.get("name") == mount.get("name")), None
    )
    source = _map(volume.get("configMap")) if volume is not None else {}
    if not isinstance(source.get("name"), str) or not source["name"]:
        kinds = ", ".join(k for k in (volume or {}) if k != "name") or "no"
        raise NotLocated(
            f"its policy file {path} is on volume {mount.get('name')!r}, a {kinds} volume, not a ConfigMap"
        )
    items = [i for i in _list(source.get("items")) if isinstance(i, dict)]
    if items:
        key = next((i.get("key") for i in items if i.get("path") == file_in_volume), None)
    else:
        key = file_in_volume if "/" not in file_in_volume else None
    if not isinstance(key, str) or not key:
        raise NotLocated(f"its policy file {path} is no key of ConfigMap {source['name']}")
    return PolicyLocation(namespace, source["name"], key, sub_path=bool(sub))


def read_installed_policy(api: Any, deployment: str = WEBHOOK_DEPLOYMENT) -> InstalledPolicy:
    """The policy the Deployment `namespace/name` runs with, read through `api` (a kubernetes ApiClient).
    ConfigError when the cluster cannot be reached at all (the inventory could not be read either)."""
    namespace, _, name = deployment.partition("/")
    what = f"Deployment {namespace}/{name}"
    try:
        body = _get(client.AppsV1Api(api).read_namespaced_deployment, name, namespace)
    except _Missing as exc:
        return _default(f"{exc.why} {what}")
    try:
        location = locate_policy(body)
    except NotLocated as exc:
        return _default(f"{what}: {exc}")
    if location is None:
        return InstalledPolicy(None, "", f"with gpupool's built-in default policy, which {what} runs with")
    try:
        configmap = _get(client.CoreV1Api(api).read_namespaced_config_map, location.configmap, location.namespace)
    except _Missing as exc:
        return _default(f"{exc.why} ConfigMap {location.namespace}/{location.configmap}, which {what} mounts")
    text = _map(configmap.get("data")).get(location.key)
    if not isinstance(text, str):
        return _default(
            f"ConfigMap {location.namespace}/{location.configmap}, which {what} mounts, has no key {location.key}"
        )
    if location.sub_path:
        how = "mounts by subPath: its Pods see a change of it only once they restart"
    else:
        how = "follows: its Pods take up a change of it within about 2 minutes, without a restart"
    return InstalledPolicy(text, str(location), f"with the installed policy: {location}, which {what} {how}")


def _default(why: str) -> InstalledPolicy:
    return InstalledPolicy(
        None, "", f"with gpupool's built-in default policy: {why}; pass --policy FILE for the one your install runs"
    )


class _Missing(Exception):
    """The object is not there, or this user may not read it: the why, to be followed by what."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _get(read: Any, name: str, namespace: str) -> dict[str, Any]:
    """One GET, its JSON as a dict (the raw body: the typed models are not needed for a few fields)."""
    try:
        response = read(name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT)
        body = orjson.loads(response.data)
    except client.ApiException as exc:
        if exc.status == 404:
            raise _Missing("no") from None
        if exc.status in (401, 403):
            raise _Missing(f"not allowed ({exc.status} {exc.reason}) to read") from None
        raise ConfigError(f"cannot read {namespace}/{name} from the cluster: {exc.status} {exc.reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ConfigError(f"cannot reach the cluster to read {namespace}/{name}: {exc}") from None
    except orjson.JSONDecodeError:
        raise ConfigError(f"the cluster's answer for {namespace}/{name} is not JSON") from None
    return body if isinstance(body, dict) else {}


def _policy_path(container: Mapping[str, Any]) -> str | None:
    """The policy file `serve` reads: its --policy argument, else GPUPOOL_POLICY (a flag wins, as in
    serve); None for neither."""
    args = [a for a in (*_list(container.get("command")), *_list(container.get("args"))) if isinstance(a, str)]
    for i, arg in enumerate(args):
        if arg == POLICY_FLAG and i + 1 < len(args):
            return _absolute(args[i + 1], container)
        if arg.startswith(POLICY_FLAG + "="):
            return _absolute(arg.partition("=")[2], container)
    for env in _list(container.get("env")):
        if isinstance(env, dict) and env.get("name") == POLICY_ENV:
            if isinstance(env.get("value"), str) and env["value"]:
                return _absolute(env["value"], container)
            raise NotLocated(f"its {POLICY_ENV} comes from valueFrom, which is not followed")
    return None


def _absolute(path: str, container: Mapping[str, Any]) -> str:
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    workdir = container.get("workingDir")
    if isinstance(workdir, str) and posixpath.isabs(workdir):
        return posixpath.normpath(posixpath.join(workdir, path))
    raise NotLocated(f"its policy file {path} is relative to the image's working directory")


def _under(path: str, mount_path: str) -> bool:
    mount_path = posixpath.normpath(mount_path)
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
