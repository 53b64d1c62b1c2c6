"""Hostile invocations of the real CLI: each ends in one line on stderr and exit 2, with no
traceback, and leaves the runs root as it was (a resumed run dir byte-identical).

The unreadable files are ones no user can read, root included: ``/proc/self/mem`` is a regular
file whose first page is not mapped, so reading it fails with EIO.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import cli_args, file_tree, small_run

from titan.cli import main
from titan.config import TrainConfig
from titan.config_files import config_to_data
from titan.observability.records import check_runs_root
from tui.app import main as console_main

UNREADABLE = "/proc/self/mem"
UNWRITABLE = "/sys/kernel"  # sysfs refuses a new directory, even to root


def _meta_file(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "2" / "meta" / "metadata"


def _edit_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        data = json.loads((run_dir / "config.json").read_text())
        edit(data)
        (run_dir / "config.json").write_text(json.dumps(data))

    return apply


def _set(section: str, key: str, value) -> Callable[[Path], None]:
    return _edit_config(lambda data: data["train"][section].__setitem__(key, value))


def _replace_with_dir(name: str) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        (run_dir / name).unlink()
        (run_dir / name).mkdir()

    return apply


def _checkpoints_a_file(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").write_text("not a directory\n")


def _meta_garbage(run_dir: Path) -> None:
    _meta_file(run_dir).write_bytes(b"\x00{not json")


def _meta_without_layout(run_dir: Path) -> None:
    meta = _meta_file(run_dir)
    data = json.loads(meta.read_text())
    del data["layout"]
    meta.write_text(json.dumps(data))


def _tokenizer_garbage(run_dir: Path) -> None:
    (run_dir / "tokenizer.model").write_bytes(b"not a sentencepiece model")


# (name, extra train options or a whole argv, env): a fresh run gets the small run's options.
FRESH = {
    "data_unreadable_file": {"data": UNREADABLE},
    "data_dir_holding_an_unreadable_file": {"data": "{unreadable_dir}"},
    "data_jsonl_not_utf8": {"data": "{bad_jsonl}"},
    "tokenizer_unreadable": {"tokenizer": UNREADABLE},
    "tokenizer_a_directory": {"tokenizer": "{tmp}"},
    "runs_root_under_a_file": {"runs_root": "{a_file}/runs"},
    "runs_root_unwritable": {"runs_root": UNWRITABLE + "/titan-runs"},
    "runs_root_in_proc": {"runs_root": "/proc/titan-runs"},
    "run_id_256_characters": {"run_id": "r" * 256},
    "config_file_unreadable": {"config": UNREADABLE},
}
RESUMED = {
    "config_steps_a_list": _set("optimizer", "steps", [1]),
    "config_batch_size_a_text": _set("data", "batch_size", "eight"),
    "config_lr_a_dict": _set("optimizer", "lr", {"x": 1}),
    "config_seed_null": _set("run", "seed", None),
    "config_section_a_number": _edit_config(lambda d: d["train"].__setitem__("data", 5)),
    "config_train_a_list": _edit_config(lambda d: d.__setitem__("train", [])),
    "config_json_a_directory": _replace_with_dir("config.json"),
    "events_jsonl_a_directory": _replace_with_dir("events.jsonl"),
    "tokenizer_not_a_model": _tokenizer_garbage,
    "checkpoints_a_file": _checkpoints_a_file,
    "checkpoint_meta_corrupt": _meta_garbage,
    "checkpoint_meta_without_layout": _meta_without_layout,
}
OTHER = {
    "plan_d_model_inf": (
        ["plan", "--model", "d_model=inf", *"--gpu h100 --gpus 8 --tokens 1e9".split()],
        {},
    ),
    "plan_d_model_nan": (
        ["plan", "--model", "d_model=nan", *"--gpu h100 --gpus 8 --tokens 1e9".split()],
        {},
    ),
    "titan_ops_unknown_op": (["train"], {"TITAN_OPS": "attention=bogus"}),
    "titan_ops_unknown_provider": (["train"], {"TITAN_OPS": "nosuchop=native"}),
    "titan_ops_malformed": (["train"], {"TITAN_OPS": "attention"}),
    "report_of_an_events_directory": (["report", "{events_dir_run}"], {}),
}
CASES = [*FRESH, *RESUMED, *OTHER]


def _fill(value: str, places: dict[str, Path]) -> str:
    return value.format(**{k: str(v) for k, v in places.items()})


def _places(tmp_path: Path) -> dict[str, Path]:
    unreadable_dir = tmp_path / "corpus"
    unreadable_dir.mkdir()
    (unreadable_dir / "a.txt").write_text("some text\n" * 100)
    (unreadable_dir / "b.txt").symlink_to(UNREADABLE)
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    events_dir_run = tmp_path / "events_dir_run"
    (events_dir_run / "events.jsonl").mkdir(parents=True)
    return {
        "tmp": tmp_path,
        "unreadable_dir": unreadable_dir,
        "bad_jsonl": bad_jsonl,
        "a_file": a_file,
        "events_dir_run": events_dir_run,
    }


def _argv(case: str, tmp_path: Path, corpus_dir: Path, finished_run: Path) -> tuple[list, dict]:
    runs = tmp_path / "runs"
    base = small_run(corpus_dir, runs, steps=2, dp=1)
    places = _places(tmp_path)
    if case in FRESH:
        options = {**base, **{k: _fill(v, places) for k, v in FRESH[case].items()}}
        return ["train", *cli_args(options)], {}
    if case in RESUMED:
        run_dir = runs / "done"
        shutil.copytree(finished_run, run_dir, symlinks=True)
        RESUMED[case](run_dir)
        return ["train", "--resume", str(run_dir), "--steps", "4"], {}
    argv, env = OTHER[case]
    if argv == ["train"]:
        argv = ["train", *cli_args(base)]
    return [_fill(a, places) for a in argv], env


def _run_main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``titan ARGV`` run in this process (argparse exits too)."""
    try:
        code = main(argv)
    except SystemExit as err:
        code = err.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES)
