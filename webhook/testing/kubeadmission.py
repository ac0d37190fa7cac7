"""A validating admission webhook as kube-apiserver calls it, for the simulator's Pod UPDATEs.

kube-apiserver calls a validating webhook inside the write: after the patch is applied to the stored
object and the result validated, before the compare-and-swap commits it (so a write held up before it
reaches the API server is judged when it arrives, against the cluster as it is then). The call is an
AdmissionReview v1 with `object` and `oldObject`, encoded as Go's encoding/json encodes (`<`, `>` and
`&` as `\\u003c`, `\\u003e`, `\\u0026`, U+2028 and U+2029 escaped), POSTed over HTTPS, made only when every
matchCondition (CEL, evaluated with cel-python, a dev dependency) holds. A denial becomes the write's
error (the webhook's status code, else 403, "admission webhook ... denied the request: ..."); a call that
fails (no connection, a timeout, a status other than 200, no valid review) refuses the write with 500,
as failurePolicy Fail does.

    hook = ValidatingWebhook.from_manifest(path, ["https://127.0.0.1:8443/validate"], ca_file, "gpupool...")
    sim.validating_webhook(hook)
"""

from __future__ import annotations

import http.client
import itertools
import socket
import ssl
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import orjson
import yaml

from webhook.testing.kubeproto import ApiError


class UserInfo(NamedTuple):
    """Who makes a request, as an authenticator tells kube-apiserver."""

    username: str
    groups: tuple[str, ...] = ("system:authenticated",)


ADMIN = UserInfo("kubesim-admin", ("system:masters", "system:authenticated"))  # the simulator's own token
_GO_ESCAPES = ((b"&", b"\\u0026"), (b"<", b"\\u003c"), (b">", b"\\u003e"), ("\u2028".encode(), b"\\u2028"),
               ("\u2029".encode(), b"\\u2029"))  # fmt: skip


def go_json(value: Any) -> bytes:
    """JSON as Go's encoding/json writes it (HTML-safe escapes: the characters only occur in strings)."""
    body = orjson.dumps(value)
    for raw, escaped in _GO_ESCAPES:
        body = body.replace(raw, escaped)
    return body


class ValidatingWebhook:
    """One webhook of a ValidatingWebhookConfiguration, called on Pod UPDATE (and on a CREATE a test makes
    through it). `urls` are its endpoints,
    taken in turn (a Service's load balancing), or only one of them once `pin`ned; `server_name` is the
    name its certificate is checked for."""

    def __init__(
        self,
        urls: Sequence[str],
        ca_file: str | Path,
        *,
        server_name: str,
        conditions: Sequence[str] = (),
        name: str = "validate.pods.gpupool.io",
        timeout: float = 5.0,
    ) -> None:
        self.name, self.timeout, self._server_name = name, timeout, server_name
        self._urls = [urlsplit(u) for u in urls]
        self._targets = itertools.cycle(self._urls)
        self._pinned: int | None = None
        self._context = ssl.create_default_context(cafile=str(ca_file))
        self._programs = _compile(conditions)
        self._lock = threading.Lock()
        self.calls = 0  # reviews sent
        self.denied = 0  # writes refused by the webhook's answer
        self.failed = 0  # writes refused because the call failed
        self.largest = 0  # the largest review body sent, in bytes

    def pin(self, endpoint: int | None) -> None:
        """Send every call to `urls[endpoint]` (a test that needs one replica's answer); None: in turn again."""
        with self._lock:
            self._pinned = endpoint

    @classmethod
    def from_manifest(
        cls, path: str | Path, urls: Sequence[str], ca_file: str | Path, server_name: str
    ) -> ValidatingWebhook:
        """The first webhook of a ValidatingWebhookConfiguration file (the shipped matchConditions)."""
        doc = yaml.safe_load(Path(path).read_text("utf-8"))
        webhook = doc["webhooks"][0]
        conditions = [c["expression"] for c in webhook.get("matchConditions") or ()]
        return cls(urls, ca_file, server_name=server_name, conditions=conditions, name=webhook["name"])

    def __call__(self, new: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, *, dry_run: bool) -> None:
        """Judge a Pod UPDATE, or a CREATE when `old` is None (objects as served, with kind and apiVersion;
        a created one named and given its uid, as kube-apiserver does before validating admission);
        ApiError when refused."""
        meta = new.get("metadata") or {}
        operation = "UPDATE" if old is not None else "CREATE"
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": user.username, "groups": list(user.groups)},
            "object": new,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        }
        if not self._matches(request):
            return
        body = go_json({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        with self._lock:
            self.calls += 1
            self.largest = max(self.largest, len(body))
            target = next(self._targets) if self._pinned is None else self._urls[self._pinned]
        answer = self._post(target.hostname or "127.0.0.1", target.port or 443, target.path or "/", body)
        response = answer.get("response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or response.get("uid") != request["uid"]:
            raise self._failure("expected a response with the request's uid")
        if response.get("allowed") is True:
            return
        status = response.get("status")
        status = status if isinstance(status, dict) else {}
        with self._lock:
            self.denied += 1
        code = status.get("code")
        code = code if isinstance(code, int) and code >= 400 else 403
        raise ApiError(code, f"admission webhook {self.name!r} denied the request: {status.get('message', '')}")

    def _matches(self, request: dict[str, Any]) -> bool:
        if not self._programs:
            return True
        from celpy import celtypes  # noqa: PLC0415 (a dev dependency, needed only with conditions)
        from celpy.adapter import json_to_cel  # noqa: PLC0415

        activation = {
            "object": json_to_cel(request["object"]),
            "oldObject": json_to_cel(request["oldObject"]),
            "request": json_to_cel(request),
        }
        for program in self._programs:
            result = program.evaluate(activation)
            if not isinstance(result, celtypes.BoolType):  # an evaluation error: a failed call (failurePolicy Fail)
                raise self._failure(f"matchCondition did not evaluate to a bool: {result}")
            if not result:
                return False
        return True

    def _post(self, host: str, port: int, path: str, body: bytes) -> Any:
        conn = _SniConnection(host, port, self._context, self._server_name, self.timeout)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._failure(f"{type(exc).__name__}: {exc}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise self._failure(f"the server responded with status {resp.status}")
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            raise self._failure("the response is not JSON") from None

    def _failure(self, why: str) -> ApiError:
        with self._lock:
            self.failed += 1
        return ApiError(500, f"Internal error occurred: failed calling webhook {self.name!r}: {why}")


def _compile(conditions: Sequence[str]) -> list[Any]:
    if not conditions:
        return []
    import celpy  # noqa: PLC0415 (a dev dependency, needed only with conditions)

    env = celpy.Environment()
    return [env.program(env.compile(expression)) for expression in conditions]


class _SniConnection(http.client.HTTPSConnection):
    """Connects to the address given, verifies the certificate for `server_name` (a Service's name)."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, server_name: str, timeout: float) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._sni, self._ssl = server_name, context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ssl.wrap_socket(raw, server_hostname=self._sni)
