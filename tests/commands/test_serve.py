"""`gpupool serve`'s command line: every flag has a variable, flags win, defaults, and every configuration
a user can get wrong exits 2 with a message before gunicorn starts."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEMO_INVENTORY, REPO, free_port, server_env
from tests.serving.clientcerts import client_certificate, new_ca
from webhook.admission.validation import Trusted
from webhook.commands.cli import run_command
from webhook.commands.serve import DEFAULTS, SERVE_ENV, checked_core, configure, load_core, resolve_options
from webhook.domain.errors import ConfigError
from webhook.queue.leader import DEFAULT_TIMES, LeaseTimes


def serve_args(**given: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args([])
    for name, value in given.items():
        setattr(args, name, value)
    return args


class TestOptions:
    def test_every_option_has_an_environment_variable(self) -> None:
        """SERVE_ENV maps each of serve's flags to its variable (the Deployment is checked against it)."""
        parser = argparse.ArgumentParser()
        configure(parser)
        flags = {a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"}
        assert set(SERVE_ENV.values()) == flags
        assert all(name.startswith("GPUPOOL_") for name in SERVE_ENV)

    def test_environment_is_used_and_flags_win(self) -> None:
        """A variable sets an option; the flag, when given, wins over it."""
        env = {"GPUPOOL_CERT": "env.crt", "GPUPOOL_KEY": "env.key", "GPUPOOL_PORT": "9443", "GPUPOOL_WORKERS": "3"}
        options = resolve_options(serve_args(port="10443"), env)
        assert (options.cert, options.key, options.port, options.workers) == ("env.crt", "env.key", 10443, 3)

    def test_defaults(self) -> None:
        """Without flags or variables: 0.0.0.0, 8443, 8080, 1 worker, 4 threads, info."""
        options = resolve_options(serve_args(cert="c", key="k"), {})
        assert (
            options.host,
            options.port,
            options.health_port,
            options.workers,
            options.threads,
            options.log_level,
        ) == ("0.0.0.0", 8443, 8080, 1, 4, "info")
        assert DEFAULTS["--port"] == "8443"

    def test_who_may_change_what_gpupool_guards(self) -> None:
        """gpupool knows itself as the service account of its Pods: GPUPOOL_SERVICE_ACCOUNT in POD_NAMESPACE
        (both from the downward API in the Deployment; gpupool-webhook in gpupool-system by default). The
        trusted users and groups are comma-separated lists, none by default."""
        default = resolve_options(serve_args(cert="c", key="k", inventory=str(DEMO_INVENTORY)), {})
        assert (default.service_account, default.trusted_users, default.trusted_groups) == ("gpupool-webhook", (), ())
        assert load_core(default, {}).trusted == Trusted.of("gpupool-system", "gpupool-webhook")
        env = {
            "GPUPOOL_SERVICE_ACCOUNT": "pool",
            "GPUPOOL_TRUSTED_USERS": "alice, system:serviceaccount:kueue-system:kueue-controller-manager,,alice",
            "GPUPOOL_TRUSTED_GROUPS": "oncall",
        }
        options = resolve_options(serve_args(cert="c", key="k", inventory=str(DEMO_INVENTORY)), env)
        assert options.trusted_users == ("alice", "system:serviceaccount:kueue-system:kueue-controller-manager")
        trusted = load_core(options, {"POD_NAMESPACE": "gpu"}).trusted
        assert trusted.service_account == "system:serviceaccount:gpu:pool"
        assert (trusted.users, trusted.groups) == (frozenset(options.trusted_users), frozenset({"oncall"}))

    def test_the_lease_duration_reaches_the_queues_leader_election(self) -> None:
        """GPUPOOL_LEASE_DURATION (or --lease-duration) sets how long the queue's Lease stays a leader's:
        15 s by default, as Kueue's; its renew deadline and retry keep the default's proportions."""
        given = {"cert": "c", "key": "k", "inventory": str(DEMO_INVENTORY)}
        assert load_core(resolve_options(serve_args(**given), {}), {}).queue.lease_seconds == 15
        options = resolve_options(serve_args(**given), {"GPUPOOL_LEASE_DURATION": "6"})
        assert load_core(options, {}).queue.lease_seconds == 6
        assert LeaseTimes.of(15) == DEFAULT_TIMES
        assert LeaseTimes.of(6) == LeaseTimes(6.0, 4.0, 0.8)

    def test_the_policy_warns_at_start_of_quotas_now_cannot_keep_with_several_admitting_processes(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """GPUPOOL_REPLICAS (the Deployment's replica count) times the workers is how many processes admit:
        with two, a `now` namespace's classQuota is warned of at start, with one it is not; a snapshot
        inventory under a policy that queues is warned of too, since nothing could release its Pods."""
        policy = tmp_path / "policy.yaml"
        policy.write_text("defaults: {placement: now}\nnamespaces: {team-a: {classQuota: {medium: 4}}}\n", "utf-8")
        given = {"cert": "c", "key": "k", "inventory": str(DEMO_INVENTORY), "policy": str(policy)}
        one = resolve_options(serve_args(**given), {})
        assert one.replicas == 1
        with caplog.at_level("WARNING", logger="gpupool.policy"):
            assert load_core(one, {}).admitters == 1
        assert caplog.messages == []
        two = resolve_options(serve_args(**given), {"GPUPOOL_REPLICAS": "2"})
        with caplog.at_level("WARNING", logger="gpupool.policy"):
            assert load_core(two, {}).admitters == 2
        assert any(m.startswith("policy: namespaces.team-a: placement now with classQuota") for m in caplog.messages)
        caplog.clear()
        shipped = resolve_options(serve_args(cert="c", key="k", inventory=str(DEMO_INVENTORY)), {})
        with caplog.at_level("WARNING", logger="gpupool.policy"):
            load_core(shipped, {})
        assert [m for m in caplog.messages if "never released" in m], caplog.messages

    @pytest.mark.parametrize(
        ("given", "env", "words"),
        [
            pytest.param({}, {}, "--cert (or GPUPOOL_CERT) is required", id="no-cert"),
            pytest.param({"cert": "c", "key": "k"}, {"GPUPOOL_REPLICAS": "0"}, "GPUPOOL_REPLICAS", id="zero-replicas"),
            pytest.param({"cert": "c", "key": "k"}, {"GPUPOOL_PORT": "https"}, "GPUPOOL_PORT", id="bad-env-port"),
            pytest.param({"cert": "c", "key": "k", "workers": "0"}, {}, "--workers", id="zero-workers"),
            pytest.param({"cert": "c", "key": "k", "port": "8080"}, {}, "must differ", id="same-ports"),
            pytest.param({"cert": "c", "key": "k"}, {"GPUPOOL_LEASE_DURATION": "2"}, "from 3 to 600", id="short-lease"),
            pytest.param({"cert": "c", "key": "k", "log_level": "loud"}, {}, "--log-level", id="bad-level"),
            pytest.param(
                {"cert": "c", "key": "k", "service_account": "web hook"}, {}, "--service-account", id="bad-account"
            ),
        ],
    )
    def test_bad_options_are_usage_errors(self, given: dict[str, str], env: dict[str, str], words: str) -> None:
        """A bad option is a ConfigError that names the flag and its variable."""
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            resolve_options(serve_args(**given), env)


def bad_configurations(cert_dir: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Each configuration `gpupool serve` must refuse before gunicorn starts, by words its message holds:
    a missing or unusable certificate, a bad policy, a bad or missing inventory, a --client-ca that is
    missing, not PEM or a client certificate instead of a CA."""
    bad_policy = tmp_path / "policy.yaml"
    bad_policy.write_text("classes: 7\n")
    bad_inventory = tmp_path / "cluster.yaml"
    bad_inventory.write_text("kind: List\nitems: [{kind: Node}]\n")
    tls = ["--cert", str(cert_dir / "tls.crt"), "--key", str(cert_dir / "tls.key")]
    client_cert, _ = client_certificate(new_ca(tmp_path / "client-ca"), tmp_path / "client")
    demo = ["--inventory", str(DEMO_INVENTORY)]
    return {
        "no such file": ["--cert", str(tmp_path / "missing.crt"), "--key", str(cert_dir / "tls.key"), *demo],
        "not a usable certificate": ["--cert", str(cert_dir / "ca.crt"), "--key", str(cert_dir / "tls.key"), *demo],
        "classes": [*tls, "--policy", str(bad_policy), *demo],
        str(bad_inventory): [*tls, "--inventory", str(bad_inventory)],
        "cannot load Kubernetes configuration": [*tls, "--kubeconfig", str(cert_dir / "no-such-kubeconfig")],
        f"--client-ca {tmp_path / 'none.crt'}: no such file": [*tls, *demo, "--client-ca", str(tmp_path / "none.crt")],
        "not a PEM certificate file": [*tls, *demo, "--client-ca", str(bad_policy)],
        "'CN=kube-apiserver' is not a CA certificate": [*tls, *demo, "--client-ca", str(client_cert)],
    }


def checks_only(args: argparse.Namespace) -> int:
    """`gpupool serve` up to where it would start gunicorn: its options, then `checked_core`, as `run` does."""
    checked_core(resolve_options(args, server_env()), {})
    return 0


class TestStartupErrors:
    def run_serve(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook", "serve", *args],
            check=False,
            env=env or server_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def test_bad_configurations_exit_2_with_a_clear_message(
        self, cert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each bad configuration exits 2 with `gpupool serve: error:` and what is wrong, from the checks
        `serve` runs before gunicorn starts (the command line in-process, only gunicorn left out; the process
        path is shown by test_the_process_exits_2_with_the_same_message)."""
        for words, args in bad_configurations(cert_dir, tmp_path).items():
            status = run_command(["serve", *args], settings={"_run": checks_only})
            stderr = capsys.readouterr().err
            assert status == 2, (words, stderr)
            assert stderr.startswith("gpupool serve: error:") and words in stderr, stderr
            assert "Traceback" not in stderr

    @pytest.mark.parametrize(
        "words", ["classes", "'CN=kube-apiserver' is not a CA certificate"], ids=["bad-policy", "client-cert-as-ca"]
    )
    def test_the_process_exits_2_with_the_same_message(self, cert_dir: Path, tmp_path: Path, words: str) -> None:
        """A real `gpupool serve` process with a bad policy, or a client certificate as --client-ca: exit 2
        with the message, before gunicorn starts."""
        args = bad_configurations(cert_dir, tmp_path)[words]
        result = self.run_serve(
            *args, "--host", "127.0.0.1", "--port", str(free_port()), "--health-port", str(free_port())
        )
        assert result.returncode == 2, (words, result.stderr)
        assert result.stderr.startswith("gpupool serve: error:") and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "Starting gunicorn" not in result.stderr

    def test_busy_port_exits_2(self, cert_dir: Path) -> None:
        """A TLS port that is already taken is reported, not retried for seconds by gunicorn."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = self.run_serve(
                "--cert",
                str(cert_dir / "tls.crt"),
                "--key",
                str(cert_dir / "tls.key"),
                "--inventory",
                str(DEMO_INVENTORY),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--health-port",
                str(free_port()),
            )
        assert result.returncode == 2 and f"--port {port}" in result.stderr
