"""The live inventory: nodes, Pods and ResourceQuotas from the Kubernetes API, kept by list+watch.

Three reflectors (webhook.sources.reflector) feed one PoolIndex; each event is projected outside the lock and
applied under it, so an admission never waits on the API, only on the applying of one event or one page
of a list. GPU-less Pods project to nothing and are never stored. The three lists and their watches run
independently, so Pods may well arrive before their nodes; the index's view does not depend on that.

Readiness: the first full list of all three resources. Staleness: how long any watch has been unable to
reach the API; admissions keep being answered from the last view, and the Admitter flags or denies
them per the policy.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import orjson
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from webhook.domain.cut import Cut, cut_requirements
from webhook.domain.errors import ConfigError
from webhook.domain.model import PodInfo, PodKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import LockedIndex
from webhook.pools.kubeobj import gpu_names, node_from_obj, quota_from_obj
from webhook.pools.quotas.report import unenforced
from webhook.sources.reflector import Reflector, ReflectorConfig
from webhook.sources.rereads import Rereads

log = logging.getLogger("gpupool.inventory")

Obj = Mapping[str, Any]
NODES, PODS, QUOTAS = "nodes", "pods", "resourcequotas"
CONFIGMAPS = "configmaps"  # mig-parted's one ConfigMap, followed only with the policy's migReshaping


class Observer(Protocol):
    """Something that follows the raw objects the inventory receives (the queue: webhook.queue.waiting),
    called with the same pages and events, inside the inventory's lock, after the index has them."""

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None: ...

    def apply(self, kind: str, event: str, obj: Obj) -> None: ...


