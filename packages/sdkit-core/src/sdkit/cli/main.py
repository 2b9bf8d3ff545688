"""Entry point of the ``sdkit`` console script.

Each subcommand is a module ``sdkit.cli.<name>`` with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Errors a user can cause are ``SdkitError``s: one line, exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from sdkit._version import __version__
from sdkit.errors import SdkitError

COMMANDS = ("backends", "devices", "check", "run", "bench", "generate", "inspect", "doctor")


def _command_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"sdkit.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"sdkit.cli.{name}":
            return None  # a command whose module is not part of this build
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdkit",
        description="Run Stable-Diffusion-class ONNX models on the best backend of this machine.",
    )
    parser.add_argument("--version", action="version", version=f"sdkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _command_module(name)
        if module is None:
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 1
    try:
        return int(args._run(args) or 0)
    except SdkitError as exc:
        print(f"sdkit: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("sdkit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in sdkit or a plugin: still one line, traceback on request
        if os.environ.get("SDKIT_DEBUG"):
            raise
        print(
            f"sdkit: internal error: {type(exc).__name__}: {exc} (set SDKIT_DEBUG=1 for a traceback)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
