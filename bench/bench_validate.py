"""Benchmark: what the validating call (POST /validate) costs, next to the mutating call it follows.

In one process, through the app's WSGI entry (no TLS, no sockets: the server's own cost is
bench_server.py's), on the demo inventory, each round plays kube-apiserver's part for a Pod created from
a generateName: POST /mutate, the patch applied and a name generated, POST /validate of that object (its
reservation confirmed), and POST /validate of an UPDATE that a user is refused (a gpupool.io/pool
repointed), in turn for each Pod, so a noisy neighbour hits all three alike. The medians and p99s of the
per-call times are reported with the ratios to the mutating call.

    .venv/bin/python bench/bench_validate.py [--calls 2000] [--rounds 5]

Results are printed and written to bench/results/validate-<time>.json.
"""

from __future__ import annotations

import argparse
import base64
import copy
import io
import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
from prometheus_client import CollectorRegistry

from webhook.admission.core import Admitter
from webhook.admission.validation import Trusted, Validator
from webhook.domain.policy import load_policy
from webhook.serving.app import AppConfig, create_app
from webhook.serving.metrics import Metrics
from webhook.sources.snapshot import SnapshotInventory

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"
DEMO_POLICY = REPO / "examples" / "policy.yaml"


def review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> bytes:
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation,
        "namespace": "ml-train",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


def caller(app: Any, path: str) -> Callable[[bytes], dict[str, Any]]:
    """POST `path` to the WSGI app the way gunicorn would hand it a request."""
    wsgi = app.wsgi_app

    def call(body: bytes) -> dict[str, Any]:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "QUERY_STRING": "timeout=5s",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            "SERVER_NAME": "bench",
            "SERVER_PORT": "8443",
            "wsgi.url_scheme": "https",
        }
        chunks = wsgi(environ, lambda status, headers: None)
        answer: dict[str, Any] = orjson.loads(b"".join(chunks))["response"]
        return answer

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="Pods per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args()
    policy = load_policy(str(DEMO_POLICY))
    admitter = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy))
    validator = Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook"))
    app = create_app(AppConfig(admitter=admitter, metrics=Metrics(CollectorRegistry()), validator=validator))
    mutate, validate = caller(app, "/mutate"), caller(app, "/validate")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "train-", "namespace": "ml-train",
                        "annotations": {"gpupool.io/gpu-class": "medium"}},
           "spec": {"containers": [{"name": "main", "image": "cuda:12"}]}}  # fmt: skip
    times: dict[str, list[float]] = {"mutate": [], "validate CREATE": [], "validate UPDATE (refused)": []}
    for _ in range(args.rounds):
        for i in range(args.calls):
            started = time.perf_counter()
            answer = mutate(review(pod))
            times["mutate"].append(time.perf_counter() - started)
            stored = jsonpatch.apply_patch(pod, orjson.loads(base64.b64decode(answer["patch"])))
            stored["metadata"]["name"] = f"train-{i:05d}"
            body = review(stored)
            started = time.perf_counter()
            assert validate(body)["allowed"]
            times["validate CREATE"].append(time.perf_counter() - started)
            moved = copy.deepcopy(stored)
            moved["metadata"]["annotations"]["gpupool.io/pool"] = "nvidia/high/NVIDIA-H100-80GB-HBM3"
            body = review(moved, "UPDATE", stored)
            started = time.perf_counter()
            assert not validate(body)["allowed"]
            times["validate UPDATE (refused)"].append(time.perf_counter() - started)
        with admitter.inventory.read() as index:  # the demo namespace's reservations, bounded: start over
            index.expire(float("inf"))
    base = statistics.median(times["mutate"])
    rows = {}
    for name, samples in times.items():
        ordered = sorted(samples)
        p50, p99 = statistics.median(ordered), ordered[int(len(ordered) * 0.99)]
        rows[name] = {
            "p50_us": round(p50 * 1e6, 1),
            "p99_us": round(p99 * 1e6, 1),
            "p50_vs_mutate": round(p50 / base, 2),
        }
        print(f"{name:28} p50 {p50 * 1e6:7.1f} us  p99 {p99 * 1e6:7.1f} us  {p50 / base:4.2f}x the mutating call")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"validate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "results": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
