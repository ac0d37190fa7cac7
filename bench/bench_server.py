"""Benchmark: POST /mutate with a full decision against a raw WSGI no-op on stock gunicorn gthread.

Starts six servers on the same gunicorn settings (`webhook.serving.server.serve`, TLS, keep-alive), all
but one on gpupool's worker:
- a no-op: the same Flask app setup whose /mutate route only reads the body and returns a constant
  AdmissionReview;
- the same no-op answered by a thin WSGI entry in front of Flask, the shortcut gpupool's /mutate takes;
- a raw WSGI no-op (no Flask at all), on gpupool's worker and on gunicorn's stock gthread worker: the
  difference is what gpupool's HTTP layer (webhook.serving.worker and its parser) costs; the one on
  stock gthread is the goals' baseline (P50_LIMIT, THROUGHPUT_LIMIT and the NEW_ ones in
  bench/serverbench/report.py);
- gpupool's app with the core's answer computed once (what gpupool's HTTP layer costs alone);
- the real `gpupool serve` on the demo inventory, measured twice: sending one Pod again and again (its
  shape is remembered after the first), and cycling through 5,000 Pods of distinct shapes (nothing is
  remembered: the cost of a Pod unlike any recent one).
Then, alternating between them for several rounds (the median is reported, so a noisy neighbour hits
all alike):
- latency p50/p99 with 1 keep-alive TLS connection,
- throughput with 4 keep-alive TLS connections.
The client is `wrk` when installed (C, epoll: it needs far less CPU than the server), else a Python
client with one process per connection.

    .venv/bin/python bench/bench_server.py [--duration 5] [--rounds 3] [--workers 1] [--threads 4]

Results are printed as a table and written to bench/results/server-<time>.json.

The parts are in bench/serverbench/ (its docstring lists them); the servers measured that are not `gpupool
serve` (the no-op and stub servers) are this script's hidden subcommands, run in processes of their own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from webhook.admission.core import Admitter
from webhook.domain.policy import load_policy
from webhook.serving.gunicorn_app import WorkerApp
from webhook.serving.review import parse_review, pod_ref
from webhook.serving.server import ServeOptions, serve
from webhook.sources.snapshot import SnapshotInventory

# As bench.serverbench.launch's: the servers this script runs import nothing from bench/ (see bench()).
REPO = Path(__file__).resolve().parent.parent
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"


def noop_server(args: argparse.Namespace) -> int:
    """gpupool's gunicorn settings and Flask, with a /mutate that does nothing but read and answer."""
    answer = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "", "allowed": True}}
    ).encode()

    def raw(environ: dict[str, Any], start_response: Any) -> Any:
        environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
        return [answer]

    def load() -> WorkerApp:
        from webhook.serving.metrics import Metrics

        Metrics.private().inventory_ready.set(1)
        if args.raw:
            return WorkerApp(raw)
        app = Flask("noop")

        @app.post("/mutate")
        def mutate() -> Response:
            request.get_data()
            return Response(answer, 200, mimetype="application/json")

        if args.thin:
            # The same shortcut gpupool's app takes (webhook/serving/app.py): POST /mutate is answered by a
            # middleware before Flask's dispatch; everything else still goes through Flask.
            flask_app = app.wsgi_app

            def thin(environ: dict[str, Any], start_response: Any) -> Any:
                if environ.get("PATH_INFO") == "/mutate" and environ.get("REQUEST_METHOD") == "POST":
                    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                    start_response("200 OK", [("Content-Type", "application/json"),
                                              ("Content-Length", str(len(answer)))])  # fmt: skip
                    return [answer]
                return flask_app(environ, start_response)

            app.wsgi_app = thin  # type: ignore[method-assign]
        return WorkerApp(app)

    options = ServeOptions(
        cert=args.cert, key=args.key, inventory=None, policy=None, host="127.0.0.1", port=args.port,
        health_port=args.health_port, workers=args.workers, threads=args.threads, log_level="warning",
        **({"worker_class": "gthread"} if args.gthread else {}),
    )  # fmt: skip
    return serve(options, load)


def stub_server(args: argparse.Namespace) -> int:
    """The real app and settings with the core's answer computed once: what gpupool's layer costs alone."""
    policy = load_policy(None)
    review = parse_review(Path(args.body).read_bytes())
    assert review.object is not None
    verdict = Admitter(policy, SnapshotInventory.from_file(str(DEMO_INVENTORY), policy)).admit(
        review.object, namespace=pod_ref(review).namespace, dry_run=True
    )

    class Precomputed:
        def admit(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Any:
            return verdict

    def load() -> WorkerApp:
        # After serve() set PROMETHEUS_MULTIPROC_DIR, like webhook.serving.server's own loader.
        from webhook.serving.app import AppConfig, create_app
        from webhook.serving.metrics import Metrics

        metrics = Metrics.private()
        metrics.inventory_ready.set(1)
        return WorkerApp(create_app(AppConfig(admitter=Precomputed(), metrics=metrics)))

    options = ServeOptions(
        cert=args.cert, key=args.key, inventory=None, policy=None, host="127.0.0.1", port=args.port,
        health_port=args.health_port, workers=args.workers, threads=args.threads, log_level=args.log_level,
    )  # fmt: skip
    return serve(options, load)


def bench(args: argparse.Namespace) -> int:
    """The benchmark itself: the rounds, then the figures (bench/serverbench/)."""
    # Imported here, with the repository put on the path only now: the no-op servers this script also runs get
    # PYTHONPATH at another checkout with --against, and must import that checkout's webhook package, not this
    # one's (and that checkout's bench/ may not have serverbench/).
    sys.path.insert(0, str(REPO))
    from bench.serverbench.report import report
    from bench.serverbench.rounds import run_rounds

    return report(args, run_rounds(args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    noop = sub.add_parser("noop-server", help=argparse.SUPPRESS)
    stub = sub.add_parser("stub-server", help=argparse.SUPPRESS)
    stub.add_argument("--body", required=True)
    noop.add_argument("--thin", action="store_true")
    noop.add_argument("--raw", action="store_true", help="a WSGI callable, no Flask")
    noop.add_argument("--gthread", action="store_true", help="gunicorn's own gthread worker")
    for p in (parser, noop, stub):
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--threads", type=int, default=4)
        p.add_argument("--log-level", default="info", help="gpupool's log level (default info)")
    for p in (noop, stub):
        p.add_argument("--cert", required=True)
        p.add_argument("--key", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--health-port", type=int, required=True)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server (default 3)")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--check", action="store_true", help="exit 1 when the targets are missed")
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="also measure the raw no-op and /mutate on the code of another checkout (say, main before a change)",
    )
    args = parser.parse_args()
    if args.mode == "noop-server":
        return noop_server(args)
    if args.mode == "stub-server":
        return stub_server(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
