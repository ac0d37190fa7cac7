"""The admission webhook on gunicorn (webhook.serving.worker's workers, TLS), plus the health port.

`gpupool serve` (webhook.commands.serve) checks everything a user can get wrong before this starts; a
busy port found here is a ConfigError too.

Process layout: the gunicorn master reads the policy and the inventory source once (`Core`), binds
the TLS port and serves /healthz, /readyz and /metrics on the plain-HTTP health port from a thread.
Each worker process is forked with a copy of what the master loaded, builds its Admitter from it and
answers POST /mutate; a live inventory starts its watches in the worker (threads do not survive a
fork), so each worker keeps its own watch cache and burst reservations. A worker that is restarted
(after a crash or a timeout) is forked from the master's copy again and reads no file before it
answers: a snapshot or policy file that changed or broke since the start cannot stop it from booting.
Each worker then follows the --policy file on a thread of its own (webhook.serving.policyfile) and
switches to a changed, valid policy between two admissions; /readyz shows the file's state as the
master reads it.
Metrics cross the process boundary through prometheus_client's multiprocess directory.

The TLS context is re-used while tls.crt and tls.key (and the --client-ca file, which makes the TLS
port require a client certificate signed by it) are unchanged and rebuilt on the next new connection
after they change, so a rotated Secret takes effect without a restart. A certificate and key
that do not match (a rotation caught half-way) keep the previous context until the pair is whole again;
the master loads one before forking, so even a freshly forked worker always has a previous one.

This module is what `serve` wires together: the settings, the hooks, the master's readiness and metrics
for the health port, and what each worker and the leader process load. What gunicorn calls back (the
application, its logger, the certificate reloader) is webhook.serving.gunicorn_app.
"""

from __future__ import annotations

import gc
import logging
import logging.config
import os
import shutil
import signal
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.admission.charging import SharedReads
from webhook.admission.core import Admitter
from webhook.admission.validation import Charges, Trusted, Validator
from webhook.domain.errors import ConfigError
from webhook.domain.exactness import policy_warnings
from webhook.domain.policy import Policy
from webhook.pools.inventory import Inventory
from webhook.serving.certs import CertificateExpiry
from webhook.serving.gunicorn_app import (
    CertificateReloader,
    LoadApp,
    NoAccessLogger,
    WebhookApplication,
    WorkerApp,
    prime_tls_context,
)
from webhook.serving.health import HealthServer, MetricsText, Readiness
from webhook.serving.leaderproc import LeaderBody, LeaderSupervisor, hung_seconds
from webhook.serving.logs import logging_config
from webhook.serving.policyfile import PolicyFile, PolicyReloader, PolicyVersion
from webhook.serving.queueing import LeaseFence, QueueSettings, leader_body
from webhook.sources.bounded import bounded
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import LiveInventory

# webhook.serving.app and webhook.serving.metrics import prometheus_client, which decides between in-memory and
# multiprocess values when it is first imported, from PROMETHEUS_MULTIPROC_DIR. `serve` sets that
# variable first, so those modules are imported only after it (the `noqa: PLC0415` lines below).

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KEEPALIVE_SECONDS = 120  # longer than kube-apiserver's ~90 s idle timeout, so the client closes first
# Open connections per worker, idle or slow ones included (15 to 50 KiB each, see README Performance);
# at the limit a new one closes the oldest that has not sent a whole request (webhook/serving/worker.py).
WORKER_CONNECTIONS = 4096
GRACEFUL_SECONDS = 20  # in-flight admissions take milliseconds; below the Pod's 30 s grace period
WORKER_TIMEOUT_SECONDS = 30  # a worker silent this long is restarted (kube-apiserver gives up at 30 s)

log = logging.getLogger("gpupool.server")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    cert: str
    key: str
    inventory: str | None
    policy: str | None
    kubeconfig: str | None = None
    client_ca: str | None = None  # None: no client certificate is asked for
    host: str = "0.0.0.0"
    port: int = 8443
    health_port: int = 8080
    workers: int = 1
    threads: int = 4
    log_level: str = "info"
    service_account: str = "gpupool-webhook"  # in POD_NAMESPACE: gpupool's own user (webhook.admission.validation)
    trusted_users: tuple[str, ...] = ()  # who else may change what the validating webhook guards
    trusted_groups: tuple[str, ...] = ()
    api_qps: int = 300  # the queue's writes (releases, Events) per second, per worker process
    api_burst: int = 500
    replicas: int = 1  # the Deployment's replicas (GPUPOOL_REPLICAS): with workers, how many processes admit
    lease_seconds: int = 15  # the queue's Lease duration (webhook.queue.leader.LeaseTimes.of)
    # gpupool's worker; the server benchmark also runs gunicorn's own "gthread" as a baseline.
    worker_class: str = "webhook.serving.worker.WebhookWorker"


