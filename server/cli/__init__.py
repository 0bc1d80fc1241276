"""``wafervox``: the command line.  One module per command, each a thin adapter over a package:
``generate`` (decode), ``run`` / ``mic`` (voice), ``serve`` / ``client`` (server), ``sim`` (wafer),
``bench``; ``common`` holds the engine loader, the voice flags and the one error type.

``main`` turns our own errors into one line and exit code 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import bench, client, generate, mic, run, serve, sim
from .common import EXIT_USAGE, CLIError

__all__ = ["CLIError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wafervox",
        description="A real-time voice agent with a numba LLM decode core on a simulated wafer-scale pipeline.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in (generate, run, mic, serve, client, sim, bench):
        command.add_parser(sub)
    return p


def _our_errors() -> tuple[type[BaseException], ...]:
    from decode.errors import DecodeError
    from voice.audio import AudioError
    from voice.errors import EngineError
    from voice.llm import PersonaError
    from wafer.placement import PlacementError
    from wafer.specs import CatalogueError

    return CLIError, DecodeError, AudioError, EngineError, PersonaError, CatalogueError, PlacementError


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    ours = _our_errors()
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ours as exc:
        print(f"wafervox: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