def test_bad_invocation_is_one_line_exit_2_and_writes_nothing(
    case, tmp_path, corpus_dir, finished_run, capsys, monkeypatch
):
    argv, env = _argv(case, tmp_path, corpus_dir, finished_run)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = file_tree(tmp_path)
    code, err = _run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert (code, len(lines)) == (2, 1), err
    if env:
        assert "TITAN_OPS" in lines[0]
    assert file_tree(tmp_path) == before


def _diffusion_run_without_checkpoints(tmp_path: Path) -> Path:
    run_dir = tmp_path / "diffusion_run"
    run_dir.mkdir()
    cfg = TrainConfig.of(task="diffusion")
    saved = {"train": config_to_data(cfg), "model": dataclasses.asdict(cfg.model.shape)}
    (run_dir / "config.json").write_text(json.dumps(saved))
    return run_dir


def _run_of_model_source(tmp_path: Path, **source: str) -> str:
    """A run dir's ``config.json`` as a run of ``source`` (``--model-source``, and its
    ``--maxtext-model``) records it: what ``--init-from`` reads before any checkpoint."""
    run_dir = tmp_path / "source_run"
    run_dir.mkdir()
    cfg = TrainConfig.of(**source)
    saved = {"train": config_to_data(cfg), "model": dataclasses.asdict(cfg.model.shape)}
    (run_dir / "config.json").write_text(json.dumps(saved))
    return str(run_dir)


def _run_with_events(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"kind": "step", "step": 1, "time": 1.0}\n')
    (tmp_path / "out").mkdir()
    return run_dir


SAMPLE_RUN = Path(__file__).resolve().parent.parent / "sample_runs" / "llama3-1b-h200"
PLAN_TINY = ["plan", "--model", "tiny", "--gpu", "h200", "--gpus", "8", "--tokens", "1e9"]


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "a_file").write_text("x\n")
    return tmp_path / "a_file"


