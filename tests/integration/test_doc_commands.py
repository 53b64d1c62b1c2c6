"""Every command of the README and docs/ runs as written.

The commands are the lines of the fenced blocks without a language (``text`` blocks are
diagrams, ``python`` blocks code), in the order the pages give them, each in one scratch
directory that holds what the pages name (``corpus.jsonl``, ``web/``, ``photos/``, ``examples/``,
a copy of ``sample_runs/``). Only the step counts shrink: a ``titan train`` runs at most
:data:`STEPS` steps (or to the end of its ``--profile-steps``), a resume :data:`STEPS` more than
its run did; ``runs/<run id>`` is the run that the page's last ``titan train`` made. A command
whose comment says ``exits N`` must exit N, every other one 0. What cannot run here is listed in
:data:`SKIPPED`, with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zstandard
from PIL import Image

from titan.data.mixture import open_sources, union_corpus
from titan.data.tokenizer import train_tokenizer

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STEPS = 3
TIMEOUT_S = 590  # under the suite's per-test timeout

# Commands that cannot run in the test suite, by their first words, and why.
SKIPPED = {
    ("python3", "-m", "venv"): "sets up the environment the suite already runs in",
    ("pip",): "installs packages: the suite's environment has every extra but [maxtext]",
    (".venv/bin/pip",): "installs packages: the suite's environment has them",
    (".venv/bin/ruff",): "lints the checkout: CI's own step (.ci/run)",
    (".venv/bin/mypy",): "type-checks the checkout: CI's own step (.ci/run)",
    ("titan", "import", "hf", "Llama-3.2-1B"): "needs Llama 3.2 1B's weights from the Hub",
    ("titan", "train", "--init-from", "llama-1b"): "needs Llama 3.2 1B's weights from the Hub",
    ("titan", "import", "maxtext"): "needs a MaxText checkpoint and the [maxtext] extra",
    ("titan", "export", "maxtext"): "needs the [maxtext] extra (Python 3.12+)",
    ("titan", "train", "--model-source", "maxtext"): "needs the [maxtext] extra (Python 3.12+)",
    ("titan-console",): "an interactive terminal app: tests/console/ drive it",
    ("python", "-m", "tui.app"): "an interactive terminal app: tests/console/ drive it",
    ("sbatch",): "needs a SLURM cluster",
    ("kubectl",): "needs a Kubernetes cluster with JobSet",
    ("titan", "ops", "check", "--op", "rms_norm", "--provider", "example"): (
        "needs the example provider that docs/operators.md writes"
    ),
    ("titan", "train", "--ops", "rms_norm=example"): (
        "needs the example provider that docs/operators.md writes"
    ),
}
RUNS_THE_SUITE = ".venv/bin/python -m pytest"
RUN_ID = "<run-id>"  # the pages' <run id>, one word


@dataclass(frozen=True)
class Command:
    """One command of a page: where it is, its words, its environment prefix and exit code."""

    page: str
    line: int
    words: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    exits: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of each fenced block without a language."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if not match.group(1):
            blocks.append((text[: match.start()].count("\n") + 2, match.group(2)))
    return blocks


def commands(page: Path) -> list[Command]:
    """The commands of ``page``: a line each (a line ending in ``\\`` continues), split at
    ``&&``; ``export NAME=VALUE`` lines set the environment of the commands after them."""
    found, env = [], {}
    for first, body in _blocks(page.read_text()):
        text, start = "", 0
        for offset, line in enumerate(body.splitlines()):
            start = start if text else offset
            text += line.removesuffix("\\")
            if line.endswith("\\"):
                continue
            words = shlex.split(text.replace("<run id>", RUN_ID), comments=True)
            exits = re.search(r"#.*\bexits (\d+)", text)
            text = ""
            if words[:1] == ["export"]:
                env.update(word.split("=", 1) for word in words[1:])
                continue
            for part in _split_and(words):
                prefix = {**env}
                while part and re.fullmatch(r"[A-Z_]+=.*", part[0]):
                    prefix.update([part.pop(0).split("=", 1)])
                found.append(
                    Command(
                        page.relative_to(REPO).as_posix(),
                        first + start,
                        tuple(part),
                        tuple(prefix.items()),
                        int(exits[1]) if exits else 0,
                    )
                )
    return found


def _split_and(words: list[str]) -> list[list[str]]:
    parts = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


ALL = [command for page in PAGES for command in commands(page)]


def _skip_reason(command: Command) -> str | None:
    words = command.words
    if " ".join(words).startswith(RUNS_THE_SUITE):
        return "runs this test suite"
    for prefix, reason in SKIPPED.items():
        if words[: len(prefix)] == prefix:
            return reason
    return None


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> dict:
    """The scratch directory the pages' commands run in, with the files they name, and the
    run the last ``titan train`` made (``latest``)."""
    root = tmp_path_factory.mktemp("doc-commands")
    shutil.copytree(REPO / "examples", root / "examples")
    shutil.copytree(REPO / "sample_runs", root / "sample_runs")
    texts = [path.read_text() for path in sorted(corpus_dir.iterdir())]
    with (root / "corpus.jsonl").open("w") as out:
        out.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    (root / "web").mkdir()
    for i in range(2):
        lines = "".join(json.dumps({"text": text}) + "\n" for text in texts[i::2])
        (root / "web" / f"part-{i}.jsonl.zst").write_bytes(zstandard.compress(lines.encode()))
    (root / "code").mkdir()
    for path in sorted(corpus_dir.iterdir())[:6]:
        shutil.copyfile(path, root / "code" / path.name)
    rng = np.random.default_rng(0)
    for label in ("circles", "squares"):
        (root / "photos" / label).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "photos" / label / f"{i}.png")
    sources = open_sources(str(root / "corpus.jsonl"))
    tokenizer = train_tokenizer(union_corpus(str(root / "corpus.jsonl"), sources), 4096)
    (root / "tokenizer.model").write_bytes(tokenizer.model_proto)
    return {"root": root, "latest": None}


def _train_steps(words: list[str], root: Path) -> list[str]:
    """``titan train`` words with at most :data:`STEPS` steps (enough for ``--profile-steps``;
    a resume: :data:`STEPS` more than its run did)."""
    if "--help" in words or "--print-config" in words:
        return words
    steps = STEPS
    if "--profile-steps" in words:
        steps = max(steps, int(words[words.index("--profile-steps") + 1].split(":")[1]))
    if "--resume" in words:
        saved = json.loads((root / words[words.index("--resume") + 1] / "config.json").read_text())
        steps = saved["train"]["optimizer"]["steps"] + STEPS
    if "--steps" in words:
        at = words.index("--steps") + 1
        return [*words[:at], str(min(int(words[at]), steps)), *words[at + 1 :]]
    return [*words, "--steps", str(steps)]


def _argv(command: Command, root: Path, latest: str | None) -> list[str]:
    """What to run: ``titan`` as this interpreter's module, the run id filled in, steps cut."""
    words = [word.replace(RUN_ID, latest or "NO-RUN-YET") for word in command.words]
    words[0] = words[0].removeprefix(".venv/bin/")
    if "train" in words and words[0] == "titan":
        at = words.index("train")
        words = [*words[:at], *_train_steps(words[at:], root)]
    if words[0] == "titan":
        return [sys.executable, "-m", "titan.cli", *words[1:]]
    return words


