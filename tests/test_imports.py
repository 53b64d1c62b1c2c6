"""Module boundaries: every module imports on its own, titan imports titan only at module level,
and the light engine modules (planner, run summaries, config) stay free of JAX and Textual."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("titan", "tui")
# Function-local imports of titan modules that are accepted, as
# {"titan/<file>.py:<function>": "<import statement>"}, each with a comment saying why. An import
# inside a function to dodge a cycle is a design bug (docs/architecture.md, "Packages"); the
# entries here are the subcommands' own implementations, deferred so that ``titan --help`` and
# every other subcommand start without importing JAX. Third-party imports inside functions
# (jax, pynvml, ...) are not flagged: deferring a heavy or optional library is allowed.
ALLOWED_LOCAL_TITAN_IMPORTS: dict[str, str] = {
    # the training entry imports JAX, flax, optax and orbax
    "titan/trainer/commands.py:run": "from titan.trainer.train import train_from_cli",
    # sampling a diffusion run imports JAX and the trainer
    "titan/trainer/sample_command.py:run": "from titan.trainer.sampling import write_sample_grid",
    # Hugging Face import and export read checkpoints with JAX and orbax
    "titan/trainer/import_export_commands.py:run_import": (
        "from titan.trainer import hf_checkpoints"
    ),
    "titan/trainer/import_export_commands.py:run_export": (
        "from titan.trainer import hf_checkpoints"
    ),
    # generation imports JAX, flax and orbax
    "titan/generation/commands.py:run": (
        "from titan.generation.generate import Sampling, generate_from_cli"
    ),
    # the conformance harness imports JAX and every provider
    "titan/ops/commands.py:run": "from titan.ops import conformance",
    # run summaries and the performance database import DuckDB; reports also matplotlib
    "titan/observability/commands.py:run_summarize": "from titan.observability import summarize",
    "titan/observability/commands.py:run_perf_check": (
        "from titan.observability import perfdb, summarize"
    ),
    "titan/observability/commands.py:run_report": (
        "from titan.observability.report import write_report"
    ),
    # the MaxText checkpoint converter imports JAX and orbax
    "titan/trainer/maxtext_commands.py:run_import": (
        "from titan.trainer.maxtext_import import import_maxtext"
    ),
    "titan/trainer/maxtext_commands.py:run_export": (
        "from titan.models.adapters.maxtext_checkpoints import export_run"
    ),
}
# What importing a light module must leave out of sys.modules: JAX and the libraries built on it,
# and the console (docs/architecture.md: the engine never imports the console).
HEAVY_ROOTS = frozenset({"jax", "jaxlib", "flax", "optax", "orbax", "textual", "tui"})
LIGHT_MODULES = (
    "titan.planning",
    "titan.observability.summarize",
    "titan.config",
    "titan.parallel.fit",
)


def module_names() -> list[str]:
    """Dotted names of every module and package under titan/ and tui/."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` from the checkout, with titan and tui importable."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )


# For each module: forget every titan/tui module, then import that one alone. Third-party modules
# stay loaded (importing JAX once keeps the run short); a titan module that works only when
# another titan module was imported first fails here.
IMPORT_EACH = """
import importlib, json, sys, traceback
failures = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("titan", "tui")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as err:
        failures[name] = traceback.format_exception_only(type(err), err)[-1].strip()
print(json.dumps(failures))
"""


def test_every_module_imports_on_its_own():
    names = module_names()
    assert {"titan", "titan.cli", "tui.app"} <= set(names)
    proc = run_python(IMPORT_EACH, json.dumps(names))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {}


class _LocalImports(ast.NodeVisitor):
    """Imports of titan modules (relative ones included) inside functions and methods, as
    (``<file>:<qualified function>``, statement); module- and class-level imports are not."""

    def __init__(self, where: str) -> None:
        self.where, self.scope, self.functions, self.found = where, [], 0, []

    def _enter(self, node: ast.AST, is_function: bool) -> None:
        self.scope.append(node.name)
        self.functions += is_function
        self.generic_visit(node)
        self.functions -= is_function
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._enter(node, False)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._enter(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._record(alias.name, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        names = ", ".join(alias.name for alias in node.names)
        self._record(module, f"from {module} import {names}")

    def _record(self, module: str, statement: str) -> None:
        if self.functions and (module.startswith(".") or module.split(".")[0] == "titan"):
            self.found.append((f"{self.where}:{'.'.join(self.scope)}", statement))


def local_titan_imports(path: Path) -> list[tuple[str, str]]:
    """(``<file>:<function>``, import statement) for each titan import inside a function."""
    visitor = _LocalImports(path.relative_to(ROOT).as_posix())
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return visitor.found


def test_local_import_finder_flags_titan_imports_in_functions_only():
    source = (
        "import titan.config\nimport jax\n"
        "class A:\n    from titan import errors\n"
        "    def f(self):\n        import jax.numpy\n        from titan.ops import registry\n"
        "def g():\n    def h():\n        from . import x\n    import titan\n"
    )
    visitor = _LocalImports("m.py")
    visitor.visit(ast.parse(source))
    assert visitor.found == [
        ("m.py:A.f", "from titan.ops import registry"),
        ("m.py:g.h", "from . import x"),
        ("m.py:g", "import titan"),
    ]


def test_titan_imports_titan_modules_only_at_module_level():
    flagged = [
        f"{where}: {statement}"
        for path in sorted((ROOT / "titan").rglob("*.py"))
        for where, statement in local_titan_imports(path)
        if ALLOWED_LOCAL_TITAN_IMPORTS.get(where) != statement
    ]
    assert flagged == [], "\n".join(flagged)


@pytest.mark.parametrize("name", LIGHT_MODULES)
def test_light_modules_import_neither_jax_nor_textual(name: str):
    proc = run_python(
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(' '.join({m.split('.')[0] for m in sys.modules}))",
        name,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(HEAVY_ROOTS & set(proc.stdout.split())) == []