@dataclass(frozen=True, slots=True)
class Core:
    """What the master loads once, before the first fork; every worker starts from a copy of it."""

    policy: Policy
    # A snapshot: the whole index, loaded. The live cluster: the client configuration, not yet watching.
    inventory: Inventory
    # The --policy file the policy was read from, followed for changes; None for the built-in policy.
    source: PolicyVersion | None = None
    queue: QueueSettings | None = None  # where the queue's Lease lives and who this replica is
    # Who may change what the validating webhook guards on GPU Pods (webhook.admission.validation).
    trusted: Trusted = field(default_factory=lambda: Trusted.of("gpupool-system", "gpupool-webhook"))
    # The processes that admit Pods, replicas x workers: with more than one, `placement: now` cannot keep the
    # quotas only gpupool enforces exact (webhook.domain.exactness), which the policy's warnings say.
    admitters: int = 1


PolicyDetail = Callable[[], Mapping[str, Any]]


def policy_detail(core: Core) -> PolicyDetail:
    """/readyz's `policy` entry, read in the master: the --policy file, the SHA-256 of its newest valid
    version (which the workers switch to), why the file is refused as it is now (null when it is not) and
    the policy's warnings for this install (webhook.domain.exactness.policy_warnings)."""
    if core.source is None:
        warnings = policy_warnings(core.policy, core.admitters)
        return lambda: {"file": None, "error": None, "warnings": warnings}
    file = PolicyFile(core.source)

    def detail() -> Mapping[str, Any]:
        status = file.status()
        return {**status, "warnings": policy_warnings(file.current.policy, core.admitters)}

    return detail


def real_app_loader(core: Core) -> LoadApp:
    """What each worker runs once after the fork: its Admitter, metrics and the Flask app, from the
    master's `core`. Nothing here reads a file: a restarted worker boots even if the policy or snapshot
    file has changed or broken since the start."""

    def load() -> WorkerApp:
        from webhook.serving.app import AppConfig, create_app  # noqa: PLC0415 (see top)
        from webhook.serving.metrics import GaugeRefresher, Metrics  # noqa: PLC0415 (see top)

        policy, inventory = core.policy, core.inventory
        metrics = Metrics.private()
        # Pods that bypass placement in queued namespaces are charged in the API (webhook.admission.charging).
        # A `now` Pod is placed counting them and the leader's recorded releases (webhook.queue.records).
        charged = isinstance(inventory, LiveInventory) and core.queue is not None
        store = None
        if isinstance(inventory, LiveInventory) and core.queue is not None:
            # On a client whose calls are never retried: each read or write within its timeout.
            store = LeaseCharges(bounded(inventory.api_client), core.queue.namespace)
        # A `now` Pod's read of the charges is shared with the worker's other calls waiting at once (exact:
        # each gets a read begun after it arrived, webhook.admission.charging.SharedReads).
        admitter = Admitter(policy, inventory, charges=charged, store=SharedReads(store) if store else None)
        if isinstance(inventory, LiveInventory):
            # The master never starts the watches: threads do not survive a fork, so each worker starts
            # them on its own copy. Not waited for: /readyz stays false until the first full list. A call
            # that reaches the worker meanwhile (a restarted worker's Pod stays in the Service until its
            # probe fails) gets 503 for a GPU Pod (webhook.admission.core.loading_denial). The queue is
            # not here: it runs in the leader process (`real_leader`).
            inventory.start()

        def current() -> tuple[Inventory, Policy]:
            bound = admitter.bound  # one read: the policy and the inventory built for it
            return bound.inventory, bound.policy

        metrics.refresh(*current())  # gauges before the first request
        refresher = GaugeRefresher(metrics, current).start()
        reloader = None
        if core.source is not None:
            file = PolicyFile(core.source)
            reloader = PolicyReloader(file, admitter, metrics.policy_reloaded, admitters=core.admitters).start()

        def close() -> None:
            if reloader is not None:
                reloader.stop()
            refresher.stop()
            admitter.inventory.close()

        # The release's fence reads the queue's Lease through this worker's API client (one per worker).
        fence, charges = None, None
        if isinstance(inventory, LiveInventory) and core.queue is not None:
            fence = LeaseFence.of(inventory.api_client, core.queue)
            charges = Charges(store or LeaseCharges(bounded(inventory.api_client), core.queue.namespace))
        validator = Validator(admitter, core.trusted, fence, charges)
        config = AppConfig(admitter=admitter, metrics=metrics, validator=validator)
        app = create_app(config)
        freeze_when_ready(inventory)
        return WorkerApp(app, close)

    return load


