"""Entry point of the ``sdkit`` console script.

Each subcommand is a module ``sdkit.cli.<name>`` with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Errors a user can cause are ``SdkitError``s: one line, exit code 1.

Other distributions add subcommands through the entry-point group ``sdkit.cli``: the entry's name
is the command, its value a module with the same three names (``serve = "sdkit_serve.cli"`` in
sdkit-serve). That module is imported to build the parser, so it must import nothing heavy at
module level (its ``run`` imports the server stack). A command that fails to import is still
listed; running it prints why, in one line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from types import ModuleType
from typing import Any

from sdkit import known_backends
from sdkit._version import __version__
from sdkit.errors import SdkitError

COMMANDS = (
    "backends", "devices", "check", "run", "bench", "tune", "generate", "upscale", "restore-faces", "merge", "inspect",
    "doctor",
)  # fmt: skip
PLUGIN_GROUP = "sdkit.cli"


def _command_module(name: str) -> ModuleType | None:
    module = f"sdkit.cli.{name.replace('-', '_')}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None  # a command whose module is not part of this build
        raise


class _BrokenCommand:
    """Stands in for a plugin command whose module failed to import: listed, and says why when run."""

    def __init__(self, name: str, distribution: str, error: BaseException) -> None:
        self.HELP = f"(unavailable: {type(error).__name__}: {error})"
        self._message = f"the {name!r} command of {distribution} failed to load: {type(error).__name__}: {error}"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.set_defaults(_any_arguments=True)  # its real options are unknown: say why it failed instead

    def run(self, args: argparse.Namespace) -> int:
        raise SdkitError(self._message)


def plugin_commands() -> dict[str, Any]:
    """Subcommands from the ``sdkit.cli`` entry-point group; built-in names win."""
    commands: dict[str, Any] = {}
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name in COMMANDS or entry.name in commands:
            continue
        distribution = entry.dist.name if entry.dist is not None else "a plugin"
        try:
            commands[entry.name] = entry.load()
        except Exception as exc:  # a broken plugin must not take the whole CLI down
            commands[entry.name] = _BrokenCommand(entry.name, distribution, exc)
    return commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdkit",
        description="Run Stable-Diffusion-class ONNX models on the best backend of this machine.",
    )
    parser.add_argument("--version", action="version", version=f"sdkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, Any] = {name: _command_module(name) for name in COMMANDS}
    modules.update(plugin_commands())
    for name, module in modules.items():
        if module is None:
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def _missing_command(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """The error for a subcommand that another distribution adds and this environment lacks."""
    command = next((arg for arg in argv if not arg.startswith("-")), "")
    extra = known_backends.EXTRA_COMMANDS.get(command)
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if extra is None or any(command in action.choices for action in actions):
        return ""
    return f"'sdkit {command}' needs the {extra} extra: {known_backends.install_command(extra)}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    missing = _missing_command(parser, sys.argv[1:] if argv is None else argv)
    if missing:
        print(f"sdkit: error: {missing}", file=sys.stderr)
        return 1
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 1
    try:
        return int(args._run(args) or 0)
    except SdkitError as exc:
        print(f"sdkit: error: {exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # what the budget's estimates missed: still the user's request
        print(
            f"sdkit: error: out of memory ({exc or 'no detail'}); ask for less, or set SDKIT_MEMORY_BUDGET",
            file=sys.stderr,
        )
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
