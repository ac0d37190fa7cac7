"""The `gpupool` command line, as kubectl users expect it: `--version` and `version`, the nearest flag or
command for a mistyped one, no abbreviated flags, kubectl's flags before the command too, and the same
commands with the same flags under `kubectl gpupool`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import webhook
from webhook.commands import kubectl
from webhook.commands.cli import SUBCOMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "examples" / "cluster.yaml")
POLICY = str(REPO / "examples" / "policy.yaml")


def usage_error(capsys: pytest.CaptureFixture[str], run: object, argv: list[str]) -> str:
    """The stderr of a command line refused by the parser (exit status 2)."""
    assert callable(run)
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


# --- version ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run, prog", [(main, "gpupool"), (kubectl.main, "kubectl gpupool")], ids=["gpupool", "kubectl"]
)
def test_version_flag_and_command(capsys: pytest.CaptureFixture[str], run: object, prog: str) -> None:
    """`--version` prints the version and exits 0 (it used to fail asking for a COMMAND); `version`
    prints the same, and `-o json|yaml` a document with it."""
    assert callable(run)
    with pytest.raises(SystemExit) as exc:
        run(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"{prog} {webhook.__version__}\n"
    assert run(["version"]) == 0
    assert capsys.readouterr().out == f"{prog} {webhook.__version__}\n"
    assert run(["version", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["gpupoolVersion"] == webhook.__version__
    assert run(["version", "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == document


# --- mistakes get the nearest right answer --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["inventory", "--polcy", "p.yaml"], "unknown flag --polcy (did you mean --policy?)"),
        (["quota", "--all-namespace"], "unknown flag --all-namespace (did you mean --all-namespaces?)"),
        (["explain", "pod.yaml", "--no-header"], "unknown flag --no-header"),
        (["quota", "--inventory=x", "--nmespace=team-a"], "unknown flag --nmespace (did you mean --namespace?)"),
        (["quota", "stray"], "unexpected argument 'stray'"),
    ],
    ids=["policy", "all-namespaces", "no-header-on-explain", "with-equals", "positional"],
)
def test_a_mistyped_flag_is_named_with_the_nearest_one(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    """The subcommand's own usage and one error line that names the flag and the nearest the command
    has (not the top-level usage with no hint)."""
    err = usage_error(capsys, main, argv)
    assert err.startswith(f"usage: gpupool {argv[0]} ")
    last = err.splitlines()[-1]
    assert last == f"gpupool {argv[0]}: error: {expected} (see gpupool {argv[0]} --help)"


def test_a_mistyped_command_is_named_with_the_nearest_one(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, main, ["explian", "pod.yaml"])
    assert err.splitlines()[-1] == (
        "gpupool: error: unknown command 'explian' (did you mean explain?); accepted: " + ", ".join(SUBCOMMANDS)
    )
    err = usage_error(capsys, kubectl.main, ["qouta"])
    accepted = "accepted: explain, inventory, quota, queue, release, version"
    assert f"unknown command 'qouta' (did you mean quota?); {accepted}" in err


def test_flags_are_never_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    """As kubectl: `--pol` is not `--policy`, so a flag added later cannot change an old command line."""
    err = usage_error(capsys, main, ["quota", "--inventory", INVENTORY, "--pol", POLICY])
    assert "unknown flag --pol (did you mean --policy?)" in err


# --- kubectl's flags before the command -------------------------------------------------------------------


def test_kubectls_flags_may_come_before_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpupool -n team-b quota` is `gpupool quota -n team-b`, as kubectl takes its flags anywhere."""
    common = ["--inventory", INVENTORY, "--policy", POLICY, "-o", "json"]
    assert main(["quota", "-n", "team-b", *common]) == 0
    after = capsys.readouterr().out
    assert main(["-n", "team-b", "quota", *common]) == 0
    assert capsys.readouterr().out == after
    assert kubectl.main(["--namespace=team-b", "quota", *common]) == 0
    assert capsys.readouterr().out == after
    assert main(["-A", "quota", *common]) == 0
    assert {q["namespace"] for q in json.loads(capsys.readouterr().out)["quotas"]} == {"team-a", "team-b"}


# --- one command line for both ----------------------------------------------------------------------------


def options(prog: str, commands: tuple[str, ...], command: str) -> dict[str, tuple[str, ...] | None]:
    """Each option string of `command` and the choices it takes."""
    parser = build_parser([command], prog, commands)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {o: tuple(a.choices) if a.choices else None for a in sub._actions for o in a.option_strings}


@pytest.mark.parametrize("command", kubectl.COMMANDS)
def test_kubectl_gpupool_takes_the_same_flags_as_gpupool(command: str) -> None:
    """`kubectl gpupool X` and `gpupool X` are one command line: the same flags, the same choices."""
    assert options(kubectl.PROG, kubectl.COMMANDS, command) == options("gpupool", tuple(SUBCOMMANDS), command)


@pytest.mark.parametrize(
    "command, formats",
    [
        ("explain", ("text", "json", "yaml")),
        ("inventory", ("table", "wide", "json", "yaml", "name")),
        ("quota", ("table", "json", "yaml")),
        ("version", ("text", "json", "yaml")),
    ],
)
def test_output_formats_are_kubectls(command: str, formats: tuple[str, ...]) -> None:
    """`-o` takes kubectl's names for the formats each command can print; a table comes with --no-headers."""
    found = options("gpupool", tuple(SUBCOMMANDS), command)
    assert found["-o"] == found["--output"] == formats
    assert ("--no-headers" in found) == ("table" in formats)


# --- as a process -----------------------------------------------------------------------------------------


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`gpupool inventory -o yaml | head -1`: the pipe closes under the command, which exits quietly."""
    with subprocess.Popen(
        [sys.executable, "-m", "webhook", "inventory", "--inventory", INVENTORY, "--policy", POLICY, "-o", "yaml"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the command writes a byte: every write it makes fails
        err = proc.stderr.read().decode()
        proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141  # as a shell reports a command ended by SIGPIPE
