"""`gpupool certs`: create or renew the webhook's CA and serving certificate in a directory (the work is
webhook.serving.certs'; this is its command line)."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from webhook.domain.errors import ConfigError
from webhook.serving.certs import (
    DEFAULT_DAYS,
    DEFAULT_NAMESPACE,
    DEFAULT_OUT,
    DEFAULT_SERVICE,
    MAX_DAYS,
    RENEW_WITHIN,
    check_days,
    check_namespace,
    check_service,
    ensure_certificates,
    parse_host,
)

ENV_OUT, ENV_SERVICE, ENV_NAMESPACE = "GPUPOOL_CERTS_OUT", "GPUPOOL_CERTS_SERVICE", "GPUPOOL_CERTS_NAMESPACE"
ENV_HOSTS, ENV_DAYS = "GPUPOOL_CERTS_HOSTS", "GPUPOOL_CERTS_DAYS"
T = TypeVar("T")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        help=f"directory for ca.crt, ca.key, tls.crt, tls.key (${ENV_OUT}; default: certs)",
    )
    parser.add_argument(
        "--service",
        metavar="NAME",
        help=f"the webhook's Service name (${ENV_SERVICE}; default: {DEFAULT_SERVICE})",
    )
    parser.add_argument(
        "--namespace",
        metavar="NAME",
        help=f"the Service's namespace (${ENV_NAMESPACE}; default: {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--host",
        metavar="NAME_OR_IP",
        action="append",
        help=f"one more DNS name or IP address for the serving certificate; repeatable (${ENV_HOSTS}, comma-separated)",
    )
    parser.add_argument(
        "--days",
        metavar="N",
        help=f"lifetime of the serving certificate in days, {RENEW_WITHIN.days + 1} to {MAX_DAYS} "
        f"(${ENV_DAYS}; default: {DEFAULT_DAYS}); the CA gets 10 years",
    )


def run(args: argparse.Namespace) -> int:
    out, _ = _setting(args.out, "--out", ENV_OUT, DEFAULT_OUT)
    service = _checked(*_setting(args.service, "--service", ENV_SERVICE, DEFAULT_SERVICE), check_service)
    namespace = _checked(*_setting(args.namespace, "--namespace", ENV_NAMESPACE, DEFAULT_NAMESPACE), check_namespace)
    if args.host is not None:
        hosts, hosts_label = list(args.host), "--host"
    else:
        hosts, hosts_label = re.split(r"[,\s]+", os.environ.get(ENV_HOSTS, "").strip()), ENV_HOSTS
        hosts = [h for h in hosts if h]
    for host in hosts:
        _checked(host, hosts_label, parse_host)
    days_text, days_label = _setting(args.days, "--days", ENV_DAYS, str(DEFAULT_DAYS))
    try:
        days = int(days_text)
    except ValueError:
        raise ConfigError(f"{days_label}: {days_text!r} is not a whole number of days") from None
    _checked(days, days_label, check_days)
    report = ensure_certificates(Path(out), service, namespace, hosts, days)  # CertError: a ConfigError
    for line in report.lines:
        print(line)
    return 0


def _setting(value: str | None, option: str, env: str, default: str) -> tuple[str, str]:
    """The option's value and where it came from: the command line, else the environment, else the default."""
    if value is not None:
        return value, option
    from_env = os.environ.get(env, "")
    return (from_env, env) if from_env else (default, option)


def _checked(value: T, label: str, check: Callable[[T], object]) -> T:
    """Run `check(value)`; its ValueError becomes a ConfigError naming the option or variable."""
    try:
        check(value)
    except ValueError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    return value
