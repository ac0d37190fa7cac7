"""`gpupool serve`: flags and environment variables, every file checked before anything starts, then the
server (webhook.serving.server).

Everything a user can get wrong (options, certificate files, policy, inventory, busy ports) is found
before gunicorn starts and reported as `gpupool serve: error: ...` with exit code 2.
"""

from __future__ import annotations

import argparse
import logging.config
import os
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webhook.admission.validation import Trusted
from webhook.domain.errors import ConfigError
from webhook.domain.policy import load_policy
from webhook.serving.certs import CertError, read_ca_bundle
from webhook.serving.logs import LEVELS, logging_config
from webhook.serving.policyfile import log_policy_warnings, read_policy_file
from webhook.serving.queueing import QueueSettings
from webhook.serving.server import Core, ServeOptions, policy_detail, real_app_loader, real_leader, serve
from webhook.sources.open import open_inventory

log = logging.getLogger("gpupool.policy")

# Each option's environment variable (for the Deployment); a flag given on the command line wins.
SERVE_ENV: dict[str, str] = {
    "GPUPOOL_CERT": "--cert",
    "GPUPOOL_KEY": "--key",
    "GPUPOOL_CLIENT_CA": "--client-ca",
    "GPUPOOL_INVENTORY": "--inventory",
    "GPUPOOL_KUBECONFIG": "--kubeconfig",
    "GPUPOOL_POLICY": "--policy",
    "GPUPOOL_HOST": "--host",
    "GPUPOOL_PORT": "--port",
    "GPUPOOL_HEALTH_PORT": "--health-port",
    "GPUPOOL_WORKERS": "--workers",
    "GPUPOOL_THREADS": "--threads",
    "GPUPOOL_LOG_LEVEL": "--log-level",
    "GPUPOOL_SERVICE_ACCOUNT": "--service-account",
    "GPUPOOL_TRUSTED_USERS": "--trusted-users",
    "GPUPOOL_TRUSTED_GROUPS": "--trusted-groups",
    "GPUPOOL_API_QPS": "--api-qps",
    "GPUPOOL_API_BURST": "--api-burst",
    "GPUPOOL_REPLICAS": "--replicas",
    "GPUPOOL_LEASE_DURATION": "--lease-duration",
}
# Set by the Deployment through the downward API (the field each holds), read for the queue's leader
# election: who this replica is, and the namespace of its Lease.
DOWNWARD_ENV: dict[str, str] = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
DEFAULTS: dict[str, str] = {
    "--host": "0.0.0.0",  # in a Pod the kubelet and kube-apiserver reach the Pod IP
    "--port": "8443",
    "--health-port": "8080",
    "--workers": "1",  # see README: one watch cache and one set of reservations per worker
    "--threads": "4",
    "--log-level": "info",
    "--service-account": "gpupool-webhook",
    "--api-qps": "300",  # Kueue's: a queue releases in bursts when room frees (client-go's default is 5)
    "--api-burst": "500",
    "--replicas": "1",
    "--lease-duration": "15",  # Kueue's (and client-go's): with a 10 s renew deadline and a 2 s retry
}
# Set by the Deployment through the downward API: the namespace gpupool runs in, with --service-account
# gpupool's own username (system:serviceaccount:<namespace>:<name>). Outside a Pod: gpupool-system.
NAMESPACE_ENV = "POD_NAMESPACE"
# A service account's name, as Kubernetes allows it (a DNS subdomain).
_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def configure(parser: argparse.ArgumentParser) -> None:
    env = {flag: name for name, flag in SERVE_ENV.items()}

    def add(flag: str, metavar: str, text: str, **kwargs: Any) -> None:
        default = f"; default {DEFAULTS[flag]}" if flag in DEFAULTS else ""
        parser.add_argument(flag, metavar=metavar, default=None, help=f"{text} (env {env[flag]}{default})", **kwargs)

    add("--cert", "FILE", "serving certificate, PEM (e.g. certs/tls.crt); re-read when it changes")
    add("--key", "FILE", "its private key, PEM (e.g. certs/tls.key)")
    add(
        "--client-ca",
        "FILE",
        "CA certificate(s), PEM: every connection to --port must show a client certificate signed by one "
        "(kube-apiserver's, see README); re-read when it changes; default: no client certificate asked for",
    )
    add(
        "--inventory",
        "FILE",
        "snapshot inventory in `kubectl get nodes,pods,resourcequotas -A -o yaml` form; without it, the live "
        "cluster (in-cluster config, else --kubeconfig, $KUBECONFIG or ~/.kube/config)",
    )
    add("--kubeconfig", "FILE", "kubeconfig for the live cluster")
    add("--policy", "FILE", "placement policy YAML; default: the built-in policy")
    add("--host", "ADDR", "address to listen on, for both ports")
    add("--port", "PORT", "HTTPS port for POST /mutate")
    add("--health-port", "PORT", "plain-HTTP port for /healthz, /readyz and /metrics")
    add("--workers", "N", "gunicorn worker processes")
    add("--threads", "N", "threads per worker (concurrent admissions per worker)")
    add("--log-level", "LEVEL", f"one of {', '.join(LEVELS)}", type=str.lower)
    add(
        "--service-account",
        "NAME",
        "the service account the gpupool Pods run as: in POD_NAMESPACE, gpupool's own user, which may change "
        "what the validating webhook guards on GPU Pods (the queue's release)",
    )
    add(
        "--trusted-users",
        "USER,...",
        "users who, besides gpupool's own, may change a GPU Pod's gpupool.io/ annotations, GPU resources and "
        "placement once it exists (an emergency release; another controller's service account); default: none",
    )
    add("--trusted-groups", "GROUP,...", "groups whose members may, like --trusted-users; default: none")
    add("--api-qps", "N", "the queue leader's API writes (releases, Events) per second, sustained")
    add("--api-burst", "N", "and at once, after a quiet spell")
    add(
        "--replicas",
        "N",
        "the replicas of the Deployment this server is one of (manifests/base sets 2): with --workers, how many "
        "processes admit; with more than one, the policy warns of the quotas placement now cannot keep exact",
    )
    add(
        "--lease-duration",
        "SECONDS",
        "how long the queue's Lease stays its leader's without a renewal: a killed leader's replica is "
        "replaced this long after its last renewal; the renew deadline is 2/3 of it and the retry 2/15",
    )


