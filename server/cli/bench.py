"""``wafervox bench NAME``: run a benchmark script from a source checkout's ``bench/``.

Benchmarks are not part of the installed package (the product never imports them): they are
found in ``--dir``, else in ``bench/`` under the current directory or one of its parents.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .common import CLIError


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="run a benchmark from a checkout's bench/ (e.g. decode)",
                       description="Run bench/NAME.py of the source checkout with this interpreter; extra arguments are "
                                   "passed on. The checkout is the current directory or one above it (or --dir).")
    b.add_argument("--dir", default=None, metavar="DIR", help="the bench/ folder (default: bench/ of the checkout you are in)")
    b.add_argument("name", help="benchmark name, e.g. decode")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    b.set_defaults(func=run)


def find_bench(explicit: str | None) -> Path:
    if explicit:
        d = Path(explicit)
        if not d.is_dir():
            raise CLIError(f"--dir {explicit}: no such folder")
        return d
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "bench").is_dir() and (d / "pyproject.toml").is_file():
            return d / "bench"
    raise CLIError("no bench/ folder here: run from the wafervox source checkout, or give --dir")


def run(args) -> int:
    bench = find_bench(args.dir)
    script = bench / f"{args.name}.py"
    if not script.exists():
        names = sorted(p.stem for p in bench.glob("*.py") if not p.stem.startswith("_"))
        raise CLIError(f"no benchmark {args.name!r} (have: {', '.join(names) or 'none'})")
    return subprocess.call([sys.executable, str(script), *args.rest], cwd=bench.parent)
