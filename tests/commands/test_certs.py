"""`gpupool certs`: the command line over webhook.serving.certs (tests/serving/test_certs.py has the rest)."""

from __future__ import annotations

import ipaddress
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest

from tests.serving.certreads import ENV_VARS, cert, handshake, sans
from webhook.commands.cli import main

# --- command line --------------------------------------------------------------------------------


class TestCli:
    @pytest.fixture(autouse=True)
    def clean_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The runner's own GPUPOOL_CERTS_* variables must not leak into these tests."""
        for suffix in ENV_VARS:
            monkeypatch.delenv(f"GPUPOOL_CERTS_{suffix}", raising=False)

    def test_creates_then_keeps(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`gpupool certs` exits 0 and prints one line per file: created, then kept on the second run."""
        out = tmp_path / "certs"
        argv = ["certs", "--out", str(out), "--host", "localhost", "--host", "127.0.0.1"]
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(" ", 2)[:2] for line in lines] == [
            ["created", f"{out}:"],
            ["created", f"{out / 'ca.key'}:"],
            ["created", f"{out / 'ca.crt'}:"],
            ["created", f"{out / 'tls.key'}:"],
            ["created", f"{out / 'tls.crt'}:"],
        ]
        handshake(out, "127.0.0.1")
        assert main(argv) == 0
        assert [line.split(" ", 1)[0] for line in capsys.readouterr().out.splitlines()] == ["kept"] * 4

    def test_every_option_can_come_from_the_environment(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """GPUPOOL_CERTS_OUT/SERVICE/NAMESPACE/HOSTS/DAYS configure the command without flags."""
        out = tmp_path / "env-certs"
        monkeypatch.setenv("GPUPOOL_CERTS_OUT", str(out))
        monkeypatch.setenv("GPUPOOL_CERTS_SERVICE", "hook")
        monkeypatch.setenv("GPUPOOL_CERTS_NAMESPACE", "ops")
        monkeypatch.setenv("GPUPOOL_CERTS_HOSTS", "localhost, 10.1.2.3")
        monkeypatch.setenv("GPUPOOL_CERTS_DAYS", "90")
        assert main(["certs"]) == 0
        leaf = cert(out, "tls.crt")
        assert sans(leaf) == (
            ["hook", "hook.ops", "hook.ops.svc", "hook.ops.svc.cluster.local", "localhost"],
            {ipaddress.ip_address("10.1.2.3")},
        )
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == timedelta(days=90, minutes=5)

    def test_flags_win_over_the_environment(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A flag overrides its environment variable; --host replaces GPUPOOL_CERTS_HOSTS, not adds to it."""
        monkeypatch.setenv("GPUPOOL_CERTS_DAYS", "90")
        monkeypatch.setenv("GPUPOOL_CERTS_HOSTS", "env.example")
        out = tmp_path / "certs"
        assert main(["certs", "--out", str(out), "--days", "100", "--host", "flag.example"]) == 0
        leaf = cert(out, "tls.crt")
        assert sans(leaf)[0][-1] == "flag.example"
        assert "env.example" not in sans(leaf)[0]
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == timedelta(days=100, minutes=5)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            pytest.param(["--days", "0"], "--days: 0 is out of range", id="days-zero"),
            pytest.param(["--days", "ten"], "--days: 'ten' is not a whole number", id="days-word"),
            pytest.param(["--host", "bad host!"], "--host: 'bad host!' is neither", id="bad-host"),
            pytest.param(["--service", "Hook"], "--service: 'Hook' is not a valid", id="bad-service"),
            pytest.param(["--namespace", "a_b"], "--namespace: 'a_b' is not a valid", id="bad-namespace"),
        ],
    )
    def test_bad_flag_exits_2_naming_it(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
    ) -> None:
        """A bad flag prints `gpupool certs: error: --flag: ...`, exits 2 and writes nothing."""
        out = tmp_path / "certs"
        assert main(["certs", "--out", str(out), *args]) == 2
        assert capsys.readouterr().err.startswith(f"gpupool certs: error: {message}")
        assert not out.exists()

    @pytest.mark.parametrize(
        ("assignment", "message"),
        [
            pytest.param("GPUPOOL_CERTS_DAYS=7", "GPUPOOL_CERTS_DAYS: 7 is out of range", id="days"),
            pytest.param(
                "GPUPOOL_CERTS_HOSTS=ok.example,bad_host", "GPUPOOL_CERTS_HOSTS: 'bad_host' is neither", id="hosts"
            ),
        ],
    )
    def test_bad_environment_variable_exits_2_naming_it(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        assignment: str,
        message: str,
    ) -> None:
        """A bad variable is reported under its own name, since no flag was given."""
        monkeypatch.setenv(*assignment.split("=", 1))
        out = tmp_path / "certs"
        assert main(["certs", "--out", str(out)]) == 2
        assert capsys.readouterr().err.startswith(f"gpupool certs: error: {message}")
        assert not out.exists()

    def test_corrupt_file_exits_2_naming_it(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A corrupt ca.key gives exit 2 and an error with its path, not a traceback."""
        certs = tmp_path / "certs"
        assert main(["certs", "--out", str(certs)]) == 0
        (certs / "ca.key").write_text("oops\n")
        assert main(["certs", "--out", str(certs)]) == 2
        assert f"{certs / 'ca.key'}: not a PEM private key" in capsys.readouterr().err

    def test_a_ca_key_that_does_not_match_ca_crt_exits_2_naming_both(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Given another install's ca.key next to ca.crt, `gpupool certs` refuses (exit 2) naming both files
        and leaves ca.crt as it was: whoever can write ca.key cannot get a CA of theirs issued."""
        certs, other = tmp_path / "certs", tmp_path / "other"
        assert main(["certs", "--out", str(certs)]) == 0
        assert main(["certs", "--out", str(other)]) == 0
        (certs / "ca.key").write_bytes((other / "ca.key").read_bytes())
        ca_before = (certs / "ca.crt").read_bytes()
        capsys.readouterr()
        assert main(["certs", "--out", str(certs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gpupool certs: error: {certs / 'ca.key'} is not the key of {certs / 'ca.crt'}")
        assert (certs / "ca.crt").read_bytes() == ca_before

    def test_the_directory_is_created_0700_under_umask_000(self, tmp_path: Path) -> None:
        """Under umask 000 the directory would be 0777 (anyone could plant a key); it is 0700."""
        out = tmp_path / "certs"
        old = os.umask(0)
        try:
            assert main(["certs", "--out", str(out)]) == 0
        finally:
            os.umask(old)
        assert stat.S_IMODE(out.stat().st_mode) == 0o700

    def test_out_that_is_a_file_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--out pointing at a regular file is reported, not a traceback."""
        out = tmp_path / "file"
        out.write_text("")
        assert main(["certs", "--out", str(out)]) == 2
        assert "gpupool certs: error: " in capsys.readouterr().err
