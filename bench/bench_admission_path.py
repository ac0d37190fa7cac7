"""Benchmark: where one admission's time goes inside the server, step by step, next to each step's floor.

In one process, on the demo inventory, the steps a request takes through gpupool's worker are run one
after another on the bytes `wrk` sends (`examples/admissionreview.json` with its headers), each timed
alone (the CPU time of this thread, `time.thread_time_ns`, so time the machine's other users take is not
counted; the best of several repeats of a tight loop, then the median of single timed calls in a
realistic order, which caches evict as they do in the server):

- TLS read and write: decrypting the request's TLS records and encrypting the answer's (ssl.SSLObject
  on memory BIOs, what SSLSocket.recv and send do without the system calls); the floor is the same;
- framing: h11 parsing the request, and framing the answer; floor: splitting the head from the body and
  the header lines at their colons, and joining preformatted bytes;
- the WSGI environ; floor: a dict copy with the request's own keys set;
- decoding the AdmissionReview; floor: `orjson.loads` of the body;
- the decision (the Admitter, reservation included), with one Pod shape and with every Pod a new one;
- encoding the answer; floor: `orjson.dumps` of the same response object;
- metrics and the log line;
- the whole WSGI call (`_AdmissionEntry`), and a raw WSGI no-op's for comparison.

    .venv/bin/python bench/bench_admission_path.py [--calls 3000] [--repeats 5]

Printed as a table (median per call, in µs) and written to bench/results/admission-path-<time>.json.
The socket's system calls, the worker's main loop and thread hand-off are not here: bench_server.py
measures the whole server, and the difference between the two is theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import itertools
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from webhook.admission.core import Admitter
from webhook.domain.policy import load_policy
from webhook.serving.app import MAX_BODY_BYTES, AppConfig, create_app
from webhook.serving.certs import ensure_certificates
from webhook.serving.http11 import HttpConnection
from webhook.serving.logs import ADMISSION_LOGGER, AdmissionLog, admission_fields
from webhook.serving.metrics import Metrics
from webhook.serving.review import parse_review, pod_ref, response_body
from webhook.serving.wsgi import base_environ, call_app, environ_for
from webhook.sources.snapshot import SnapshotInventory

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SAMPLE = REPO / "examples" / "admissionreview.json"
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"
HEAD = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1:8443\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n"
)
NEW_SHAPES = 5000  # as bench_server.py's: more than the shape memo holds (4,096), so every Pod is new to it
CLIENT, SERVER = ("127.0.0.1", 40000), ("127.0.0.1", 8443)


def cpu_ns() -> int:
    return time.thread_time_ns()


def timed(step: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """(best loop mean, median of single calls) in µs."""
    best = float("inf")
    for _ in range(repeats):
        start = cpu_ns()
        for _ in range(calls):
            step()
        best = min(best, (cpu_ns() - start) / calls / 1000)
    singles = []
    for _ in range(calls):
        start = cpu_ns()
        step()
        singles.append((cpu_ns() - start) / 1000)
    return best, statistics.median(singles)


def tls_pair(tmp: Path) -> tuple[ssl.SSLObject, ssl.SSLObject, Callable[[ssl.SSLObject, ssl.SSLObject], None]]:
    """A server and a client SSLObject on memory BIOs, handshaken; and `pump(a, b)` moving a's bytes to b."""
    ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=["127.0.0.1"])
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(tmp / "ca.crt")
    bios = {name: (ssl.MemoryBIO(), ssl.MemoryBIO()) for name in ("server", "client")}
    server = server_ctx.wrap_bio(*bios["server"], server_side=True)
    client = client_ctx.wrap_bio(*bios["client"], server_hostname="127.0.0.1")
    out_of = {id(server): bios["server"][1], id(client): bios["client"][1]}
    in_of = {id(server): bios["server"][0], id(client): bios["client"][0]}

    def pump(src: ssl.SSLObject, dst: ssl.SSLObject) -> None:
        in_of[id(dst)].write(out_of[id(src)].read())

    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):  # the other side's turn
                side.do_handshake()
        pump(client, server)
        pump(server, client)
    return server, client, pump


