#!/usr/bin/env python3
"""Fail when a function in any ``packages/*/src`` is longer than the house limit (80 lines).

    python3 tools/check_code_shape.py [--root DIR] [--max-lines 80] [--allow FILE]

A function's length runs from its ``def`` line to its last line (decorators excluded, its
docstring and nested functions included); methods and nested functions are checked on their own
too and named by their qualified name (``Class.method``, ``outer.<locals>.inner``).

The allow-list (``tools/code_shape_allowlist.txt``) names functions that may exceed the limit
for now, one ``path/from/root.py:qualname`` a line, ``#`` comments allowed. It is for a known
debt with an owner, never a place to park new code: an entry whose function no longer exceeds
the limit (or no longer exists) is an error too, so the list only shrinks.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 80
ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = Path(__file__).resolve().with_name("code_shape_allowlist.txt")


@dataclass(frozen=True)
class Function:
    path: str  # relative to the root, with forward slashes
    qualname: str
    line: int
    length: int

    @property
    def key(self) -> str:
        return f"{self.path}:{self.qualname}"


def functions_in(source: str, path: str) -> Iterator[Function]:
    """Every function and method of one module, with its length in lines."""
    tree = ast.parse(source, filename=path)

    def walk(node: ast.AST, prefix: str) -> Iterator[Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                end = child.end_lineno or child.lineno
                yield Function(path, qualname, child.lineno, end - child.lineno + 1)
                yield from walk(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("packages/*/src/**/*.py") if p.is_file())


def read_allowlist(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    entries = set()
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.add(line)
    return entries


def check(root: Path, max_lines: int = MAX_LINES, allowed: set[str] | None = None) -> list[str]:
    """Problems found under ``root``: each function over ``max_lines`` not allowed, and each
    allow-list entry that is not (or no longer) a function over the limit."""
    allowed = set(allowed or ())
    problems: list[str] = []
    long_ones: set[str] = set()
    for file in source_files(root):
        relative = file.relative_to(root).as_posix()
        try:
            found = list(functions_in(file.read_text(encoding="utf-8"), relative))
        except SyntaxError as exc:
            problems.append(f"{relative}: cannot parse: {exc}")
            continue
        for function in found:
            if function.length <= max_lines:
                continue
            long_ones.add(function.key)
            if function.key not in allowed:
                problems.append(
                    f"{function.path}:{function.line}: {function.qualname} is {function.length} lines "
                    f"(limit {max_lines}): split it"
                )
    for entry in sorted(allowed - long_ones):
        problems.append(f"allow-list entry {entry!r} is not a function over {max_lines} lines any more: remove it")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES, help="longest function allowed")
    parser.add_argument("--allow", type=Path, default=ALLOWLIST, help="allow-list file")
    args = parser.parse_args(argv)
    problems = check(args.root.resolve(), args.max_lines, read_allowlist(args.allow))
    for problem in problems:
        print(f"check_code_shape: {problem}", file=sys.stderr)
    count = len(source_files(args.root.resolve()))
    print(f"check_code_shape: {count} files, {len(problems)} problem(s) (functions <= {args.max_lines} lines)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