class LiveInventory(LockedIndex):
    """An Inventory kept by watching the API through a `kubernetes.client.CoreV1Api`."""

    def __init__(
        self,
        policy: Policy,
        core_v1: Any,
        config: ReflectorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        log_quotas: bool = True,
    ) -> None:
        """`log_quotas`: log each quota Kubernetes does not enforce, once (the server's log); the commands
        print those in their report instead (webhook.pools.quotas.report.quota_warnings), so each is said once."""
        super().__init__(PoolIndex(policy))
        self._log_quotas = log_quotas
        self.policy = policy
        self._resources = policy.gpu_resources
        self._clock = clock
        self._listing: dict[str, set[Any]] = {}  # kind -> keys seen since a re-list began
        self._flagged: set[tuple[str, str]] = set()
        self._observers: list[Observer] = []
        # The Pods whose long node-affinity lists the index keeps cut (webhook.domain.cut), and the reads
        # of those a node's new label value may have made inexact (webhook.sources.rereads).
        self._cut: dict[PodKey, Cut] = {}
        self.rereads = Rereads(self._read_pod, self._reread)
        self.api_client = getattr(core_v1, "api_client", None)  # for the writes beside these reads
        config = config or ReflectorConfig()
        self._kinds = self._handlers()
        self._core_v1, self._config = core_v1, config
        self.reflectors = {
            NODES: Reflector(NODES, core_v1.list_node, self, config, clock),
            PODS: Reflector(PODS, core_v1.list_pod_for_all_namespaces, self, config, clock),
            QUOTAS: Reflector(QUOTAS, core_v1.list_resource_quota_for_all_namespaces, self, config, clock),
        }
        # mig-parted's ConfigMap, for admission's MIG re-cut answers (webhook.admission.recut): a watch of
        # its own, outside readiness and staleness, since without it admission only says less.
        self.mig_reflector = None if policy.mig_reshaping is None else self._mig_reflector(policy, core_v1)

    @classmethod
    def connect(
        cls,
        policy: Policy,
        kubeconfig: str | None = None,
        config: ReflectorConfig | None = None,
        context: str | None = None,
        *,
        log_quotas: bool = True,
    ) -> LiveInventory:
        """The cluster `api_client(kubeconfig, context)` reaches."""
        return cls(policy, client.CoreV1Api(api_client(kubeconfig, context)), config, log_quotas=log_quotas)

    def for_policy(self, policy: Policy) -> LiveInventory:
        """A new inventory of the same cluster for another policy (not started): its own index, its own
        lists and watches, since what is kept of each object depends on the policy."""
        return LiveInventory(policy, self._core_v1, self._config, self._clock, log_quotas=self._log_quotas)

    def observe(self, observer: Observer) -> None:
        """Have `observer` follow every object from now on (add it before `start`); one that cuts what it
        keeps of Pods (`cut_against`) is given the label values the index's nodes carry."""
        self._observers.append(observer)
        cut_against = getattr(observer, "cut_against", None)
        if cut_against is not None:
            cut_against(self._index.labels)

    def _mig_reflector(self, policy: Policy, core_v1: Any) -> Reflector:
        assert policy.mig_reshaping is not None
        namespace, name = policy.mig_reshaping.config_map

        def list_call(**kwargs: Any) -> Any:
            return core_v1.list_namespaced_config_map(namespace, field_selector=f"metadata.name={name}", **kwargs)

        return Reflector(CONFIGMAPS, list_call, self, self._config, self._clock)

    def pod_version(self) -> str:
        """The resourceVersion the Pod watch has reached (from its last event or bookmark)."""
        return self.reflectors[PODS].resource_version

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> LiveInventory:
        for reflector in self._all_reflectors():
            reflector.start()
        return self

    def _all_reflectors(self) -> list[Reflector]:
        return [*self.reflectors.values(), *([self.mig_reflector] if self.mig_reflector is not None else [])]

    def wait_ready(self, timeout: float) -> bool:
        deadline = self._clock() + timeout
        return all(r.synced.wait(max(deadline - self._clock(), 0)) for r in self.reflectors.values())

    def wait_mig_config(self, timeout: float) -> bool:
        """Wait up to `timeout` for the first list of mig-parted's ConfigMap (True at once without
        `migReshaping`): a command shows re-cuts only once it has it; the server never waits for it."""
        return self.mig_reflector is None or self.mig_reflector.synced.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop every watch: all are shut down at once, then their threads are given up to `timeout`
        together to end (they end as soon as their watch is shut; only a list page being read keeps one)."""
        for reflector in self._all_reflectors():
            reflector.halt()
        self.rereads.close()
        deadline = self._clock() + timeout
        for reflector in self._all_reflectors():
            reflector.join(max(deadline - self._clock(), 0))

    # --- Inventory -----------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors.values())

    def age_seconds(self) -> float:
        """How long the longest-disconnected watch has been unable to reach the API (0 when all are up)."""
        now = self._clock()
        return max((now - r.down_since for r in self.reflectors.values() if r.down_since is not None), default=0.0)

    def current_since(self) -> float | None:
        """Since when the Pod watch has been connected without a break, once its first list is in."""
        pods = self.reflectors[PODS]
        return pods.connected_since if pods.synced.is_set() else None

    # --- Sink: called from the reflectors' threads ---------------------------------------------------

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        self.apply_page(kind, objects, self.project_page(kind, objects), first, final)

    def project_page(self, kind: str, objects: list[Obj]) -> list[tuple[Any, Any]]:
        """A list page's objects projected onto the domain, with their keys: the part of `replace` done
        outside the lock."""
        project = self._kinds[kind].project
        return [project(obj) for obj in objects]

    def apply_page(
        self, kind: str, objects: list[Obj], projected: list[tuple[Any, Any]], first: bool, final: bool
    ) -> None:
        """The part of `replace` done under the lock: the page's projections to the index, then its objects to
        the observers."""
        handler = self._kinds[kind]
        with self._lock:
            if first:
                self._listing[kind] = set()
            seen = self._listing[kind]
            # What projects to nothing leaves the index with its page: only what it keeps can be left over
            # from before the list (and the page's keys die with it, rather than strew its memory).
            seen.update(key for key, value in projected if value is not None)
            version = self._index.labels.version
            handler.upsert(projected)  # the page is one change of the index, its pools packed once
            if final:
                handler.remove(handler.held() - seen)
                if kind == PODS:
                    for key in set(self._cut) - seen:
                        del self._cut[key]
                del self._listing[kind]
            self._follow_cuts(kind, projected, version)
            for observer in self._observers:
                observer.replace(kind, objects, first, final)

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        handler = self._kinds[kind]
        key, value = handler.project(obj)
        with self._lock:
            self._apply_projected(kind, event, obj, (key, value))

    def _apply_projected(self, kind: str, event: str, obj: Obj, projected: tuple[Any, Any]) -> None:
        handler, version = self._kinds[kind], self._index.labels.version
        if event == "DELETED":
            handler.remove((projected[0],))
            projected = (projected[0], None)
        else:
            handler.upsert([projected])
        self._follow_cuts(kind, [projected], version)
        for observer in self._observers:
            observer.apply(kind, event, obj)

    def _follow_cuts(self, kind: str, projected: list[tuple[Any, Any]], version: int) -> None:
        """Keep which Pods are held cut; once the nodes' labels gained a value (the index's `labels` moved
        from `version`), have the cut Pods it may have made inexact read again."""
        labels = self._index.labels
        if kind == PODS:
            stale = []
            for key, value in projected:
                if isinstance(value, PodInfo) and value.cut is not None:
                    self._cut[key] = value.cut
                    if labels.stale(value.cut):  # a node gained a value while it was projected
                        stale.append(key)
                elif self._cut:
                    self._cut.pop(key, None)
            if stale:
                self.rereads.want(stale)
        elif kind == NODES and self._cut and labels.version != version:
            self.rereads.want(key for key, cut in self._cut.items() if labels.stale(cut))

    def _read_pod(self, namespace: str, name: str) -> Obj | None:
        """The Pod as the API has it now; None when it has none."""
        try:
            resp = self._core_v1.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=(self._config.connect_timeout, 30)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        obj: Obj = orjson.loads(resp.data)
        return obj

    def _reread(self, key: PodKey, obj: Obj) -> None:
        """A Pod read again (`rereads`), applied as its watch's event would be, unless the watch has shown
        it since (its cut is no longer stale) or it is gone."""
        projected = self._kinds[PODS].project(obj)
        with self._lock:
            cut = self._cut.get(key)
            if cut is not None and self._index.labels.stale(cut):
                self._apply_projected(PODS, "MODIFIED", obj, projected)

    def _handlers(self) -> dict[str, _Kind]:
        index, policy = self._index, self.policy
        resources, prefixes = policy.gpu_resources, policy.partition_prefixes

        def node(obj: Obj) -> tuple[Any, Any]:
            value = node_from_obj(obj, resources, prefixes)
            return value.name, value  # the projection's own copy of the name (webhook.pools.kubeobj.own)

        screen = gpu_names(resources, prefixes)  # pod_from_obj's, made once

        def pod(obj: Obj) -> tuple[Any, Any]:
            value = screen.pod(obj)
            if value is not None and value.requirements.terms is not None:
                needs, cut = cut_requirements(value.requirements, index.labels)
                if cut is not None:
                    value = replace(value, requirements=needs, cut=cut)
            return (value.key if value is not None else _namespaced(obj)), value

        def quota(obj: Obj) -> tuple[Any, Any]:
            return _namespaced(obj), quota_from_obj(obj, resources, prefixes)

        return {
            NODES: _Kind(
                node,
                lambda page: index.upsert_nodes(value for _, value in page),
                index.remove_nodes,
                index.capacity.node_names,
            ),
            PODS: _Kind(
                pod,
                index.upsert_pods,  # a GPU-less Pod projects to None: nothing to hold
                lambda keys: index.upsert_pods((key, None) for key in keys),
                index.usage.pod_keys,  # a new set already
            ),
            QUOTAS: _Kind(quota, self._upsert_quotas, self._remove_quotas, index.quotas.keys),
            CONFIGMAPS: _Kind(_mig_config, self._upsert_mig_config, self._remove_mig_config, self._mig_config_held),
        }

    def _upsert_mig_config(self, page: list[tuple[Any, Any]]) -> None:
        for key, value in page:
            if value is not None and self._index.mig.names(*key):
                self._index.see_mig_config(value)

    def _remove_mig_config(self, keys: Iterable[Any]) -> None:
        if any(self._index.mig.names(*key) for key in keys):
            self._index.see_mig_config(None)

    def _mig_config_held(self) -> set[Any]:
        settings = self._index.mig.settings
        return {settings.config_map} if settings is not None and self._index.mig.present else set()

    def _upsert_quotas(self, page: list[tuple[Any, Any]]) -> None:
        for key, value in page:
            self._index.upsert_quota(value, *key)
            flag = self._log_quotas and value is not None and key not in self._flagged
            messages = unenforced(value, self.policy) if flag else []
            if messages:
                self._flagged.add(key)
                for message in messages:
                    log.warning(message)

    def _remove_quotas(self, keys: Iterable[Any]) -> None:
        for key in keys:
            self._index.remove_quota(*key)
            self._flagged.discard(key)


class _Kind(NamedTuple):
    """How the inventory keeps one resource: its objects projected onto the domain (outside the lock), then
    applied to the index (under it) a page or an event at a time."""

    project: Callable[[Obj], tuple[Any, Any]]  # the object's key and its projection
    upsert: Callable[[list[tuple[Any, Any]]], None]  # (key, projection) pairs, as one change
    remove: Callable[[Iterable[Any]], None]  # keys gone
    held: Callable[[], set[Any]]  # the keys the index holds


def _mig_config(obj: Obj) -> tuple[Any, Any]:
    """mig-parted's ConfigMap as the index reads it: the raw object (its text is parsed there, once per text)."""
    return _namespaced(obj), dict(obj)