def bench(args: argparse.Namespace) -> dict[str, Any]:
    body = SAMPLE.read_bytes()
    wire = HEAD % len(body) + body
    policy = load_policy(None)
    inventory = SnapshotInventory.from_file(str(DEMO_INVENTORY), policy)
    admitter = Admitter(policy, inventory)
    metrics = Metrics.private()
    metrics.inventory_ready.set(1)
    devnull = open(os.devnull, "wb")  # noqa: SIM115 (open for the whole run)
    app = create_app(AppConfig(admitter=admitter, metrics=metrics, write_line=devnull.write))
    lines = AdmissionLog(__import__("logging").getLogger(ADMISSION_LOGGER), devnull.write)
    base = base_environ(url_scheme="https", multiprocess=False)
    review = parse_review(body)
    ref = pod_ref(review)
    verdict = admitter.admit(review.object, namespace=ref.namespace)
    payload = response_body(review, verdict)
    answer_obj = orjson.loads(payload)
    # Every Pod a new shape: as bench_server.py's, distinct gpupool.io/min-memory values.
    raw = json.loads(body)
    new_bodies = []
    for i in range(NEW_SHAPES):
        variant = copy.deepcopy(raw)
        variant["request"]["object"]["metadata"].setdefault("annotations", {})["gpupool.io/min-memory"] = (
            f"{1000 + i}Mi"
        )
        new_bodies.append(parse_review(orjson.dumps(variant)))
    new_iter = itertools.cycle(new_bodies)
    gc.freeze()  # as the server does once the inventory is loaded (webhook.serving.server)

    http = HttpConnection(MAX_BODY_BYTES)
    split: dict[str, list[int]] = {"parse": [], "frame": []}

    def h11_cycle() -> None:
        start = cpu_ns()
        http.feed(wire)
        assert http.next_request() is not None
        parsed = cpu_ns()
        http.answer(answer, close=False)
        http.next_cycle()
        split["parse"].append(parsed - start)
        split["frame"].append(cpu_ns() - parsed)

    def parse_floor() -> None:
        head, _, rest = wire.partition(b"\r\n\r\n")
        lines_ = head.split(b"\r\n")
        [line.partition(b":") for line in lines_[1:]]
        assert len(rest) == len(body)

    http.feed(wire)
    request = http.next_request()
    assert request is not None
    environ = environ_for(request, base, CLIENT, SERVER)
    answer = call_app(app, environ)
    http.answer(answer, close=False)
    http.next_cycle()

    framed = b"HTTP/1.1 200 \r\nContent-Type: application/json\r\nContent-Length: %d\r\nDate: x\r\n\r\n"

    def frame_floor() -> None:
        b"".join((framed % len(answer.body), answer.body))

    def environ_step() -> None:
        environ_for(request, base, CLIENT, SERVER)

    def environ_floor() -> None:
        e = base.copy()
        e["PATH_INFO"], e["QUERY_STRING"], e["REQUEST_METHOD"] = "/mutate", "timeout=10s", "POST"
        e["CONTENT_TYPE"], e["CONTENT_LENGTH"], e["wsgi.input"] = "application/json", "5664", io.BytesIO(body)

    def decode() -> None:
        pod_ref(parse_review(body))

    def decode_floor() -> None:
        orjson.loads(body)

    def decide() -> None:
        admitter.admit(review.object, namespace=ref.namespace)

    def decide_new() -> None:
        new = next(new_iter)
        admitter.admit(new.object, namespace=ref.namespace)

    def encode() -> None:
        response_body(review, verdict)

    def encode_floor() -> None:
        orjson.dumps(answer_obj)

    def record() -> None:
        metrics.record(outcome="mutated", pool="x", seconds=0.0002, dry_run=False, namespace="ml-train")
        lines.info(admission_fields(uid=review.uid, namespace=ref.namespace, pod=ref.name, outcome="mutated",
                                    pool="x", latency_ms=0.2))  # fmt: skip

    def whole_app() -> None:
        environ["wsgi.input"] = io.BytesIO(body)
        call_app(app, environ)

    def noop_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "97")])
        return [b"x" * 97]

    def whole_noop() -> None:
        environ["wsgi.input"] = io.BytesIO(body)
        call_app(noop_app, environ)

    with tempfile.TemporaryDirectory() as tmp:
        server, client, pump = tls_pair(Path(tmp))

    def across(sender: ssl.SSLObject, receiver: ssl.SSLObject, data: bytes) -> Callable[[], None]:
        """One TLS hop: `sender` encrypts `data`, `receiver` decrypts all of it."""

        def hop() -> None:
            sender.write(data)
            pump(sender, receiver)
            got = 0
            while got < len(data):
                got += len(receiver.read(256 * 1024))

        return hop

    framer = HttpConnection(MAX_BODY_BYTES)
    framer.feed(wire)
    framer.next_request()
    reply = framer.answer(answer, close=False)
    tls_read, tls_write = across(client, server, wire), across(server, client, reply)

    steps: dict[str, tuple[Callable[[], object], Callable[[], object] | None]] = {
        "TLS: decrypt the request": (tls_read, None),
        "TLS: encrypt the answer": (tls_write, None),
        "HTTP/1.1: parse the request and frame the answer": (h11_cycle, None),
        "HTTP/1.1 floor: split head and header lines; join the answer": (parse_floor, frame_floor),
        "WSGI environ": (environ_step, environ_floor),
        "decode the AdmissionReview": (decode, decode_floor),
        "decide, one Pod shape": (decide, None),
        "decide, every Pod a new shape": (decide_new, None),
        "encode the answer": (encode, encode_floor),
        "metrics and the log line": (record, None),
        "the whole WSGI call (/mutate, one shape)": (whole_app, None),
        "the whole WSGI call of a raw no-op": (whole_noop, None),
    }
    results: dict[str, Any] = {}
    print(f"{'step':58} {'loop':>8} {'single':>8} {'floor':>8}   (µs per call, thread CPU time)")
    for name, (step, floor) in steps.items():
        loop, single = timed(step, args.calls, args.repeats)
        floor_loop = timed(floor, args.calls, args.repeats)[0] if floor is not None else None
        results[name] = {"loop_us": loop, "single_us": single, "floor_us": floor_loop}
        shown = f"{floor_loop:8.1f}" if floor_loop is not None else " " * 8
        print(f"{name:58} {loop:8.1f} {single:8.1f} {shown}", flush=True)
        if step is h11_cycle:
            for part, samples in split.items():
                median = statistics.median(samples) / 1000
                results[f"HTTP/1.1: {part}"] = {"loop_us": None, "single_us": median, "floor_us": None}
                print(f"{'  of which ' + part:58} {'':8} {median:8.1f}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = bench(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"admission-path-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]), "steps": results,
                               "load_average": os.getloadavg()}, indent=2))  # fmt: skip
    print(f"written to {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