def resolve_options(args: argparse.Namespace, environ: Mapping[str, str]) -> ServeOptions:
    """Flags, else environment variables, else defaults; ConfigError naming the flag and variable."""

    def value(flag: str) -> str | None:
        given = getattr(args, flag[2:].replace("-", "_"), None)
        if given is not None:
            return str(given)
        name = next(n for n, f in SERVE_ENV.items() if f == flag)
        return environ.get(name) or DEFAULTS.get(flag)

    def number(flag: str, low: int, high: int) -> int:
        text = value(flag) or ""
        if not text.isdigit() or not low <= int(text) <= high:
            raise ConfigError(f"{_both(flag)} must be a whole number from {low} to {high}, not {text!r}")
        return int(text)

    cert, key = value("--cert"), value("--key")
    for flag, path in (("--cert", cert), ("--key", key)):
        if not path:
            raise ConfigError(f"{_both(flag)} is required")
    level = (value("--log-level") or "").lower()
    if level not in LEVELS:
        raise ConfigError(f"{_both('--log-level')} must be one of {', '.join(LEVELS)}, not {level!r}")
    options = ServeOptions(
        cert=str(cert),
        key=str(key),
        inventory=value("--inventory"),
        policy=value("--policy"),
        kubeconfig=value("--kubeconfig"),
        client_ca=value("--client-ca"),
        host=value("--host") or "",
        port=number("--port", 1, 65535),
        health_port=number("--health-port", 1, 65535),
        workers=number("--workers", 1, 64),
        threads=number("--threads", 1, 256),
        log_level=level,
        service_account=value("--service-account") or "",
        trusted_users=_names(value("--trusted-users")),
        trusted_groups=_names(value("--trusted-groups")),
        api_qps=number("--api-qps", 1, 100_000),
        api_burst=number("--api-burst", 1, 100_000),
        replicas=number("--replicas", 1, 1000),
        lease_seconds=number("--lease-duration", 3, 600),
    )
    if options.port == options.health_port:
        raise ConfigError(f"--port and --health-port must differ (both {options.port})")
    if not _SUBDOMAIN.fullmatch(options.service_account):
        raise ConfigError(
            f"{_both('--service-account')} must be a service account name (lowercase letters, digits, '-' and '.'), "
            f"not {options.service_account!r}"
        )
    return options


