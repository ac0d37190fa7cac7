"""Shared fixtures: certificates, AdmissionReviews, and a client that talks like kube-apiserver.

`ApiServerClient` verifies the serving certificate against ca.crt for the in-cluster service name
(connecting to 127.0.0.1 with that name as SNI), keeps its connection alive and POSTs to
/mutate?timeout=10s, as kube-apiserver does. `ServerProcess` runs `python -m webhook serve` (or any
command) with its log in a file and is always killed by the fixture that owns it.
`SIM_TIMEOUT` and `sim_pod` are shared by the API simulator's tests (webhook/testing/).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import settings

from webhook.serving.certs import ensure_certificates

# Property tests: `make test` (and CI) draws the same examples every run, so a red run is reproducible and
# never depends on luck; `make fuzz` draws new ones each run to look for what the fixed ones miss (a find
# is added to the test as an explicit @example). No profile has a deadline: time is measured in bench/.
settings.register_profile("repeatable", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, deadline=None, print_blob=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

REPO = Path(__file__).resolve().parent.parent
DEMO_INVENTORY = REPO / "examples" / "cluster.yaml"
SERVICE, NAMESPACE = "gpupool-webhook", "gpupool-system"
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"
MUTATE_PATH = "/mutate?timeout=10s"
START_TIMEOUT = 60.0  # a noisy 2-core machine can be slow to import and fork


def free_port() -> int:
    """A port nobody listens on right now (bind port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it is true; fail the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the worst-case timings tests measured (`user_properties` named "worst-case seconds")."""
    lines = [
        f"{report.nodeid}: {value} s"
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", "") == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "worst-case seconds"
    ]
    if lines:
        terminalreporter.write_sep("-", "measured worst cases")
        for line in lines:
            terminalreporter.write_line(line)


# --- certificates -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a serving certificate for the service name, localhost and 127.0.0.1 (one per module)."""
    out = tmp_path_factory.mktemp("certs")
    ensure_certificates(out, SERVICE, NAMESPACE, hosts=["localhost", "127.0.0.1"])
    return out


# --- AdmissionReviews ---------------------------------------------------------------------------------


def gpu_pod(
    name: str | None = "trainer",
    *,
    namespace: str | None = "ml",
    annotations: Mapping[str, str] | None = None,
    generate_name: str | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    """A Pod that asks gpupool for one GPU of at least 20 GiB (the demo inventory has several)."""
    meta: dict[str, Any] = {"annotations": {"gpupool.io/min-memory": "20Gi", **(annotations or {})}}
    if name is not None:
        meta["name"] = name
    if generate_name is not None:
        meta["generateName"] = generate_name
    if namespace is not None:
        meta["namespace"] = namespace
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/train:1.0"}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def admission_review(  # noqa: PLR0913 (a test builder: each field of the review a keyword)
    obj: Mapping[str, Any] | None,
    *,
    uid: str | None = None,
    api_version: str = "admission.k8s.io/v1",
    operation: str = "CREATE",
    namespace: str = "ml",
    resource: str = "pods",
    group: str = "",
    sub_resource: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview request as kube-apiserver sends it."""
    kind = {"pods": "Pod", "deployments": "Deployment", "configmaps": "ConfigMap"}.get(resource, "Thing")
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "requestKind": {"group": group, "version": "v1", "kind": kind},
        "requestResource": {"group": group, "version": "v1", "resource": resource},
        "operation": operation,
        "namespace": namespace,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if obj is not None:
        request["object"] = dict(obj)
        if obj.get("metadata", {}).get("name"):
            request["name"] = obj["metadata"]["name"]
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


# --- a client like kube-apiserver ---------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class _SniConnection(http.client.HTTPSConnection):
    """Connects to 127.0.0.1 but verifies the certificate for `server_name`, as for a Service."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=30)
        self._server_name = server_name
        self._ssl_context = context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ssl_context.wrap_socket(raw, server_hostname=self._server_name)


@dataclass
class ApiServerClient:
    port: int
    ca_file: Path
    server_name: str = SERVICE_DNS
    _conn: _SniConnection | None = field(default=None, init=False)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    @property
    def connection(self) -> _SniConnection:
        if self._conn is None:
            self._conn = _SniConnection(self.port, self.context(), self.server_name)
        return self._conn

    def post(
        self,
        body: bytes | Iterator[bytes],
        *,
        content_type: str | None = "application/json",
        path: str = MUTATE_PATH,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        chunked: bool = False,
    ) -> Reply:
        all_headers = dict(headers or {})
        if content_type is not None:
            all_headers["Content-Type"] = content_type
        conn = self.connection
        conn.request(method, path, body=body, headers=all_headers, encode_chunked=chunked)
        resp = conn.getresponse()
        data = resp.read()
        reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        if resp.will_close:
            self.close()
        return reply

    def review(self, review: Mapping[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview and return the answer, which must be HTTP 200 JSON."""
        reply = self.post(orjson.dumps(review))
        assert reply.status == 200, reply.body
        assert reply.headers["content-type"] == "application/json"
        answer: dict[str, Any] = reply.json()
        return answer

    def peer_certificate(self) -> bytes:
        """The DER certificate the server showed on the current connection."""
        sock = self.connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        der = sock.getpeercert(binary_form=True)
        assert der is not None
        return der

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# --- server processes ---------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """A server subprocess with its combined output in `log_path`."""

    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str]
    health_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv), stdout=log, stderr=subprocess.STDOUT, env=dict(self.env), cwd=REPO
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        assert self.health_port is not None

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            return health_get(self.health_port, "/readyz")[0] == 200

        wait_until(ready, timeout, "the server's /readyz")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        """Every log line, each of which must be a JSON object."""
        return [orjson.loads(line) for line in self.log().splitlines() if line.strip()]

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then SIGKILL if it does not exit within `timeout`; the exit code."""
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """SIGTERM, unless it has exited."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 30) -> int:
        """The exit code, after SIGKILL if it has not exited within `timeout`."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return int(self.proc.returncode)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def stop_all(servers: Sequence[ServerProcess], timeout: float = 30) -> None:
    """SIGTERM to every server at once, then each waited for as `stop` does: a cluster's replicas shut down
    side by side, not one after the other."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait_stopped(timeout)


def health_get(port: int, path: str) -> tuple[int, bytes, str]:
    """GET on the plain-HTTP health port: (status, body, content type); (0, b"", "") when refused."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type") or ""
    except OSError:
        return 0, b"", ""
    finally:
        conn.close()


def server_env(**extra: str) -> dict[str, str]:
    """The test's environment without any GPUPOOL_ or PROMETHEUS_ variable a developer may have set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "PROMETHEUS_"))}
    env.update(extra)
    return env


# The built-in default placing at admission, for the servers of tests that check admission-time answers
# (the shipped default queues); a test of the queue passes its own --policy.
PLACE_NOW = Path(__file__).with_name("place_now.yaml")


def serve_argv(cert_dir: Path, port: int, health_port: int, *extra: str) -> list[str]:
    """`gpupool serve` on the test's ports; without `--policy` in `extra`, with PLACE_NOW."""
    policy = [] if "--policy" in extra else ["--policy", str(PLACE_NOW)]
    return [
        sys.executable, "-m", "webhook", "serve",
        "--cert", str(cert_dir / "tls.crt"), "--key", str(cert_dir / "tls.key"),
        "--host", "127.0.0.1", "--port", str(port), "--health-port", str(health_port),
        *policy, *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """Start server processes for a module; every one is stopped (then killed) at the module's end."""
    started: list[ServerProcess] = []

    def start(
        argv: Sequence[str], health_port: int | None, *, env: Mapping[str, str] | None = None, wait: bool = True
    ) -> ServerProcess:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = ServerProcess(argv, log_path, env or server_env(), health_port)
        started.append(server.start())
        if wait and health_port is not None:
            server.wait_ready()
        return server

    yield start
    for server in started:
        try:
            server.stop(timeout=20)
        finally:
            server.kill()


# --- the Kubernetes API simulator ---------------------------------------------------------------------

SIM_TIMEOUT = 20  # seconds: generous client timeouts, so a noisy machine never fails a test


def sim_pod(name: str, namespace: str = "team-a", phase: str = "Running") -> dict[str, Any]:
    """A plain Pod for the simulator's tests (`builders.pod` is the core's, with GPUs and annotations)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": phase},
    }
