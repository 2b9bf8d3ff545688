"""tools/check_code_shape.py: long functions found by name and length, the allow-list honoured
and kept honest, and this checkout passing."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_code_shape", TOOLS / "check_code_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


shape = _load()


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_lengths_and_qualified_names() -> None:
    source = textwrap.dedent(
        '''
        @decorator
        def top(a,
                b):
            """Doc."""
            def inner():
                return 1
            return inner

        class Thing:
            async def method(self):
                pass
        '''
    )
    found = {f.qualname: (f.line, f.length) for f in shape.functions_in(source, "m.py")}
    # from the def line to the last line; the decorator is not counted
    assert found == {
        "top": (3, 6),
        "top.<locals>.inner": (6, 2),
        "Thing.method": (11, 2),
    }


def test_a_function_over_the_limit_is_reported_with_its_place(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "packages/pkg/src/pkg/ok.py": _function("short", 79),  # 80 lines: the limit itself
            "packages/pkg/src/pkg/long.py": "import os\n\n\n" + _function("too_long", 80),  # 81 lines
            "packages/pkg/tests/test_long.py": _function("test_long", 200),  # tests are not checked
            "tools/long.py": _function("tool", 200),  # only packages/*/src
        },
    )
    problems = shape.check(root, 80, set())
    assert problems == ["packages/pkg/src/pkg/long.py:4: too_long is 81 lines (limit 80): split it"]


def test_methods_and_nested_functions_are_checked_on_their_own(tmp_path: Path) -> None:
    nested = "def outer() -> None:\n" + _function("inner", 90, indent="    ")
    method = "class Big:\n" + _function("method", 90, indent="    ")
    root = _tree(tmp_path, {"packages/p/src/p/a.py": nested, "packages/p/src/p/b.py": method})
    problems = "\n".join(shape.check(root, 80, set()))
    assert "outer is 92 lines" in problems
    assert "outer.<locals>.inner is 91 lines" in problems
    assert "Big.method is 91 lines" in problems


def test_allow_list_excuses_named_functions_and_stale_entries_fail(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"packages/p/src/p/a.py": _function("legacy", 100) + "\n" + _function("fine", 3)})
    allowlist = tmp_path / "allow.txt"
    allowlist.write_text("# owned by the ggml engineer\npackages/p/src/p/a.py:legacy  # temporary\n", encoding="utf-8")
    assert shape.check(root, 80, shape.read_allowlist(allowlist)) == []
    stale = {"packages/p/src/p/a.py:legacy", "packages/p/src/p/a.py:fine", "packages/p/src/p/gone.py:f"}
    problems = shape.check(root, 80, stale)
    assert len(problems) == 2
    assert all("not a function over 80 lines any more" in p for p in problems)


def test_command_line_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, {"packages/p/src/p/a.py": _function("long", 100)})
    empty = tmp_path / "none.txt"
    assert shape.main(["--root", str(root), "--allow", str(empty)]) == 1
    assert "long is 101 lines" in capsys.readouterr().err
    assert shape.main(["--root", str(root), "--allow", str(empty), "--max-lines", "120"]) == 0


def test_this_checkout_passes() -> None:
    """What ``python3 dev.py test`` runs: no function in packages/*/src over 80 lines, beyond the
    allow-list, and no stale allow-list entry."""
    assert shape.check(shape.ROOT, shape.MAX_LINES, shape.read_allowlist(shape.ALLOWLIST)) == []
