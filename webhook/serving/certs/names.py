"""The names and lifetimes a serving certificate may have: the Service's in-cluster names, extra hosts,
and the number of days, each checked before any file is touched."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

DEFAULT_OUT, DEFAULT_SERVICE, DEFAULT_NAMESPACE = "certs", "gpupool-webhook", "gpupool-system"
DEFAULT_DAYS = 365
MAX_DAYS = 3650  # a serving certificate should not outlive the CA that signs it
RENEW_WITHIN = timedelta(days=30)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS_1123_LABEL = re.compile(_LABEL)
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class ServingNames:
    """The subject alternative names of the serving certificate, in the order they are written."""

    dns: tuple[str, ...]
    ips: tuple[IPAddress, ...]

    @property
    def common_name(self) -> str:
        return self.dns[2]  # svc.ns.svc, the name kube-apiserver dials


def dns_names(service: str, namespace: str) -> list[str]:
    """The four names a Service is reachable by inside the cluster, shortest first."""
    check_service(service)
    check_namespace(namespace)
    svc = f"{service}.{namespace}.svc"
    return [service, f"{service}.{namespace}", svc, f"{svc}.cluster.local"]


def check_service(name: str) -> str:
    """Raise ValueError unless `name` is a valid Service name (an RFC 1035 label)."""
    if not _DNS_1035_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid Service name (lowercase letters, digits and '-', "
            "starting with a letter, at most 63 characters)"
        )
    return name


def check_namespace(name: str) -> str:
    """Raise ValueError unless `name` is a valid namespace name (an RFC 1123 label)."""
    if not _DNS_1123_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid namespace name (lowercase letters, digits and '-', at most 63 characters)"
        )
    return name


def check_days(days: int, renew_within: timedelta = RENEW_WITHIN) -> int:
    """Raise ValueError unless a certificate of `days` would not be due for renewal the moment it is made."""
    low = renew_within.days + 1
    if not low <= days <= MAX_DAYS:
        raise ValueError(
            f"{days} is out of range: use {low} to {MAX_DAYS} days "
            f"(certificates are renewed {renew_within.days} days before they expire)"
        )
    return days


def parse_host(value: str) -> str | IPAddress:
    """An extra SAN: an IP address, or a DNS name (lowercased, trailing dot dropped); else ValueError."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            raise ValueError(f"{value!r}: an IP address with a zone (%...) cannot be in a certificate")
        return ip
    name = value.lower().removesuffix(".")
    # A numeric last label is a mistyped IP address (e.g. 10.0.0.256), never a real host name.
    if len(name) > 253 or not _DNS_NAME.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a valid DNS name")
    return name


def serving_names(service: str, namespace: str, hosts: Sequence[str] = ()) -> ServingNames:
    """The in-cluster names of the Service plus every extra host, without duplicates."""
    dns = dns_names(service, namespace)
    ips: list[IPAddress] = []
    for host in hosts:
        parsed = parse_host(host)
        if isinstance(parsed, str):
            if parsed not in dns:
                dns.append(parsed)
        elif parsed not in ips:
            ips.append(parsed)
    return ServingNames(tuple(dns), tuple(ips))


def utc(now: datetime | None) -> datetime:
    """`now` in UTC, or the current time; a naive `now` is refused (it would silently mean local time)."""
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)
