"""The package's module structure: no import circles, every module importable on its own, and every op declared
by the module the op list names (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import jax_aiter
from jax_aiter import _backend

PACKAGE_DIR = Path(jax_aiter.__file__).resolve().parent


def _module_names() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The jax_aiter modules ``module`` imports, at any depth of its code. ``from p import name`` counts as an
    import of ``p.name`` when that is a module, else of ``p``; relative imports are resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != module)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return result


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    modules = _module_names()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    assert "jax_aiter._backend" in graph["jax_aiter.rmsnorm"]  # the parser sees `from jax_aiter import _backend`
    assert _cycles(graph) == []


def test_implementation_modules_are_leaves():
    """ref, native and aiter modules (and the attention implementations) never import an op module."""
    modules = _module_names()
    op_modules = set(_backend.OPS.values()) | {"jax_aiter.gemm_fp4._gemm", "jax_aiter.gemm_fp4._quantize",
                                                "jax_aiter.mha.attention"}
    leaves = [name for name in modules if name.startswith(("jax_aiter.ref", "jax_aiter.native", "jax_aiter.aiter"))]
    leaves += ["jax_aiter.mha._aiter", "jax_aiter.mha._cudnn"]
    assert "jax_aiter.native.rmsnorm" in leaves
    for name in leaves:
        assert not (_imports(modules[name], name, modules) & op_modules), name


# Third-party packages of optional extras: a module that needs one may fail to import without it (jax_aiter.flax
# and jax_aiter.maxtext name the extra to install), and must import when it is there.
OPTIONAL_DEPENDENCIES = ("flax", "maxtext")


def test_every_module_imports_on_its_own():
    """Each module imported first, in a process where no other jax_aiter module was imported before it."""
    names = sorted(_module_names())
    code = (
        "import importlib, importlib.util, json, sys\n"
        "failures = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    for loaded in [m for m in sys.modules if m == 'jax_aiter' or m.startswith('jax_aiter.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as err:\n"
        "        optional = importlib.util.find_spec((err.name or '').partition('.')[0] or '_') is None\n"
        f"        if not (optional and (err.name or '').partition('.')[0] in {OPTIONAL_DEPENDENCIES!r}):\n"
        "            failures[name] = f'{type(err).__name__}: {err}'\n"
        "    except Exception as err:\n"
        "        failures[name] = f'{type(err).__name__}: {err}'\n"
        "print(json.dumps(failures))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True,
                         cwd=Path(__file__).parent, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("op", sorted(_backend.OPS))
def test_op_list_names_the_declaring_module(op):
    import importlib

    importlib.import_module(_backend.OPS[op])
    assert op in _backend.defined_ops()
    assert _backend.implementations(op)[-1].name == "xla"
