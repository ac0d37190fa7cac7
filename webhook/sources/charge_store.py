"""The charges of Pods that bypass placement (webhook.pools.charges), kept in the Kubernetes API.

One `coordination.k8s.io/v1` Lease, `gpupool-charges` in gpupool's own namespace, holds them as JSON in
its annotation `gpupool.io/charges`: the Lease because gpupool's Role already grants it get, create and
update on Leases there and nowhere else (no new permission, and no other namespace's objects), and
because kube-apiserver refuses an update of a Lease without a resourceVersion, so every write is
conditional. A write carries the resourceVersion read: 409 means another replica charged meanwhile.
The annotation stays small: the charges and the leader's releases take at most RECORD_BYTES of it (240 KiB,
under the 256 KiB kube-apiserver allows a Pod's or Lease's annotations; webhook.pools.charges).
"""

from __future__ import annotations

from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.domain.model import PREFIX
from webhook.pools.charges import Charge, ChargeError, from_json

CHARGES_LEASE = "gpupool-charges"
CHARGES = f"{PREFIX}charges"  # the annotation that holds them
# Within kube-apiserver's timeoutSeconds (5 s) for the webhooks: on a bounded client (the workers' and the
# leader's, webhook.sources.bounded) a call that gets no answer gives up within 2 s, not four times that.
TIMEOUT = (0.5, 1.0)


class LeaseCharges:
    """webhook.pools.charges.ChargeStore on the Lease `name` in `namespace`."""

    def __init__(self, api_client: Any, namespace: str, name: str = CHARGES_LEASE) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name

    def read(self) -> tuple[list[Charge], str]:
        try:
            resp: Any = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return [], ""
            raise ChargeError(f"reading Lease {self.namespace}/{self.name}: {exc.status} {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ChargeError(f"reading Lease {self.namespace}/{self.name}: {exc}") from None
        lease = orjson.loads(resp.data)
        meta = lease.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(CHARGES, "[]")
        try:
            entries = orjson.loads(text)
        except orjson.JSONDecodeError:
            entries = []
        return from_json(entries), str(meta.get("resourceVersion") or "")

    def write(self, charges: list[Charge], version: str) -> bool:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "annotations": {CHARGES: orjson.dumps([c.as_json() for c in charges]).decode()},
        }
        body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {}}
        try:
            if version:
                meta["resourceVersion"] = version
                self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _preload_content=False, _request_timeout=TIMEOUT
                )
            else:
                self._api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=TIMEOUT
                )
        except ApiException as exc:
            if exc.status in (409, 404):  # changed (or created, or deleted) since the read
                return False
            raise ChargeError(f"writing Lease {self.namespace}/{self.name}: {exc.status} {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ChargeError(f"writing Lease {self.namespace}/{self.name}: {exc}") from None
        return True