def _namespaced(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", ""))


class InventoryConnectError(ConfigError):
    """No usable Kubernetes configuration."""


POOL_CONNECTIONS = 24  # connections the API client keeps to the API server (see api_client)


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient`: the in-cluster config when running in a Pod, else KUBECONFIG /
    ~/.kube/config (or `kubeconfig`), at its current context (or `context`, as kubectl's --context)."""
    configuration = client.Configuration()
    try:
        in_cluster = kube_config.incluster_config.SERVICE_HOST_ENV_NAME in os.environ
        if kubeconfig is None and context is None and in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # client is untyped
        else:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=True
            )
    except (kube_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise InventoryConnectError(f"cannot load Kubernetes configuration: {exc}") from None
    # The pool's default is 5 per CPU of the machine; the watches, the Lease, the Events and the queue's
    # concurrent releases hold more than that at once on a small node, and urllib3 closes what does not fit.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, POOL_CONNECTIONS)
    return client.ApiClient(configuration)


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the one the kubeconfig's context (the current one, or `context`)
    names, else `default`. A missing kubeconfig is `default` too (kubectl's in-cluster fallback); a
    context the kubeconfig does not have is an error naming it."""
    try:
        contexts, current = kube_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (kube_config.ConfigException, OSError, TypeError, ValueError):
        if context is None:
            return "default"
        raise InventoryConnectError(f"cannot read the kubeconfig for context {context!r}") from None
    chosen = current if context is None else next((c for c in contexts or () if c.get("name") == context), None)
    if chosen is None:
        if context is not None:
            raise InventoryConnectError(f"context {context!r} is not in the kubeconfig") from None
        return "default"
    namespace = (chosen.get("context") or {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"