def _names(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of user or group names, each stripped; empty entries dropped."""
    return tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))


def _both(flag: str) -> str:
    name = next(n for n, f in SERVE_ENV.items() if f == flag)
    return f"{flag} (or {name})"


def run(args: argparse.Namespace) -> int:
    options = resolve_options(args, os.environ)
    logging.config.dictConfig(logging_config(options.log_level))
    core = checked_core(options, os.environ)
    return serve(options, real_app_loader(core), policy_detail(core), real_leader(core))


def checked_core(options: ServeOptions, environ: Mapping[str, str]) -> Core:
    """Every file `serve` reads, checked and read before gunicorn starts: the certificate and key, the
    --client-ca file, the policy and the inventory source. The first one wrong is a ConfigError naming it,
    which the command line turns into `gpupool serve: error: ...` and exit status 2."""
    check_tls_files(options.cert, options.key)
    if options.client_ca is not None:
        check_client_ca(options.client_ca)
    return load_core(options, environ)


def check_tls_files(cert: str, key: str) -> None:
    """The certificate and key load and belong together; ConfigError saying which file is wrong."""
    for flag, path in (("--cert", cert), ("--key", key)):
        if not os.path.isfile(path):
            raise ConfigError(f"{flag} {path}: no such file (create one with `gpupool certs --out DIR`)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--cert {cert} / --key {key}: not a usable certificate and key: {exc}") from None


def check_client_ca(path: str) -> None:
    """The --client-ca file holds CA certificates OpenSSL loads; ConfigError saying what is wrong.

    A file that is not what was meant (a client certificate, an expired CA) would make every handshake
    fail, which under failurePolicy Fail refuses every GPU Pod: better to stop at the start.
    """
    try:
        read_ca_bundle(Path(path))
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=path)
    except CertError as exc:
        raise ConfigError(f"--client-ca {exc}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--client-ca {path}: not a usable CA file: {exc}") from None


def load_core(options: ServeOptions, environ: Mapping[str, str] | None = None) -> Core:
    """Read the policy and the inventory source, the only time `serve` reads them before the workers
    start from the master's copy (they follow the policy file afterwards); a ConfigError naming the bad
    file, before anything starts. gpupool runs in `POD_NAMESPACE`: there its service account is its own
    user, and its queue's Lease lives; this replica is `POD_NAME` (the Deployment sets both through the
    downward API; outside a Pod: `gpupool-system` and the host's name)."""
    source = read_policy_file(options.policy) if options.policy is not None else None
    policy = source.policy if source is not None else load_policy(None)
    inventory = open_inventory(policy, snapshot=options.inventory, kubeconfig=options.kubeconfig, start=False)
    admitters = options.replicas * options.workers
    log_policy_warnings(policy, admitters, options.policy or "built-in default policy")
    if options.inventory is not None and policy.queues:
        log.warning(
            "policy: a snapshot inventory (--inventory) has no API to release through: GPU Pods of namespaces "
            "that place queue are gated and never released here; set placement: now for a demo (examples/policy.yaml)"
        )
    environ = environ if environ is not None else {}
    namespace = environ.get(NAMESPACE_ENV) or "gpupool-system"
    queue = QueueSettings(
        namespace=namespace,
        pod_name=environ.get("POD_NAME") or socket.gethostname(),
        qps=options.api_qps,
        burst=options.api_burst,
        lease_seconds=options.lease_seconds,
    )
    trusted = Trusted.of(namespace, options.service_account, options.trusted_users, options.trusted_groups)
    return Core(policy, inventory, source, queue, trusted, admitters)
