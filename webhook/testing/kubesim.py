"""KubeSim: a local Kubernetes API server for tests and benchmarks of gpupool's clients.

It serves nodes, Pods, ResourceQuotas and Events (core/v1), Leases (coordination.k8s.io/v1) and
events.k8s.io/v1 Events over plain HTTP on 127.0.0.1, so the real `kubernetes` client runs unmodified
against it through a generated kubeconfig: list and watch, and writes (create, update, the three patch
types, delete) with kube-apiserver's rules. Tests change the cluster through the Python API (each change
is a watch event), run a scheduler and kubelet stand-in (`scheduler()`), and inject the faults a client
must survive: dropped watch connections, a stalled server, error statuses, compaction (410 Gone), an
API that is down, and one client's writes held back (`hold_writes`; each client its own bearer token,
`add_client`). It calls a validating webhook on Pod updates as kube-apiserver does (`validating_webhook`,
webhook.testing.kubeadmission).

    with KubeSim() as sim:
        sim.load(synthetic_cluster(nodes=10, pods=100))
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        ...

`python -m webhook.testing --nodes 5000 --pods 150000 --kubeconfig FILE` serves a synthetic cluster
from its own process, so that a benchmark measures the client's memory and not the server's.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from webhook.testing.kubeadmission import UserInfo, ValidatingWebhook
from webhook.testing.kubeapi import ApiState, Server, new_server, shutdown_quietly
from webhook.testing.kubeaudit import AuditLog
from webhook.testing.kubechurn import Churn
from webhook.testing.kubehttp import VERBS
from webhook.testing.kubemig import MigManager
from webhook.testing.kubepods import apply_defaults, has_defaults
from webhook.testing.kubescheduler import Scheduler
from webhook.testing.kubestore import KINDS, Store, kind_of

_STORED = {k.kind.lower() for k in KINDS}  # kinds the store holds: served with list, watch and events


class KubeSim:
    """A simulated kube-apiserver. Construct, `start()` (or use as a context manager), `stop()`.

    `bookmark_interval` is how often watch streams that allow bookmarks get one (kube-apiserver:
    about a minute; short here so tests see them); `history_limit` is how many writes stay
    replayable before older resourceVersions answer 410; `watch_timeout` ends watches that give no
    timeoutSeconds (the real server picks 30 to 60 minutes).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "kubesim-token",
        bookmark_interval: float = 1.0,
        history_limit: int = 100_000,
        watch_timeout: float = 1800.0,
    ) -> None:
        self._address = (host, port)
        self._store = Store(history_limit=history_limit)
        self._state = ApiState(
            self._store, token=token, bookmark_interval=bookmark_interval, watch_timeout=watch_timeout
        )
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._churn: Churn | None = None
        self._scheduler: Scheduler | None = None
        self._audit: AuditLog | None = None
        self._mig_manager: MigManager | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KubeSim:
        """Bind (a free port unless one was given) and serve in a background thread."""
        if self._server is not None:
            raise RuntimeError("KubeSim is already started")
        self._serve(self._address)
        return self

    def stop(self) -> None:
        """Stop any churn and scheduler, close the listener and every connection (watch streams end
        abruptly), then finish the audit log; idempotent."""
        if self._churn is not None:
            self._churn.stop()
        if self._scheduler is not None:
            self._scheduler.stop()
        if self._mig_manager is not None:
            self._mig_manager.stop()
        with self._state.lock:
            self._state.closing = True
            self._state.lock.notify_all()
        self._close_server()
        if self._audit is not None:
            self._audit.stop()

    def __enter__(self) -> KubeSim:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, the server address for a kubeconfig."""
        return f"http://{self._address[0]}:{self._address[1]}"

    @property
    def port(self) -> int:
        return self._address[1]

    def write_kubeconfig(self, path: str | os.PathLike[str], token: str | None = None) -> Path:
        """Write a kubeconfig (plain http, bearer token) that `kubernetes.config` loads; returns it.
        `token`: a client's own (`add_client`), else the simulator's admin token."""
        if token is not None and token not in self._state.users:
            raise ValueError(f"unknown token {token!r}: add_client it first")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubesim", "cluster": {"server": self.url}}],
            "users": [{"name": "kubesim", "user": {"token": token or self._state.token}}],
            "contexts": [{"name": "kubesim", "context": {"cluster": "kubesim", "user": "kubesim"}}],
            "current-context": "kubesim",
        }
        target = Path(path)
        # JSON is YAML, so the kubeconfig loader reads this as it is.
        target.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
        return target

    def add_client(self, token: str, username: str, groups: Iterable[str] = ("system:authenticated",)) -> None:
        """Accept bearer `token` as `username` in `groups` (userInfo in webhook calls): a client of its own,
        whose writes `hold_writes` can hold back."""
        with self._state.lock:
            self._state.users[token] = UserInfo(username, tuple(groups))

    def validating_webhook(self, hook: ValidatingWebhook | None) -> None:
        """Call `hook` on every Pod update and patch from now on (None: no more), as kube-apiserver calls a
        validating webhook: inside the write, just before it commits (webhook.testing.kubeadmission)."""
        self._state.writer.admission = hook

    # -- the cluster ----------------------------------------------------------------------------

    def add(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object (its `kind` says which); sends ADDED. Returns it as stored, with
        resourceVersion, uid and creationTimestamp. ValueError if it already exists. A Pod's spec gets
        what kube-apiserver adds to every Pod (defaults, default tolerations, priority 0); its status is
        kept as given, so a test can add Running Pods."""
        _, body = self._store.put(_as_created(obj), exists=False)
        return _decode(body, obj)

    def modify(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Replace an object found by kind, namespace and name, with no rule checked; sends MODIFIED.
        KeyError if absent."""
        _, body = self._store.put(_as_created(obj), exists=True)
        return _decode(body, obj)

    def delete(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        """Delete an object; sends DELETED. Returns its last state. KeyError if absent."""
        event = self._store.remove(kind_of(kind), namespace or "", name)
        return _decode(event.body, {"kind": event.kind.kind})

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object, or None."""
        k = kind_of(kind)
        body = self._store.get(k, namespace or "", name)
        return None if body is None else _decode(body, {"kind": k.kind})

    def serve_object(self, obj: Mapping[str, Any], *, remove: bool = False) -> None:
        """Serve (or stop serving) an object by GET at its path. A kind the store does not hold, such as an
        apps/v1 Deployment, is served at its path only (no list, watch or events); one it holds, such as a
        ConfigMap, is stored (created, replaced or deleted) and served as any stored object."""
        if str(obj.get("kind", "")).lower() in _STORED:
            meta = obj.get("metadata") or {}
            namespace, name = meta.get("namespace"), str(meta.get("name", ""))
            present = self.get(str(obj["kind"]), namespace, name) is not None
            if remove:
                if present:
                    self.delete(str(obj["kind"]), namespace, name)
            elif present:
                self.modify(obj)
            else:
                self.add(obj)
            return
        (self._state.objects.remove if remove else self._state.objects.put)(obj)

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every stored object of `kind` (in `namespace`), by key, with kind and apiVersion."""
        k = kind_of(kind)
        snap = self._store.snapshot(k)
        lo, hi = snap.bounds(namespace if k.namespaced else None)
        return [_decode(body, {"kind": k.kind}) for body in snap.bodies[lo:hi]]

    def events(self, namespace: str | None = None, *, about: str | None = None) -> list[dict[str, Any]]:
        """The core/v1 Events (in `namespace`; `about`: only those whose involvedObject has that name),
        as `kubectl describe` would list them: by creation, then name."""
        found = [
            e
            for e in self.objects("events", namespace)
            if about is None or (e.get("involvedObject") or {}).get("name") == about
        ]
        return sorted(found, key=lambda e: (e["metadata"].get("creationTimestamp", ""), e["metadata"]["name"]))

    def load(self, objects: Iterable[Mapping[str, Any]]) -> str:
        """Add or replace many objects fast (one write each, so watches see them); returns the
        resourceVersion after the last. Accepts a generator, so a big cluster never sits in memory
        as dicts: `sim.load(iter_synthetic_cluster(...))`."""
        return str(self._store.load(_as_created(obj) for obj in objects))

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion (one counter across all kinds, like etcd's revision)."""
        return str(self._store.rv)

    def compact(self) -> None:
        """Drop the history: watches from and continue tokens of older resourceVersions get 410."""
        self._store.compact()

    def churn(self, rate: float, *, seed: int = 0, gpu_share: float = 0.25, bind_delay: float = 1.0) -> Churn:
        """Keep changing Pods at `rate` writes per second (adds, binds, status updates, completions and
        deletions, at a steady number of Pods; see webhook.testing.kubechurn) until `stop()`.
        Returns the running Churn, whose `stats()` count what it wrote."""
        if self._churn is not None:
            raise RuntimeError("KubeSim already churns")
        churn = Churn(self._store, rate, seed=seed, gpu_share=gpu_share, bind_delay=bind_delay)
        churn.binds = self._scheduler is None  # the scheduler binds, when there is one
        self._churn = churn.start()
        return churn

    def scheduler(
        self,
        *,
        run_seconds: float | None = None,
        finish_rate: float = 0.0,
        finish_filter: Callable[[dict[str, Any]], bool] | None = None,
        seed: int = 0,
    ) -> Scheduler:
        """Run a kube-scheduler and kubelet stand-in until `stop()` (webhook.testing.kubescheduler):
        Pods that may be scheduled are bound to a node that fits them and started; running Pods finish
        after their `kubesim.io/run-seconds` annotation or `run_seconds`, and `finish_rate` of them a
        second at random (those `finish_filter` accepts). Returns the running Scheduler."""
        if self._scheduler is not None:
            raise RuntimeError("KubeSim already schedules")
        self._scheduler = Scheduler(
            self._store, run_seconds=run_seconds, finish_rate=finish_rate, finish_filter=finish_filter, seed=seed
        ).start()
        if self._churn is not None:
            self._churn.binds = False
        return self._scheduler

    def mig_manager(
        self,
        config: str,
        *,
        delay: float = 1.0,
        fail: Collection[str] | Callable[[str, str], bool] = (),
        stuck: Collection[str] = (),
    ) -> MigManager:
        """Play NVIDIA's mig-manager on every node until `stop()` (webhook.testing.kubemig): a change of a
        node's `nvidia.com/mig.config` label is applied from `config` (mig-parted's YAML) after `delay`
        seconds, through `pending` to `success` with GFD's labels and the allocatable rewritten; `fail`
        and `stuck` nodes end `failed` or stay `pending`. Returns the running MigManager, whose
        `violations` list Pods that used a node's GPUs while its layout changed."""
        if self._mig_manager is not None:
            raise RuntimeError("KubeSim already plays mig-manager")
        self._mig_manager = MigManager(self._store, config, delay=delay, fail=fail, stuck=stuck).start()
        return self._mig_manager

    def audit(self, path: str | os.PathLike[str], kinds: Iterable[str] | None = None) -> AuditLog:
        """Log every write from now on (of `kinds`, e.g. `["pods", "nodes"]`; None: all) to `path`, one JSON
        line each with the object and the time the store made it (webhook.testing.kubeaudit), until `stop()`.
        Returns the running AuditLog."""
        if self._audit is not None:
            raise RuntimeError("KubeSim already keeps an audit log")
        self._audit = AuditLog(self._store, path, kinds).start()
        return self._audit

    # -- faults ---------------------------------------------------------------------------------

    def drop_watches(self) -> int:
        """Cut every open watch connection without ending the chunked stream (the client sees the
        connection break mid-stream); returns how many were cut."""
        with self._state.lock:
            streams = list(self._state.streams)
            for stream in streams:
                stream.cut()
            self._state.lock.notify_all()
        return len(streams)

    def expire_watches(self, changes: Iterable[Mapping[str, Any]] = ()) -> None:
        """Atomically write `changes` (added or replaced), compact, and cut every open watch, so a
        client that resumes from its last resourceVersion gets 410 Expired and has to re-list to
        see the changes: the "410, then re-list with nothing lost" scenario without a race. With no
        changes, a client that had already seen the newest resourceVersion resumes without a 410,
        exactly as it would against etcd."""
        with self._state.lock:  # reentrant: watch streams cannot fetch the changes before the cut
            self._store.load(changes)
            self._store.compact()
            self.drop_watches()

    def stall(self, seconds: float) -> None:
        """For `seconds` from now, requests hang without an answer and open watches send nothing
        (no events, no bookmarks), like a partitioned network; afterwards everything resumes.
        `stall(0)` ends a stall early."""
        with self._state.lock:
            self._state.stall_until = time.monotonic() + seconds if seconds > 0 else 0.0
            self._state.lock.notify_all()

    def fail_next(self, n: int, status: int = 500, *, verb: str | None = None) -> None:
        """Answer the next `n` requests with `status` and a Status body (reason from the code, e.g.
        500 InternalError, 429 TooManyRequests with Retry-After). `verb` limits it to "list",
        "watch", "get", "discovery", "create", "update", "patch" or "delete" requests."""
        if verb is not None and verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}")
        with self._state.lock:
            self._state.fail_count, self._state.fail_status, self._state.fail_verb = n, status, verb

    def hold_writes(
        self, token: str, seconds: float | None = None, *, resource: str | None = None, after: int = 0
    ) -> None:
        """Hold back every write of the client `token` (as a partition of its path to the API server would)
        for `seconds`, or until `release_writes`; then each goes on as it arrives: judged by admission and
        committed against the cluster as it is then. Reads are not held. `resource` (a plural, "pods"):
        only the writes to it are held; `after`: the first `after` of them go through (a client cut off
        part way through a burst of writes)."""
        with self._state.lock:
            self._state.held[token] = time.monotonic() + seconds if seconds is not None else float("inf")
            self._state.hold_only[token] = (resource, after)
            self._state.lock.notify_all()

    def release_writes(self, token: str) -> None:
        """Let the client's held writes go on (see `hold_writes`); its later writes are not held."""
        with self._state.lock:
            self._state.held.pop(token, None)
            self._state.hold_only.pop(token, None)
            self._state.lock.notify_all()

    def hold_watches(self, token: str, resource: str | None = None) -> None:
        """The watches of the client `token` (of `resource` only, a plural such as "pods", when given) send
        nothing, not even bookmarks, until `release_watches`: a replica whose watch is late. Then each sends
        what came meanwhile, in order. Its reads and writes are not held."""
        with self._state.lock:
            self._state.watch_held[token] = resource
            self._state.lock.notify_all()

    def release_watches(self, token: str) -> None:
        """Let the client's watches send again (see `hold_watches`)."""
        with self._state.lock:
            self._state.watch_held.pop(token, None)
            self._state.lock.notify_all()

    def held_writes(self, token: str) -> tuple[int, int]:
        """(writes of `token` held back now, writes held back and let go since, their answers made)."""
        with self._state.lock:
            return self._state.holding[token], self._state.released[token]

    def set_down(self, down: bool) -> None:
        """Down: the listening socket is closed and every connection cut, so clients get
        "connection refused" (an API server that is restarting or gone). Up: listen again on the
        same port; the cluster state and history are kept."""
        with self._state.lock:
            if self._state.down == down:
                return
            self._state.down = down
            self._state.lock.notify_all()
        if down:
            self._close_server()
        else:
            self._serve(self._address)

    # -- counters -------------------------------------------------------------------------------

    def list_requests(self, resource: str | None = None) -> int:
        """List requests received for `resource` ("pods", "Pod", …; None: all), faulted ones too."""
        return self._count(self._state.lists, resource)

    def write_requests(self, verb: str, resource: str) -> int:
        """Write requests received ("patch", "pods"; "update", "leases"; …), refused ones too."""
        with self._state.lock:
            return self._state.writes.get(f"{verb} {kind_of(resource).plural}", 0)

    def watch_requests(self, resource: str | None = None) -> int:
        """Watch requests received, faulted ones too."""
        return self._count(self._state.watches, resource)

    def open_watches(self, resource: str | None = None) -> int:
        """Watch streams open right now."""
        return self._count(self._state.open_watches, resource)

    def wait_for_watches(self, count: int, resource: str | None = None, timeout: float = 10.0) -> None:
        """Block until exactly `count` watches are open (0: until cut or ended watches are gone);
        TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._state.lock:
            while (now_open := self._count(self._state.open_watches, resource)) != count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{now_open} watches open on {resource or 'all resources'}, not {count}")
                self._state.lock.wait(min(left, 0.05))

    @property
    def handler_errors(self) -> list[BaseException]:
        """Unexpected exceptions inside request handlers (a simulator bug); tests can assert none."""
        return list(self._state.errors)

    # -- internals ------------------------------------------------------------------------------

    def _count(self, counter: Mapping[str, int], resource: str | None) -> int:
        with self._state.lock:
            if resource is None:
                return sum(counter.values())
            return counter.get(kind_of(resource).plural, 0)

    def _serve(self, address: tuple[str, int]) -> None:
        server = new_server(address, self._state)
        self._address = (address[0], server.server_address[1])
        self._state.port = self._address[1]
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="kubesim", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread

    def _close_server(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()
        with self._state.lock:
            connections = dict(self._state.connections)
        for conn in connections:
            shutdown_quietly(conn)
        # Handlers end once their socket is shut; wait so nothing outlives the test that made it.
        deadline = time.monotonic() + 5.0
        for handler_thread in connections.values():
            handler_thread.join(max(0.0, deadline - time.monotonic()))


def _as_created(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Pod with the spec kube-apiserver would have given it (a copy); other objects as they are."""
    if obj.get("kind") != "Pod" or has_defaults(obj):
        return obj
    pod = copy.deepcopy(dict(obj))
    apply_defaults(pod)
    return pod


def _decode(body: bytes, like: Mapping[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(body)
    kind = kind_of(str(like.get("kind", "")))
    return {"kind": kind.kind, "apiVersion": kind.api_version, **obj}