def real_leader(core: Core) -> LeaderBody | None:
    """What the leader process runs (webhook.serving.leaderproc): the queue, on the live cluster with the
    queue's settings; None for a snapshot, which has no API to release through."""
    if not isinstance(core.inventory, LiveInventory) or core.queue is None:
        return None
    return leader_body(core.policy, core.inventory, core.source, core.queue)


def freeze_when_ready(inventory: Inventory, poll_seconds: float = 1.0) -> None:
    """Once the inventory is loaded, move every object the worker holds so far (modules, the app, the
    inventory's first load) out of the garbage collector's way (`gc.freeze`).

    A full collection walks every tracked object; in a worker holding a large inventory it took tens of
    milliseconds, and landed on whichever admission happened to allocate at that moment (the p99).
    Frozen objects are not walked again; objects created later are collected as before.
    """

    def freeze() -> None:
        while not inventory.ready:
            time.sleep(poll_seconds)
        gc.freeze()

    if inventory.ready:
        gc.freeze()
    else:  # the live inventory lists in the background after the fork
        threading.Thread(target=freeze, name="gpupool-gc-freeze", daemon=True).start()


def serve(
    options: ServeOptions, load_app: LoadApp, policy: PolicyDetail | None = None, leader: LeaderBody | None = None
) -> int:
    """Run gunicorn with `load_app` in each worker until SIGTERM (or SIGINT); returns the exit code.
    `policy` adds the policy file's state to /readyz's details (`policy_detail`); `leader`, when given, runs
    in the leader process beside the workers (`real_leader`, webhook.serving.leaderproc), which /readyz
    requires to be running.

    Tests and the benchmark pass their own `load_app`, so they run on exactly these settings.
    """
    master_pid = os.getpid()
    hung = hung_seconds(os.environ)
    owned_dir = _prepare_multiproc_dir()
    multiproc_dir = os.environ[MULTIPROC_ENV]
    try:
        from webhook.serving import leadermetrics, metrics  # noqa: PLC0415 (see top)

        _check_port_free(options.host, options.port)
        arbiter_box: list[Any] = []
        supervisor_box: list[LeaderSupervisor] = []

        def readiness() -> Readiness:
            workers = _worker_pids(arbiter_box)
            ready = metrics.worker_readiness(multiproc_dir)
            states = {str(pid): ready.get(pid, False) for pid in workers}
            detail: dict[str, Any] = {"workers": states}
            # Every worker gunicorn was asked for, each with its inventory: not only those forked so far
            # (the first could be ready before the master has forked the next).
            ok = len(states) >= options.workers and all(states.values())
            if leader is not None:
                # A leader process that is not running (between a death and its restart) makes the Pod
                # unready; one still listing does not: until it has synced it only does not lead.
                status = supervisor_box[0].status() if supervisor_box else None
                alive = status is not None and status.alive
                detail["leader"] = {
                    "pid": status.pid if status is not None else 0,
                    "running": alive,
                    "inventoryReady": alive and status is not None and ready.get(status.pid, False),
                    "restarts": status.restarts if status is not None else 0,
                }
                ok = ok and alive
            if policy is not None:
                detail["policy"] = policy()  # shown, never a reason to be unready: the old policy serves on
            return Readiness(ok, detail)

        certificate = metrics.CertificateExpiryGauge(CertificateExpiry(options.cert))

        def metrics_text() -> MetricsText:
            return MetricsText(metrics.multiprocess_exposition(multiproc_dir, certificate), metrics.CONTENT_TYPE)

        try:
            health = HealthServer(options.host, options.health_port, readiness, metrics_text)
        except OSError as exc:
            raise ConfigError(f"--health-port {options.health_port} on {options.host}: {exc.strerror}") from None

        def when_ready(arbiter: Any) -> None:  # in the master, before the first worker is forked
            arbiter_box.append(arbiter)
            prime_tls_context(arbiter.cfg)
            if leader is not None:
                count_exit = leadermetrics.leader_exits()
                supervisor = LeaderSupervisor(
                    leader,
                    before_child=lambda: _let_go_of_listeners(arbiter, health),
                    exited=lambda pid: metrics.forget_process(pid, multiproc_dir),
                    restarted=leadermetrics.leader_restarts(),
                    ended=lambda ending: count_exit(ending.cause),
                    hung_seconds=hung,
                ).start()
                _reap_leader_first(arbiter, supervisor)
                supervisor_box.append(supervisor)
                _stop_first_on_signals(supervisor)
            health.start()

        def child_exit(arbiter: Any, worker: Any) -> None:
            metrics.forget_process(worker.pid, multiproc_dir)

        def worker_exit(arbiter: Any, worker: Any) -> None:
            worker.app.close_worker()

        def on_exit(arbiter: Any) -> None:
            if supervisor_box:
                supervisor_box[0].stop()  # told at the signal already; waited for here
            health.stop()

        settings = gunicorn_settings(options)
        settings.update(when_ready=when_ready, child_exit=child_exit, worker_exit=worker_exit, on_exit=on_exit)
        try:
            WebhookApplication(settings, load_app).run()
        except SystemExit as exc:  # the arbiter, and each forked worker, end with sys.exit
            return exc.code if isinstance(exc.code, int) else 1
        return 0
    finally:
        # Workers leave through here too (gunicorn forks inside run()): only the master cleans up.
        if owned_dir and os.getpid() == master_pid:
            shutil.rmtree(multiproc_dir, ignore_errors=True)


