"""The command line: every option documented; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import titan
from titan.cli import build_parser, main
from titan.config import option_fields
from tui.app import main as console_main


def test_help_documents_every_option():
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    text = train_parser.format_help()
    for f in option_fields():
        assert f.metadata["flag"] in text
    assert "--resume" in text
    assert "(titan.diffusion.objectives, titan.data.images)" in text  # no Sphinx markup
    assert ":mod:" not in text and "``" not in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--preset", "gpt5"], "argument --preset: invalid choice"),
        (["--lr", "fast"], "argument --lr: invalid float value"),
        (["--tp", "3"], "--tp 3 (mesh axis 'tensor') does not divide"),
        (["--dp", "16"], "--dp 16 x --fsdp 1 x --tp 1 = 16 devices asked, 8 present"),
        (["--dp", "4", "--batch-size", "6"], "--batch-size 6 is not a multiple of dp x fsdp"),
        (["--data", "/no/such/corpus"], "--data /no/such/corpus: no such file or directory"),
        (["--tokenizer", "/no/such.model"], "--tokenizer /no/such.model: no such file"),
        (["--run-id", "../escape"], "--run-id must be a plain folder name"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--lr", "inf"], "--lr must be a finite number, got inf"),
        (["--grad-clip", "nan"], "--grad-clip must be a finite number, got nan"),
        (["--schedule", "zero-bubble"], "--schedule needs --layout mpmd"),
        (["--runs-root", "/etc/hostname"], "--runs-root /etc/hostname is not a directory"),
        # found only while tracing, after the run dir is written: the run dir is removed again
        (["--ops", "swiglu=pallas"], "ffn dim 688 must be a multiple of 128"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_no_run_dir(
    small_options, tmp_path, capsys, extra, message
):
    dropped = {"dp", *(["vocab_size"] if "--tokenizer" in extra else [])}  # refused beside it
    base = {k: v for k, v in small_options.items() if k not in dropped}
    argv = ["train"]
    for name, value in base.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    with pytest.raises(SystemExit) if message.startswith("argument") else _no_raise():
        code = main([*argv, *extra])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.slow
def test_resume_rejects_changing_the_model(small_options):
    from helpers import run_in_process

    _, run_dir = run_in_process({**small_options, "run_id": "fixed", "steps": 1})
    code = main(["train", "--resume", str(run_dir), "--seq-len", "64"])
    assert code == 2


@pytest.mark.slow
def test_console_script_exits_2_without_traceback(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "titan.cli",
            "train",
            "--batch-size",
            "-1",
            "--runs-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "titan train: error: --batch-size must be >= 1, got -1"
    assert not any(tmp_path.iterdir())


def test_output_cut_short_by_a_closed_pipe_ends_quietly():
    argv = [sys.executable, "-m", "titan.cli", "plan", "--model", "llama3-70b", "--gpu", "h200"]
    argv += ["--gpus", "64", "--tokens", "1e12", "--search", "--json", "--top", "500"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "{"  # like `| head -1`
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and stderr == ""


def test_version_flag_prints_the_installed_distributions_version(capsys):
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == titan.DISTRIBUTION
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "titan.__version__"}
    try:
        expected = metadata.version(titan.DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a checkout that is not installed
        expected = titan.__version__
    assert titan.installed_version() == expected
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"titan {expected}\n"


def test_console_version_flag_prints_the_same_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        console_main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"titan-console {titan.installed_version()}\n"


@pytest.mark.parametrize(
    "command",
    [
        ["export", "hf", "RUN"],
        ["export", "maxtext", "RUN"],
        ["export", "csv", "RUN"],
        ["export", "tensorboard", "RUN"],
        ["import", "hf", "DIR"],
        ["import", "maxtext", "DIR"],
        ["sample", "RUN"],
        ["report", "RUN"],
    ],
)
@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_not_read_as_the_default(command, out, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*command, "--out", out])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"titan {' '.join(command[:-1])}: error: argument --out: an empty path; name a file or "
        "directory"
    )


@pytest.mark.parametrize(
    ("command", "argument"),
    [
        (["export", "hf", ""], "RUN_DIR"),
        (["export", "maxtext", ""], "RUN_DIR"),
        (["export", "csv", "", "--out", "x.csv"], "RUN_DIR"),
        (["import", "hf", ""], "DIR"),
        (["import", "maxtext", ""], "DIR"),
        (["sample", ""], "RUN_DIR|CHECKPOINT"),
        (["report", ""], "RUN_DIR"),
        (["generate", "", "--prompt", "a"], "RUN_DIR|CHECKPOINT"),
        (["summarize", ""], "RUNS_ROOT"),
        (["plan", "--from", ""], "--from"),
        (["plan", "--calibration", "perfdb", "--runs-root", " "], "--runs-root"),
    ],
)
def test_an_empty_path_to_read_is_refused_not_read_as_the_current_dir(command, argument, capsys):
    with pytest.raises(SystemExit) as exited:
        main(command)
    assert exited.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f": error: argument {argument}: an empty path; name a file or directory")
    )


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["train", "--bogus"], "titan train"),
        (["plan", "--bogus", "1"], "titan plan"),
        (["export", "csv", "RUN", "--bogus"], "titan export csv"),
        (["perf", "check", "extra", "words"], "titan perf check"),
    ],
)
def test_an_unknown_argument_is_named_by_the_command_that_met_it(argv, command, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{command}: error: unrecognized arguments: ")


def test_an_error_names_the_subcommand_run_once(tmp_path, capsys):
    assert main(["import", "hf", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == (
        f"titan import hf: error: {tmp_path / 'gone' / 'config.json'}: cannot read it "
        "(No such file or directory)\n"
    )
