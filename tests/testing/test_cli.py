"""`python -m webhook.testing` (webhook/testing/__main__.py): the simulator in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import kubernetes
import pytest

from tests.conftest import SIM_TIMEOUT as TIMEOUT

pytestmark = pytest.mark.slow  # starts the simulator in a subprocess


class TestCommandLine:
    def test_serves_a_synthetic_cluster_from_its_own_process(self, tmp_path: Path) -> None:
        """`python -m webhook.testing` writes a kubeconfig and serves until terminated."""
        kubeconfig = tmp_path / "kubeconfig"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook.testing",
                "--nodes",
                "3",
                "--pods",
                "10",
                "--kubeconfig",
                str(kubeconfig),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # printed once the kubeconfig is written and it serves
            assert "serving http://127.0.0.1:" in line
            with kubernetes.config.new_client_from_config(config_file=str(kubeconfig)) as client:
                assert len(kubernetes.client.CoreV1Api(client).list_node(_request_timeout=TIMEOUT).items) == 3
            proc.terminate()
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()

    def test_churn_runs_from_the_start_and_reports_its_counts_on_exit(self, tmp_path: Path) -> None:
        """`--churn N` says so in the first line; on SIGTERM the last line holds the churn's counts."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "webhook.testing", "--nodes", "5", "--pods", "40", "--churn", "200"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert "churning 200 writes/s, serving http://127.0.0.1:" in proc.stdout.readline()
            proc.terminate()
            rest = proc.stdout.read().splitlines()
            assert proc.wait(timeout=TIMEOUT) == 0
            assert rest[-1].startswith("kubesim: churn {")
            stats = json.loads(rest[-1].removeprefix("kubesim: churn "))
            assert {"events", "seconds", "gpu_pods", "cpu_pods"} <= stats.keys()
        finally:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()

    def test_schedule_binds_and_finishes_and_reports_its_counts_on_exit(self, tmp_path: Path) -> None:
        """`--schedule --run-seconds 0` binds the cluster's Pending Pods that fit and finishes them at once;
        the last line holds the scheduler's counts."""
        kubeconfig = tmp_path / "kubeconfig"
        argv = ["--nodes", "10", "--pods", "200", "--schedule", "--run-seconds", "0", "--kubeconfig", str(kubeconfig)]
        proc = subprocess.Popen([sys.executable, "-m", "webhook.testing", *argv], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert "scheduling, serving http://127.0.0.1:" in proc.stdout.readline()
            with kubernetes.config.new_client_from_config(config_file=str(kubeconfig)) as client:
                api = kubernetes.client.CoreV1Api(client)
                deadline = time.monotonic() + TIMEOUT
                while time.monotonic() < deadline:
                    phases = {p.status.phase for p in api.list_pod_for_all_namespaces(_request_timeout=TIMEOUT).items}
                    if "Running" not in phases:
                        break
                    time.sleep(0.2)
                assert "Running" not in phases  # every Pod that ran has finished
            proc.terminate()
            rest = proc.stdout.read().splitlines()
            assert proc.wait(timeout=TIMEOUT) == 0
            stats = json.loads(rest[-1].removeprefix("kubesim: scheduler "))
            assert stats["finish"] > 0
        finally:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()

    def test_control_sets_the_finish_rate_of_the_pods_the_selector_picks_and_the_audit_logs_it(
        self, tmp_path: Path
    ) -> None:
        """Nothing finishes until `finish-rate N` comes on stdin; then only Pods with `app=batch` do, and the
        audit log holds each of those writes with its store time; on exit a line gives the log's counts."""
        kubeconfig, audit = tmp_path / "kubeconfig", tmp_path / "audit.jsonl"
        argv = ["--nodes", "10", "--pods", "200", "--schedule", "--control", "--finish-selector", "app=batch",
                "--audit-log", str(audit), "--audit-kinds", "pods", "--kubeconfig", str(kubeconfig)]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "webhook.testing", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            assert "serving http://127.0.0.1:" in proc.stdout.readline()
            with kubernetes.config.new_client_from_config(config_file=str(kubeconfig)) as client:
                api = kubernetes.client.CoreV1Api(client)

                def running(selector: str) -> int:
                    found = api.list_pod_for_all_namespaces(
                        label_selector=selector, field_selector="status.phase=Running", _request_timeout=TIMEOUT
                    )
                    return len(found.items)

                time.sleep(0.5)
                assert running("app=batch") == 16  # no finish rate yet
                proc.stdin.write("finish-rate 1000\nbogus\n")
                proc.stdin.flush()
                assert proc.stdout.readline().strip() == "kubesim: finish-rate 1000"
                assert "unknown command 'bogus'" in proc.stdout.readline()
                deadline = time.monotonic() + TIMEOUT
                while running("app=batch") and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert running("app=batch") == 0 and running("app!=batch") > 0
            proc.terminate()
            rest = proc.stdout.read().splitlines()
            assert proc.wait(timeout=TIMEOUT) == 0
            counts = json.loads(rest[-1].removeprefix("kubesim: audit "))
            finished = [
                e
                for e in map(json.loads, audit.read_text().splitlines())
                if e["object"]["status"]["phase"] == "Succeeded"
            ]
            assert len(finished) == 16 and {e["object"]["metadata"]["labels"]["app"] for e in finished} == {"batch"}
            assert counts["gaps"] == 0 and counts["lines"] >= 16 and all(e["at"] > 0 for e in finished)
        finally:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def test_finish_options_need_schedule(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "webhook.testing", "--finish-rate", "5"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert done.returncode == 2 and "need --schedule" in done.stderr

    def test_a_bad_finish_selector_or_audit_kind_is_refused_naming_it(self) -> None:
        for argv, named in (
            (["--schedule", "--finish-selector", "a in b"], "--finish-selector"),
            (["--audit-log", "/dev/null", "--audit-kinds", "pods,secrets"], "--audit-kinds"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", "webhook.testing", "--nodes", "1", "--pods", "1", *argv],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
            )
            assert done.returncode == 2 and named in done.stderr, done.stderr