@pytest.mark.slow
@pytest.mark.parametrize("command", ALL, ids=[c.id for c in ALL])
def test_documented_command_runs_as_written(command: Command, workspace: dict) -> None:
    reason = _skip_reason(command)
    if reason:
        pytest.skip(reason)
    root = workspace["root"]
    env = {**os.environ, **dict(command.env)}
    if "XLA_FLAGS" in dict(command.env):  # the suite's faster XLA:CPU compiles stay on
        env["XLA_FLAGS"] += f" {os.environ['XLA_FLAGS']}"
    runs = root / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    argv = _argv(command, root, workspace["latest"])
    redirect = argv.index(">") if ">" in argv else None  # COMMAND > FILE
    if redirect is not None:
        argv, target = argv[:redirect], root / argv[redirect + 1]
    done = subprocess.run(
        argv, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if redirect is not None:
        target.write_text(done.stdout)
    made = (set(runs.iterdir()) if runs.is_dir() else set()) - before
    if made:
        workspace["latest"] = max(made, key=lambda p: p.stat().st_mtime).name
    assert done.returncode == command.exits, (
        f"{' '.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_every_page_has_commands_and_every_skip_is_used():
    pages = {command.page for command in ALL}
    assert {"README.md", "docs/training.md", "docs/diffusion.md"} <= pages
    skipped = {prefix for prefix in SKIPPED for c in ALL if c.words[: len(prefix)] == prefix}
    assert skipped == set(SKIPPED)  # a skip whose command left the pages goes too
