"""Test setup: 8 forced CPU devices (before JAX starts), a private cache, a small real corpus,
and a marker per level folder.

XLA:CPU compiles at LLVM's cheapest optimisation level (``--xla_backend_optimization_level=0``),
here and in every process the tests start (they inherit ``XLA_FLAGS``): the tiny models and the
interpreted Pallas kernels then compile in about 60% of the time, which is most of the suite's
time; what they compute is the same.
"""

from __future__ import annotations

import os

TEST_XLA_FLAGS = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil  # noqa: E402
import sysconfig  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_MODULES = (
    "argparse.py",
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "fnmatch.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "operator.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
    "uuid.py",
)


TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test with the level folder its file is in (``tests/unit/...`` -> ``unit``), so
    ``-m`` selects levels together with ``slow``. A folder that is no marker registered in
    pyproject.toml fails the collection (``--strict-markers``); a test file outside a level folder
    raises :class:`pytest.UsageError`."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        if len(parts) < 2:
            raise pytest.UsageError(
                f"{item.path.name}: a test file goes in a level folder of tests/"
            )
        item.add_marker(parts[0])


@pytest.fixture(scope="session", autouse=True)
def titan_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tokenizers and token streams are cached per test session, not in the user's home."""
    cache = tmp_path_factory.mktemp("titan-cache")
    os.environ["TITAN_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of real text: 22 standard-library modules (about 0.9 MB)."""
    root = tmp_path_factory.mktemp("corpus")
    for name in CORPUS_MODULES:
        target = root / name.replace("/", "_")
        shutil.copyfile(STDLIB / name, target)
    return root


@pytest.fixture()
def small_options(corpus_dir: Path, tmp_path: Path) -> dict:
    """Options of a small, fast run on the test corpus (one device, float32)."""
    return {
        "data": str(corpus_dir),
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 8,
        "steps": 6,
        "warmup_steps": 2,
        "checkpoint_every": 3,
        "runs_root": str(tmp_path / "runs"),
        "dp": 1,
        "compute_dtype": "float32",
    }


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Iterator[Path]:
    """A real 2-step run with a checkpoint at step 2, shared by every test of a worker: read
    it, or copy it before changing it."""
    # deferred: it imports JAX, light tests need not
    from helpers import file_tree, run_in_process, small_run

    root = tmp_path_factory.mktemp("finished")
    options = small_run(corpus_dir, root, steps=2, checkpoint_every=2, dp=1, run_id="done")
    code, run_dir = run_in_process(options)
    assert code == 0
    before = file_tree(run_dir.parent)
    yield run_dir
    assert file_tree(run_dir.parent) == before, "a test changed the shared finished run"


# A small model for the eval and generation tests: 2 layers, one per pipeline stage.
EVAL_MODEL = "d_model=64,n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512"
EVAL_LAYOUTS = {
    "spmd": {"layout": "spmd", "dp": 1, "microbatches": 2},
    "mpmd": {"layout": "mpmd", "pp": 2, "dp": 1, "microbatches": 2},
}


def _eval_run(root: Path, corpus_dir: Path, layout: str) -> Path:
    """A real 5-step run holding out a quarter of the test corpus, evaluated after steps 2 and
    4, checkpointed at step 5 (its final one)."""
    from helpers import run_in_process, small_run  # deferred: it imports JAX

    options = small_run(
        corpus_dir,
        root,
        steps=5,
        checkpoint_every=5,
        run_id=layout,
        preset=EVAL_MODEL,
        eval_split=0.25,
        eval_every=2,
        eval_batches=2,
        **EVAL_LAYOUTS[layout],
    )
    code, run_dir = run_in_process(options)
    assert code == 0
    return run_dir


@pytest.fixture(scope="session")
def mpmd_eval_run(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """:func:`_eval_run` on 2 pipeline stages (shared by the eval and generation tests)."""
    return _eval_run(tmp_path_factory.mktemp("eval-mpmd"), corpus_dir, "mpmd")


@pytest.fixture(scope="session")
def spmd_eval_run(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """:func:`_eval_run` on one device, accumulating 2 microbatches."""
    return _eval_run(tmp_path_factory.mktemp("eval-spmd"), corpus_dir, "spmd")
