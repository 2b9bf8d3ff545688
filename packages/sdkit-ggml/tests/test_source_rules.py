"""House rules for ``src/sdkit_ggml``, checked on the source (ast, nothing imported): no function
over 80 lines, modules under 400 lines, and the package's layers (README "Layers"): a module
imports only from its own layer or the ones below, and no import circles. Imports inside
functions and under TYPE_CHECKING count too."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sdkit_ggml"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
# Top to bottom; the same list as the import-linter "layers" contract in the README.
LAYERS = [
    "sdkit_ggml.hooks",
    "sdkit_ggml.backend",
    "sdkit_ggml.conv_tuning",
    "sdkit_ggml.compiled",
    "sdkit_ggml.converter_plugins",
    "sdkit_ggml.hookspecs",
    "sdkit_ggml.converters",
    "sdkit_ggml.compiler",
    "sdkit_ggml.runtime",
    "sdkit_ggml._version",
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path) -> set[str]:
    """The sdkit_ggml modules ``module`` imports (a package name stands for its __init__)."""
    known = _modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(name for name in names if name in known and name != module)
    return found


def _layer(module: str) -> int | None:
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    return None


def test_no_function_over_80_lines() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - start + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_modules_stay_small() -> None:
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in _modules().items()}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_every_module_is_in_a_layer_and_imports_only_downwards() -> None:
    upward = []
    for module, path in _modules().items():
        if module == "sdkit_ggml":
            continue  # the package's __init__: the version only
        layer = _layer(module)
        assert layer is not None, f"{module} is in no layer"
        for imported in _imports(module, path):
            if imported != "sdkit_ggml" and (_layer(imported) or 0) < layer:
                upward.append(f"{module} imports {imported}")
    assert not upward, upward


def test_no_import_circles() -> None:
    graph = {module: _imports(module, path) for module, path in _modules().items()}
    state: dict[str, str] = {}
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                cycles.append(" -> ".join([*stack[stack.index(imported) :], imported]))
            elif imported not in state:
                visit(imported, [*stack, imported])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles
