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

ROOT = Path(__file__).parents[2]
PACKAGES = ("titan", "tui")
# Function-local imports of titan modules that are accepted, as
# {"titan/<file>.py:<function>": "<import statement>"}, each with a comment saying why. An import
# inside a function to dodge a cycle is a design bug (docs/architecture.md, "Packages"); the
# entries here are the subcommands' own implementations, deferred so that ``titan --help`` and
# every other subcommand start without importing JAX. Third-party imports inside functions
# (jax, pynvml, ...) are not flagged: deferring a heavy or optional library is allowed.
ALLOWED_LOCAL_TITAN_IMPORTS: dict[str, str] = {
    # the training entry imports JAX, flax, optax and orbax
    "titan/commands/train.py:run": "from titan.trainer.train import train_from_cli",
    # --print-config checks the layer split, whose module imports JAX
    "titan/commands/train.py:_print_config": (
        "from titan.trainer.config_checks import check_without_devices"
    ),
    # sampling a diffusion run imports JAX and the trainer
    "titan/commands/sample.py:run": "from titan.trainer.image_samples import write_sample_grid",
    # Hugging Face import and export read checkpoints with JAX and orbax
    "titan/commands/import_export.py:run_import": ("from titan.checkpoint import hf_checkpoints"),
    "titan/commands/import_export.py:run_export": ("from titan.checkpoint import hf_checkpoints"),
    # generation imports JAX, flax and orbax
    "titan/commands/generate.py:run": (
        "from titan.generation.generate import Sampling, generate_from_cli"
    ),
    # the conformance harness imports JAX and every provider
    "titan/commands/ops.py:run": "from titan.ops import conformance",
    # run summaries and the performance database import DuckDB; reports also matplotlib
    "titan/commands/summarize_perf_report.py:run_summarize": "from titan.analysis import summarize",
    "titan/commands/summarize_perf_report.py:run_perf_check": (
        "from titan.analysis import perfdb, summarize"
    ),
    "titan/commands/summarize_perf_report.py:run_report": (
        "from titan.analysis.report import write_report"
    ),
    # the MaxText checkpoint converter imports JAX and orbax
    "titan/commands/import_export_maxtext.py:run_import": (
        "from titan.checkpoint.maxtext_import import import_maxtext"
    ),
    "titan/commands/import_export_maxtext.py:run_export": (
        "from titan.models.adapters.maxtext_checkpoints import export_run"
    ),
}
# What importing a light module must leave out of sys.modules: JAX and the libraries built on it,
# and the console (docs/architecture.md: the engine never imports the console).
HEAVY_ROOTS = frozenset({"jax", "jaxlib", "flax", "optax", "orbax", "textual", "tui"})
LIGHT_MODULES = (
    "titan.planning",
    "titan.analysis.summarize",
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


@pytest.mark.slow
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


# Who may not import whom (docs/architecture.md, "Packages"): the run's write side never reads
# the analysis, the planner, the layouts, the checkpoints, the trainer or the console; the
# layouts sit below the checkpoints, which sit below the trainer; the commands (titan.commands)
# sit on top, below the console alone; the ground facts import only the ground floor
# (titan/errors.py and the like) and each other.
FORBIDDEN_IMPORTS = {
    "titan/telemetry": (
        "titan.analysis",
        "titan.planning",
        "titan.checkpoint",
        "titan.layouts",
        "titan.trainer",
        "titan.commands",
        "tui",
    ),
    "titan/planning": (
        "titan.analysis",
        "titan.telemetry",
        "titan.layouts",
        "titan.checkpoint",
        "titan.trainer",
        "titan.commands",
        "tui",
    ),
    "titan/checkpoint": (
        "titan.analysis",
        "titan.generation",
        "titan.trainer",
        "titan.commands",
        "tui",
    ),
    "titan/layouts": (
        "titan.analysis",
        "titan.checkpoint",
        "titan.generation",
        "titan.trainer",
        "titan.commands",
        "tui",
    ),
    **{
        folder: ("titan.commands", "tui")
        for folder in (
            "titan/trainer",
            "titan/generation",
            "titan/analysis",
            "titan/launch",
        )
    },
    # the bottom floor: operators import no room above them (the command passes them figures)
    "titan/ops": (
        "titan.telemetry",
        "titan.analysis",
        "titan.planning",
        "titan.models",
        "titan.parallel",
        "titan.checkpoint",
        "titan.layouts",
        "titan.trainer",
        "titan.generation",
        "titan.commands",
        "tui",
    ),
}
GROUND_FACTS = ("titan/schedules.py", "titan/gpus.py", "titan/flops.py", "titan/formatting.py")
GROUND_FLOOR = ("titan.errors", "titan.remat", "titan.shapes", "titan.parsing")


def imported_modules(path: Path) -> set[str]:
    """Every module named by an import statement of ``path`` (``from a import b``: ``a`` and
    ``a.b``), at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in roots)


def boundary_breaks(root: Path = ROOT) -> list[str]:
    """``<file>: <module>`` for each import that crosses a line of :data:`FORBIDDEN_IMPORTS` or
    lifts a ground fact (:data:`GROUND_FACTS`) off the ground floor."""
    breaks = []
    for folder, forbidden in FORBIDDEN_IMPORTS.items():
        for path in sorted((root / folder).rglob("*.py")):
            breaks += [
                f"{path.relative_to(root).as_posix()}: {module}"
                for module in sorted(imported_modules(path))
                if _within(module, forbidden)
            ]
    facts = tuple(f.removesuffix(".py").replace("/", ".") for f in GROUND_FACTS)
    for fact in GROUND_FACTS:
        path = root / fact
        breaks += [
            f"{fact}: {module}"
            for module in sorted(imported_modules(path))
            if _within(module, ("titan", "tui")) and not _within(module, GROUND_FLOOR + facts)
        ]
    return breaks


def test_telemetry_the_planner_and_the_ground_facts_import_nothing_above_them():
    assert boundary_breaks() == []


def test_the_boundary_check_catches_an_upward_import(tmp_path):
    for folder in ("titan/telemetry", "titan/planning"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "titan/telemetry/records.py").write_text("from titan.analysis import summarize\n")
    (tmp_path / "titan/planning/step.py").write_text("import titan.telemetry.events\n")
    for fact in GROUND_FACTS:
        (tmp_path / fact).write_text("from titan.errors import TitanError\n")
    (tmp_path / "titan/gpus.py").write_text("from titan.planning.memory import Layout\n")
    assert boundary_breaks(tmp_path) == [
        "titan/telemetry/records.py: titan.analysis",
        "titan/telemetry/records.py: titan.analysis.summarize",
        "titan/planning/step.py: titan.telemetry.events",
        "titan/gpus.py: titan.planning.memory",
        "titan/gpus.py: titan.planning.memory.Layout",
    ]
