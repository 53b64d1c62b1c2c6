"""Small helpers shared by tests: run the trainer in-process or as a subprocess, read events."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orbax.checkpoint._src.path import atomicity

from titan.config import TrainConfig, validate_train_config
from titan.layouts.builders import build_run_trainer
from titan.layouts.contract import Trainer
from titan.ops import Ops
from titan.shapes import ModelConfig
from titan.trainer.train import train


def small_run(corpus_dir: Path, runs_root: Path, **options: Any) -> dict[str, Any]:
    """Options of a small float32 run on the test corpus (512-piece tokenizer, 8 x 32 tokens per
    step), with ``options`` (``steps`` among them) on top."""
    return {
        "data": str(corpus_dir),
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 8,
        "runs_root": str(runs_root),
        "compute_dtype": "float32",
        **options,
    }


def trainer_of(cfg: TrainConfig, shape: ModelConfig, ops: Ops) -> Trainer:
    """The trainer ``titan train`` builds for ``cfg`` and the model ``shape``."""
    return build_run_trainer(shape, ops, cfg.trainer)


def run_in_process(options: dict[str, Any], resume: Path | None = None) -> tuple[int, Path]:
    """Train in this process; returns (exit code, run dir)."""
    cfg = TrainConfig.of(**options)
    validate_train_config(cfg)
    code = train(cfg, resume)
    return code, Path(options["runs_root"]) / options["run_id"]


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    lines = (Path(run_dir) / "events.jsonl").read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    return [e for e in parsed if kind is None or e["type"] == kind]


def cli_args(options: dict[str, Any]) -> list[str]:
    args = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # a switch: --watchdog-abort / --no-watchdog-abort
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, str(value)]
    return args


def start_subprocess(options: dict[str, Any], *extra: str) -> subprocess.Popen:
    """``titan train`` in its own process (for signals)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "titan.cli", "train", *cli_args(options), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_event(run_dir: Path, predicate, timeout_s: float = 240) -> dict[str, Any]:
    """Poll the run's events until one satisfies ``predicate``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = Path(run_dir) / "events.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if predicate(event):
                    return event
        time.sleep(0.2)
    raise AssertionError(f"no matching event in {run_dir} within {timeout_s} s")


def file_tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind and, for a file, its content's digest (compares
    a dir byte for byte before and after)."""
    if not root.exists():
        return {}
    found = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode) else ""
        found[str(path.relative_to(root))] = (stat.S_IFMT(mode), digest)
    return found


def fail_checkpoint(monkeypatch, step: int, code: int, at: str = "finalize") -> None:
    """Make orbax's temporary folder of checkpoint ``step`` fail with OS error ``code`` at
    ``at``: ``"create"``, the folder's making (as a read-only file system does: before any array
    is written), or ``"finalize"``, its rename to the final name (in the background thread of an
    async save, in the save itself otherwise)."""
    real = getattr(atomicity.AtomicRenameTemporaryPath, at)

    async def failing(self):
        if self._final_path.name == str(step):
            path = self._tmp_path if at == "create" else self._final_path
            raise OSError(code, os.strerror(code), str(path))
        return await real(self)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, at, failing)
