"""The webhook's CA and serving certificate: created, renewed (`ensure`), checked, and read.

- `names`: the Service's in-cluster names, extra hosts and lifetimes, checked before anything is written;
- `issue`: keys and certificates, and whether a certificate belongs to a key or a CA;
- `files`: PEM files read, checked and written atomically in a directory only its owner may write to,
  and the client CA file of `serve --client-ca`;
- `ensure`: `ensure_certificates`, which creates or renews what needs it and keeps everything else;
- `expiry`: the serving certificate's notAfter, followed through rotations, for the expiry gauge.
"""

from webhook.serving.certs.ensure import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    Action,
    CertReport,
    FileAction,
    ensure_certificates,
)
from webhook.serving.certs.expiry import CertificateExpiry
from webhook.serving.certs.files import CERT_MODE, DIR_MODE, KEY_MODE, CertError, read_ca_bundle
from webhook.serving.certs.issue import CA_COMMON_NAME, CA_LIFETIME, CLOCK_SKEW, PrivateKey, key_description
from webhook.serving.certs.names import (
    DEFAULT_DAYS,
    DEFAULT_NAMESPACE,
    DEFAULT_OUT,
    DEFAULT_SERVICE,
    MAX_DAYS,
    RENEW_WITHIN,
    IPAddress,
    ServingNames,
    check_days,
    check_namespace,
    check_service,
    dns_names,
    parse_host,
    serving_names,
)

__all__ = [
    "CA_CERT",
    "CA_COMMON_NAME",
    "CA_KEY",
    "CA_LIFETIME",
    "CERT_MODE",
    "CLOCK_SKEW",
    "DEFAULT_DAYS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_OUT",
    "DEFAULT_SERVICE",
    "DIR_MODE",
    "KEY_MODE",
    "MAX_DAYS",
    "RENEW_WITHIN",
    "TLS_CERT",
    "TLS_KEY",
    "Action",
    "CertError",
    "CertReport",
    "CertificateExpiry",
    "FileAction",
    "IPAddress",
    "PrivateKey",
    "ServingNames",
    "check_days",
    "check_namespace",
    "check_service",
    "dns_names",
    "ensure_certificates",
    "key_description",
    "parse_host",
    "read_ca_bundle",
    "serving_names",
]
