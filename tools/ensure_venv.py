"""Create or update the virtualenv once, however many `make` runs ask for it at the same time.

`make run & make test` on a fresh clone used to start two `python -m venv .venv` at once; one then ran
pip in a virtualenv the other had only half made ("No module named pip"). Every target that needs the
virtualenv runs this instead: it takes an exclusive lock (a file next to the virtualenv, which must not
be inside it: `venv --clear` empties that directory), and under the lock checks again whether another
run has finished the job meanwhile, so the second run waits and then finds nothing to do.

    python3 tools/ensure_venv.py .venv --stamp .venv/.installed-stamp --after pyproject.toml -- -e '.[dev]'

A virtualenv without a working pip (an interrupted run) is made again from scratch. Standard library
only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import fcntl
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def up_to_date(stamp: Path, inputs: Sequence[Path]) -> bool:
    """The stamp exists and is newer than every input (as make would judge it)."""
    try:
        made = stamp.stat().st_mtime_ns
    except FileNotFoundError:
        return False
    return all(made >= p.stat().st_mtime_ns for p in inputs)


def has_pip(python: Path) -> bool:
    if not python.exists():
        return False
    done = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, check=False)
    return done.returncode == 0


def ensure(directory: Path, stamp: Path, inputs: Sequence[Path], pip_args: Sequence[str]) -> bool:
    """Make `directory` a virtualenv with `pip install pip_args` done, unless the stamp says it is;
    True when this call did the work."""
    lock_path = directory.with_name(directory.name + ".lock")
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another make to finish setting up {directory} ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if up_to_date(stamp, inputs):
            return False
        python = directory / "bin" / "python"
        if not has_pip(python):
            print(f"creating {directory}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(directory)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", *pip_args], check=True)
        stamp.touch()
        return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ensure_venv.py", usage="ensure_venv.py DIR --stamp FILE [--after FILE] -- PIP_ARGS..."
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--stamp", type=Path, required=True, help="touched once the install is done")
    parser.add_argument("--after", type=Path, action="append", default=[], help="an input the stamp must be newer than")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pip_args = argv[split + 1 :]  # after --: what `pip install` gets, options included
    try:
        ensure(args.directory, args.stamp, args.after, pip_args)
    except subprocess.CalledProcessError as exc:
        print(
            f"ensure_venv.py: `pip install {' '.join(pip_args)}` failed with exit code {exc.returncode}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
