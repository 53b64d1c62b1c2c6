"""Every step function compiles once per run, fresh or resumed, before the loop, each with a
``compile`` event: XLA's compilations are counted from JAX's own compile log
(``JAX_LOG_COMPILES``) of ``titan train`` in a process of its own."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli_args, events, small_run

pytestmark = pytest.mark.slow

STEP_FUNCTIONS = {"jit(_step)": "train_step", "jit(_finite_and_digest)": "finite_check"}  # -> what
COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ")


def _train_counting_compilations(*args: str) -> collections.Counter:
    """Run ``titan train args`` in its own process; XLA compilations by function name."""
    env = {**os.environ, "JAX_LOG_COMPILES": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "titan.cli", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return collections.Counter(COMPILED.findall(done.stderr))


def _attempts(run_dir: Path) -> list[list[dict]]:
    """The run's records, one list per attempt (from each ``run_start`` on)."""
    attempts: list[list[dict]] = []
    for event in events(run_dir):
        if event["type"] == "run_start":
            attempts.append([])
        if attempts:
            attempts[-1].append(event)
    return attempts


def test_each_step_function_compiles_once_before_the_loop_fresh_and_on_resume(corpus_dir, tmp_path):
    options = small_run(corpus_dir, tmp_path, steps=3, checkpoint_every=1, dp=2, run_id="once")
    run_dir = tmp_path / "once"
    fresh = _train_counting_compilations(*cli_args(options))  # a save after every step
    resumed = _train_counting_compilations("--resume", str(run_dir), "--steps", "5")
    for counts in (fresh, resumed):
        assert {name: counts[name] for name in STEP_FUNCTIONS} == dict.fromkeys(STEP_FUNCTIONS, 1)
    attempts = _attempts(run_dir)
    assert len(attempts) == 2
    for attempt in attempts:
        types = [e["type"] for e in attempt]
        compiles = [e for e in attempt if e["type"] == "compile"]
        assert [(e["what"], e.get("reason")) for e in compiles] == [
            (what, None) for what in STEP_FUNCTIONS.values()
        ]
        last_compile = max(i for i, t in enumerate(types) if t == "compile")
        assert last_compile < types.index("step") and types.count("checkpoint") >= 2
