"""Benchmark: the CPU one request costs the HTTP/1.1 parser, gpupool's (h11) against gunicorn's.

In one process, on the same bytes, alternating for several rounds (medians of the CPU time per
request, `time.process_time`, so a busy neighbour does not count):
- `examples/admissionreview.json` as kube-apiserver sends it (Content-Length), parsed, turned into a
  WSGI environ and answered with 400 bytes: gpupool's worker (`HttpConnection`, `environ_for`, the
  answer framed by h11) against what gunicorn's gthread worker does (`RequestParser`, `wsgi.create`,
  `Response`), the answer written to a socket that takes everything;
- chunked bodies of 1,000 to 100,000 one-byte chunks: gpupool's parser up to its MAX_CHUNKS (past which
  it refuses the request), per chunk, against gunicorn's parser reading the whole body, which
  re-buffers everything after each chunk-size line (quadratic; 100,000 chunks take a minute of CPU,
  so that case runs in the first round only).

    .venv/bin/python bench/bench_http.py [--rounds 5]

Results are printed as a table and written to bench/results/http-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages

from webhook.serving.http11 import MAX_CHUNKS, Answer, HttpConnection, ProtocolError
from webhook.serving.wsgi import base_environ, environ_for

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
HEAD = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool-webhook.gpupool-system.svc:443\r\n"
    b"User-Agent: kube-apiserver-admission\r\nAccept: application/json, */*\r\nContent-Type: application/json\r\n"
)
ANSWER = Answer(200, b"OK", [(b"Content-Type", b"application/json"), (b"Content-Length", b"400")], b" " * 400)
CHUNK_COUNTS = (1_000, 10_000, 100_000)
ONCE = 100_000  # chunks: measured in the first round only
CLIENT, SERVER = ("10.0.0.7", 41234), ("0.0.0.0", 8443)


class Sink:
    """A socket that takes every byte at once."""

    def sendall(self, data: bytes) -> None:
        return None

    send = sendall


def cpu_seconds(run: Callable[[], object], repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        run()
    return (time.process_time() - started) / repeat


def gpupool_request(data: bytes) -> Callable[[], object]:
    conn = HttpConnection(3 * 1024 * 1024)
    base = base_environ(url_scheme="https", multiprocess=False)

    def run() -> object:
        conn.feed(data)
        request = conn.next_request()
        assert request is not None
        environ_for(request, base, CLIENT, SERVER)["wsgi.input"].read()
        answer = conn.answer(ANSWER, close=False)
        conn.next_cycle()
        return answer

    return run


def gunicorn_request(data: bytes) -> Callable[[], object]:
    cfg = Config()
    headers = [(name.decode(), value.decode()) for name, value in ANSWER.headers]

    def run() -> object:
        request = next(RequestParser(cfg, [data], CLIENT))
        response, environ = wsgi.create(request, Sink(), CLIENT, SERVER, cfg)
        environ["wsgi.input"].read()
        response.start_response("200 OK", headers)
        response.write(ANSWER.body)
        response.close()
        return response

    return run


def gunicorn_chunks(data: bytes) -> Callable[[], object]:
    cfg = Config()

    def run() -> object:
        return next(RequestParser(cfg, [data], CLIENT)).body.read()

    return run


def gpupool_chunks(data: bytes) -> Callable[[], object]:
    def run() -> object:
        conn = HttpConnection(3 * 1024 * 1024)
        conn.feed(data)
        try:
            return conn.next_request()
        except ProtocolError as exc:  # past MAX_CHUNKS
            return exc

    return run


def chunked(count: int) -> bytes:
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * count + b"0\r\n\r\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args()
    body = (REPO / "examples" / "admissionreview.json").read_bytes()
    admission = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    cases: dict[str, tuple[Callable[[], object], int, int]] = {  # name: (run, repeat, unit count)
        "admission: parse, environ, answer; gpupool (h11)": (gpupool_request(admission), 2000, 1),
        "admission: parse, environ, answer; gunicorn gthread": (gunicorn_request(admission), 2000, 1),
        f"{MAX_CHUNKS:,} one-byte chunks, gpupool (h11)": (gpupool_chunks(chunked(MAX_CHUNKS)), 20, MAX_CHUNKS),
    }
    for count in CHUNK_COUNTS:
        cases[f"{count:,} one-byte chunks, gunicorn"] = (gunicorn_chunks(chunked(count)), 1, count)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    env_note = f"{platform.python_version()}, {os.cpu_count()} CPUs"
    print(f"HTTP parser benchmark: {args.rounds} rounds, CPU time, {env_note}", flush=True)
    for round_no in range(1, args.rounds + 1):
        for name, (run, repeat, units) in cases.items():
            if units < ONCE or round_no == 1:
                samples[name].append(cpu_seconds(run, repeat))
        print(f"  round {round_no} done", flush=True)
    print("\n| case | CPU per request | per chunk |")
    print("|---|---|---|")
    result = {}
    for name, (_, _, units) in cases.items():
        seconds = statistics.median(samples[name])
        result[name] = {"seconds_per_request": seconds, "seconds_per_chunk": seconds / units if units > 1 else None}
        per_chunk = f"{seconds / units * 1e6:.2f} µs" if units > 1 else ""
        shown = f"{seconds * 1e6:.1f} µs" if seconds < 0.01 else f"{seconds:.2f} s"
        print(f"| {name} | {shown} | {per_chunk} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"http-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": env_note,
        "rounds": args.rounds, "median": result, "samples": samples,
    }, indent=2))  # fmt: skip
    print(f"written to {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