def _stop_first_on_signals(supervisor: LeaderSupervisor) -> None:
    """SIGTERM, SIGINT and SIGQUIT to the master reach the leader process at once, then gunicorn's own
    handler: the leader stops releasing and hands the Lease back while the workers drain."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            supervisor.terminate()
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, handler)


def _reap_leader_first(arbiter: Any, supervisor: LeaderSupervisor) -> None:
    """gunicorn's arbiter reaps every child on SIGCHLD (`waitpid(-1)`) and drops the status of one that is not
    its worker (a debug line): the supervisor takes its leader process's status first, so that how it ended
    (an exit code, a signal) is known and logged (webhook.serving.leaderending)."""
    reap_workers = arbiter.reap_workers

    def reap() -> None:
        supervisor.reap()
        reap_workers()

    arbiter.reap_workers = reap


def _let_go_of_listeners(arbiter: Any, health: HealthServer) -> None:
    """In the leader process: close the master's listening sockets it inherited (it serves neither port)."""
    for listener in arbiter.LISTENERS:
        listener.close()
    health.close_listener()


def gunicorn_settings(options: ServeOptions) -> dict[str, Any]:
    """The gunicorn configuration; hooks are added by `serve`."""
    return {
        "bind": [_bind_address(options.host, options.port)],
        "workers": options.workers,
        "threads": options.threads,
        # gthread's thread pool and request handling, with all waiting for clients in its main loop:
        # a slow or idle client costs a connection, not a thread (webhook/serving/worker.py).
        "worker_class": options.worker_class,
        "worker_connections": WORKER_CONNECTIONS,
        "keepalive": KEEPALIVE_SECONDS,
        "graceful_timeout": GRACEFUL_SECONDS,
        "timeout": WORKER_TIMEOUT_SECONDS,
        "certfile": options.cert,
        "keyfile": options.key,
        # With a client CA, gunicorn's context trusts that file alone (not the system's CAs) for clients.
        "ca_certs": options.client_ca,
        "cert_reqs": ssl.CERT_NONE if options.client_ca is None else ssl.CERT_REQUIRED,
        "ssl_context": CertificateReloader(options.cert, options.key, options.client_ca),
        # With several workers each gets its own SO_REUSEPORT socket and the kernel spreads new
        # connections evenly; with one shared socket the first worker to wake takes most of
        # kube-apiserver's few long-lived connections and the others idle.
        "reuse_port": options.workers > 1,
        "preload_app": False,  # each worker builds its app, and starts live watches, after the fork
        "proc_name": "gpupool",
        "accesslog": None,  # one admission line per request instead
        "logger_class": NoAccessLogger,
        "errorlog": "-",
        "loglevel": options.log_level,
        "logconfig_dict": logging_config(options.log_level),
        "control_socket_disable": True,  # no runtime control socket in $HOME (two servers would collide)
    }


def _prepare_multiproc_dir() -> bool:
    """Point PROMETHEUS_MULTIPROC_DIR at an empty directory; True when it is a temporary one we own."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        # Values of a previous run would be added to this one's (the directory must start empty).
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.unlink(os.path.join(given, name))
        return False
    os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="gpupool-metrics-")
    return True


def _worker_pids(arbiter_box: list[Any]) -> Iterable[int]:
    if not arbiter_box:
        return ()
    for _ in range(3):  # the arbiter thread may change WORKERS while we copy it
        try:
            return list(arbiter_box[0].WORKERS)
        except RuntimeError:
            continue
    return ()


def _bind_address(host: str, port: int) -> str:
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise ConfigError(f"--port {port} on {host}: {exc.strerror}") from None