# (name, argv builder, the flag or text the one line names): commands other than train.
COMMANDS = {
    "tokenize_data_empty": (lambda tmp: ["tokenize", "--data", ""], "--data is empty"),
    "tokenize_data_workers_negative": (
        lambda tmp: ["tokenize", "--data", "stdlib", "--data-workers", "-1"],
        "--data-workers",
    ),
    "train_diffusion_with_data": (
        lambda tmp: ["train", "--task", "diffusion", "--data", str(tmp)],
        "--data does not apply to --task diffusion",
    ),
    "init_from_a_maxtext_run_onto_titan": (
        lambda tmp: [
            "train",
            "--init-from",
            _run_of_model_source(tmp, model_source="maxtext", maxtext_model="llama2-7b"),
            "--dp",
            "1",
        ],
        "holds a maxtext model (--model-source maxtext); this run builds titan's llama "
        "(--model-source titan)",
    ),
    "init_from_a_titan_run_onto_maxtext": (
        lambda tmp: [
            "train",
            "--model-source",
            "maxtext",
            "--maxtext-model",
            "llama2-7b",
            "--init-from",
            _run_of_model_source(tmp),
        ],
        "holds titan's llama (--model-source titan); this run builds a maxtext model",
    ),
    "export_csv_out_a_directory": (
        lambda tmp: ["export", "csv", str(_run_with_events(tmp)), "--out", str(tmp / "out")],
        "--out",
    ),
    "sample_without_checkpoints": (
        lambda tmp: ["sample", str(_diffusion_run_without_checkpoints(tmp))],
        "no committed checkpoint",
    ),
    "train_model_and_preset": (
        lambda tmp: ["train", "--model", "tiny", "--preset", "llama3-1b"],
        "argument --preset: not allowed with argument --model",
    ),
    "plan_from_with_gpus": (
        lambda tmp: ["plan", "--from", str(SAMPLE_RUN), "--gpus", "8"],
        "--gpus conflicts with --from",
    ),
    "plan_from_with_model": (
        lambda tmp: ["plan", "--from", str(SAMPLE_RUN), "--model", "tiny"],
        "--model conflicts with --from",
    ),
    "plan_search_with_a_layout": (
        lambda tmp: [*PLAN_TINY, "--search", "--dp", "2", "--tp", "4"],
        "--dp conflicts with --search",
    ),
    "plan_schedule_without_a_pipeline": (
        lambda tmp: [*PLAN_TINY, "--schedule", "zero-bubble"],
        "--schedule needs a pipeline (--pp > 1)",
    ),
    "plan_search_over_gpus_no_layout_spans": (
        lambda tmp: [*PLAN_TINY[:-3], "3", "--tokens", "1e9", "--search"],
        "--gpus 3: no layout splits this model and batch over 3 GPUs",
    ),
    "plan_perfdb_calibration_of_an_empty_runs_root": (
        lambda tmp: [*PLAN_TINY, "--calibration", "perfdb", "--runs-root", str(_empty(tmp))],
        "--calibration perfdb: no measured run",
    ),
    "summarize_a_file": (lambda tmp: ["summarize", str(_a_file(tmp))], "is not a directory"),
    "perf_check_a_file": (lambda tmp: ["perf", "check", str(_a_file(tmp))], "is not a directory"),
    "sample_guidance_negative": (
        lambda tmp: ["sample", str(_diffusion_run_without_checkpoints(tmp)), "--guidance", "-1"],
        "--guidance",
    ),
}


@pytest.mark.parametrize("case", COMMANDS)
def test_bad_command_is_one_line_exit_2_and_leaves_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build, names = COMMANDS[case]
    argv = build(tmp_path)
    before = file_tree(tmp_path)
    code, err = _run_main(argv, capsys)
    assert "Traceback" not in err, err
    assert (code, len(err.strip().splitlines())) == (2, 1), err
    assert names in err
    assert file_tree(tmp_path) == before


@pytest.mark.parametrize("under", ["", "runs"])
def test_console_refuses_a_runs_root_that_is_no_directory_before_it_starts(under, tmp_path, capsys):
    root = _a_file(tmp_path) / under if under else _a_file(tmp_path)
    with pytest.raises(SystemExit) as exited:
        console_main(["--runs-root", str(root)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert err.startswith("titan-console: error: --runs-root: ") and "is not a directory" in err
    # A runs root still to be made is the console's to create at the first launch (the docs).
    assert check_runs_root(tmp_path / "new" / "runs", created=True) == tmp_path / "new" / "runs"
    assert not (tmp_path / "new").exists()
