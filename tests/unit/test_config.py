"""The config: typed sections parsed once, TOML files, old flat run configs, and the registries
that config validation, the pipeline executor and the planner all ask."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing
from dataclasses import replace
from pathlib import Path

import pytest

from titan.checkpoint.resume import resume_options
from titan.cli import build_parser, main
from titan.commands.train import explicit_options
from titan.config import (
    SECTIONS,
    Remat,
    Schedule,
    TrainConfig,
    option_fields,
    options_by_name,
    perf_key_options,
    trained_vocab_size,
)
from titan.config_files import config_from_dict, config_to_data, config_to_toml, read_config_file
from titan.config_flags import bounds_text
from titan.errors import TitanError
from titan.planning.memory import Layout, in_flight_microbatches
from titan.planning.step import bubble_fraction
from titan.remat import AUTO, REMAT_POLICIES
from titan.schedules import SCHEDULES, build_schedule, theoretical_bubble
from titan.shapes import PRESETS, model_text

REPO = Path(__file__).resolve().parents[2]
SHAPE = "d_model=64,n_layers=2,n_heads=4,n_kv_heads=2,ffn_dim=128,vocab_size=512"


def _train_args(*argv: str):
    return build_parser().parse_args(["train", *argv])


def test_values_are_parsed_once_into_real_types():
    cfg = TrainConfig.of(
        layout="mpmd",
        pp=2,
        stage_layers="1,3",
        profile_steps="2:5",
        ops="attention=native",
        watchdog_abort="true",
    )
    assert cfg.parallel.stage_layers == (1, 3)
    assert cfg.observability.profile_steps == (2, 5)
    assert cfg.compute.ops == {"attention": "native"}
    assert cfg.observability.watchdog_abort is True
    assert cfg.model.shape == PRESETS["tiny"]
    assert TrainConfig().observability.profile_steps is None


def test_every_option_belongs_to_one_section_and_keeps_its_flag():
    names = [o.name for o in option_fields()]
    assert len(names) == len(set(names)) == 76
    assert {o.section for o in option_fields()} == set(SECTIONS)
    resumable = {o.name for o in option_fields() if o.resumable}
    assert resumable == {
        *("steps", "checkpoint_every", "log_every", "timing_every", "layout", "dp", "fsdp"),
        *("tp", "pp", "microbatches", "schedule", "virtual_stages", "stage_layers", "ops"),
        *("remat", "layer_unroll", "watchdog_floor", "watchdog_factor", "watchdog_abort"),
        *("profile_steps", "debug_stall_at_step", "debug_signal_in", "exit_zero_on_stop"),
        *("nonfinite", "nonfinite_patience", "loss_spike_window", "loss_spike_sigma"),
        *("checkpoint_every_s", "checkpoint_keep", "checkpoint_keep_every", "checkpoint_async"),
        "checkpoint_pin_host",
        *("memory_check", "debug_nonfinite_at_step", "debug_usable_memory"),
        *("eval_every", "eval_batches"),
        *("data_workers", "metrics", "compilation_cache", "decay_steps"),
        *("matmul_dtype", "fused_projections"),  # no state: FP8 scales are per step
    }
    assert set(perf_key_options()) == {
        *("layout", "dp", "fsdp", "tp", "pp", "microbatches", "schedule", "virtual_stages"),
        *("stage_layers", "batch_size", "seq_len", "param_dtype", "compute_dtype", "remat"),
        *("attention_mask", "layer_unroll", "matmul_dtype", "fused_projections"),
    }


def test_maxtext_options_parse_and_need_each_other():
    cfg = TrainConfig.of(
        model_source="maxtext", maxtext_model="llama2-7b", maxtext_set="a=1  b=[x,y]"
    )
    assert cfg.model.maxtext_set == {"a": "1", "b": "[x,y]"}
    assert TrainConfig.of(**cfg.flat()).model == cfg.model  # the flat form round-trips
    assert cfg.record()["maxtext_set"] == "a=1 b=[x,y]"
    with pytest.raises(TitanError, match="--model-source maxtext needs --maxtext-model"):
        TrainConfig.of(model_source="maxtext")
    with pytest.raises(TitanError, match="--maxtext-set needs --model-source maxtext"):
        TrainConfig.of(maxtext_set=["a=1"])
    with pytest.raises(TitanError, match="'a' is not key=value"):
        TrainConfig.of(model_source="maxtext", maxtext_model="x", maxtext_set=["a"])
    with pytest.raises(TitanError, match="--preset/--model: not with --model-source maxtext"):
        TrainConfig.of(model_source="maxtext", maxtext_model="x", preset="llama3-1b")


def test_toml_round_trip_gives_the_same_config(tmp_path: Path):
    cfg = TrainConfig.of(
        preset=SHAPE,
        layout="mpmd",
        pp=2,
        microbatches=2,
        stage_layers="1,1",
        ops="attention=native",
        profile_steps="1:2",
        watchdog_abort=True,
        lr=1e-4,
        tokenizer='a "quoted" path',
    )
    path = tmp_path / "run.toml"
    path.write_text(config_to_toml(cfg))
    assert TrainConfig.of(**read_config_file(str(path))) == cfg
    assert config_from_dict(json.loads(json.dumps(config_to_data(cfg)))) == cfg


def test_toml_keys_are_the_flag_names_and_a_misplaced_key_names_its_section(tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nmodel = "llama3-1b"\n[data]\ndata = "x"\nbatch-size = 4\n')
    assert read_config_file(str(path)) == {"preset": "llama3-1b", "data": "x", "batch_size": 4}
    path.write_text('[model]\nshape = "tiny"\n[data]\ncorpus = "x"\n')  # the field names too
    assert read_config_file(str(path)) == {"preset": "tiny", "data": "x"}
    assert "data = " in config_to_toml(TrainConfig()).split("[data]")[1]
    for text, message in (
        ("[data]\nsteps = 4\n", "unknown option 'steps' in [data]: it belongs in [optimizer] "),
        ("[data]\ndatta = 4\n", "unknown option 'datta' in [data]; [data] takes: data, "),
    ):
        path.write_text(text)
        with pytest.raises(TitanError, match=re.escape(f"--config {path}: {message}")):
            read_config_file(str(path))


def test_print_config_prints_toml_that_reads_back_the_same(tmp_path: Path, capsys):
    argv = ["train", "--config", str(REPO / "examples/tiny.toml"), "--steps", "20"]
    assert main([*argv, "--print-config", "--watchdog-abort"]) == 0
    first = capsys.readouterr().out
    (tmp_path / "printed.toml").write_text(first)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == first
    assert "[optimizer]\nsteps = 20\n" in first  # the flag overrides the file's 200
    assert "watchdog_abort = true" in first


def test_print_config_escapes_what_toml_forbids_raw_and_refuses_what_it_cannot_hold(
    tmp_path: Path, capsys
):
    argv = ["train", "--text-field", "a\x7fb", "--model-source", "maxtext"]
    argv += ["--maxtext-model", "llama2-7b", "--maxtext-set", "é=1 x.y=2"]
    assert main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "printed.toml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert read_config_file(str(tmp_path / "printed.toml"))["text_field"] == "a\x7fb"
    assert main(["train", "--data", "a\udcffb", "--print-config"]) == 2  # a path's byte 0xff
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data 'a\\udcffb': bytes that are not UTF-8" in err


def test_a_settings_table_keeps_values_with_spaces_and_refuses_nested_tables():
    table = {"a": "x y", "flag": True, "n": 3}
    cfg = TrainConfig.of(model_source="maxtext", maxtext_model="llama2-7b", maxtext_set=table)
    assert cfg.model.maxtext_set == {"a": "x y", "flag": "true", "n": "3"}
    with pytest.raises(TitanError, match=re.escape("--maxtext-set: 'a' must be key = a text")):
        TrainConfig.of(model_source="maxtext", maxtext_model="x", maxtext_set={"a": {"b": 1}})
    with pytest.raises(TitanError, match="a value with spaces goes in a TOML table"):
        TrainConfig.of(model_source="maxtext", maxtext_model="x", maxtext_set="x=a b")


@pytest.mark.parametrize(
    "text, message",
    [
        ('[data]\nbatch_size = "8"', "[data] batch_size: --batch-size must be an integer, got '8'"),
        ('[optimizer]\nlr = "1e-3"', "[optimizer] lr: --lr must be a number, got '1e-3'"),
        (
            "[compute]\nmemory_check = 0",
            "[compute] memory_check: --memory-check must be true or false, got 0",
        ),
        ("[data]\nbatch_size = 0", "[data] batch_size: --batch-size must be >= 1, got 0"),
        ('[compute]\nremat = "FULL"', "[compute] remat: --remat must be one of auto, none, "),
        ("[optimizer]\nlr = nan", "[optimizer] lr: --lr must be a finite number, got nan"),
    ],
)
def test_a_config_files_value_of_another_type_or_out_of_bounds_names_the_file_and_key(
    tmp_path: Path, text: str, message: str
):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(TitanError, match=re.escape(f"--config {path}: {message}")):
        read_config_file(str(path))
    path.write_text("[optimizer]\nlr = 1\n")  # an integer is a number
    assert read_config_file(str(path)) == {"lr": 1}


SMALL = "d_model=32,n_layers=1,n_heads=2,n_kv_heads=1,ffn_dim=64"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layout", "mpmd", "--pp", "2", "--stage-layers", "2,-1"], "--stage-layers 2,-1 must "),
        (["--data", "a:nan,b:1"], "--data a:nan,b:1: part 'a:nan' needs a finite weight > 0"),
        (
            ["--layout", "mpmd", "--pp", "2", "--schedule", "interleaved-1f1b"]
            + ["--virtual-stages", "4", "--microbatches", "2", "--batch-size", "4"],
            "4 layers of --preset tiny cannot fill --pp 2 x --virtual-stages 4 = 8 chunks",
        ),
        (["--model", SMALL + ",vocab_size=100"], "--model: vocab_size 100 is below the 259"),
        (
            ["--model", SMALL + ",vocab_size=32003", "--vocab-size", "512"],
            "--vocab-size 512 and --model vocab_size=32003 disagree: a custom --model's "
            "vocab_size is the vocabulary trained on --data",
        ),
        (
            ["--model", SMALL + ",vocab_size=32003", "--vocab-size", "512", "--tp", "4"],
            "--vocab-size 512 and --model vocab_size=32003 disagree",
        ),
        (["--images", "digits"], "--images does not apply to --task lm (only --task diffusion"),
        (
            ["--model", SMALL + ",vocab_size=32003", "--tp", "2", "--batch-size", "8"],
            "--tp 2 does not divide --model vocab_size=32003 (the embedding's rows are split",
        ),
    ],
)
def test_print_config_makes_the_checks_that_need_no_device(capsys, argv, message):
    assert main(["train", *argv, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_custom_shapes_vocabulary_is_the_one_printed_and_read_back(tmp_path: Path, capsys):
    argv = ["train", "--model", SMALL + ",vocab_size=1000", "--print-config"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "\nvocab_size = 1000\n" in printed  # the vocabulary trained, not the default 4096
    (tmp_path / "printed.toml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert main([*argv, "--vocab-size", "1000"]) == 0  # the same value typed twice agrees


def test_config_given_twice_or_empty_is_refused(tmp_path: Path, capsys):
    (tmp_path / "a.toml").write_text("[data]\nbatch_size = 8\n")
    twice = ["--config", str(tmp_path / "a.toml")] * 2
    for argv, message in (
        (twice, "argument --config: given twice; give it once"),
        (["--config", ""], "argument --config: an empty path"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["train", *argv, "--print-config"])
        assert exited.value.code == 2 and message in capsys.readouterr().err


def test_a_shape_table_that_names_a_preset_must_be_that_preset():
    fields = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, vocab_size=512)
    message = "--model: name 'llama3-1b' is a preset of another shape (d_model 32, not 2048)"
    with pytest.raises(TitanError, match=re.escape(message)):
        TrainConfig.of(preset={"name": "llama3-1b", **fields})
    assert TrainConfig.of(preset=fields).model.shape.name == "custom"
    tiny = {**PRESETS["tiny"].record(), "vocab_size": 512}  # its vocabulary filled in
    assert TrainConfig.of(preset=tiny).model.shape == replace(PRESETS["tiny"], vocab_size=512)
    with pytest.raises(TitanError, match="patch_size belong to a dit shape, not a llama's"):
        TrainConfig.of(preset={**fields, "patch_size": 2})


def test_two_keys_of_one_option_in_a_config_file_are_refused(tmp_path: Path):
    path = tmp_path / "both.toml"
    path.write_text("[data]\nbatch-size = 8\nbatch_size = 4\n")
    message = f"--config {path}: [data] batch-size and batch_size both set --batch-size: keep one"
    with pytest.raises(TitanError, match=re.escape(message)):
        read_config_file(str(path))


def test_example_config_is_a_small_run_on_the_default_corpus():
    cfg = TrainConfig.of(**{**read_config_file(str(REPO / "examples/tiny.toml")), "steps": 20})
    assert (cfg.data.corpus, cfg.model.shape.name, cfg.optimizer.steps) == ("stdlib", "tiny", 20)
    assert cfg.data.batch_size * cfg.data.seq_len <= 1024


def test_watchdog_abort_is_a_switch():
    assert explicit_options(_train_args("--watchdog-abort"))["watchdog_abort"] is True
    assert explicit_options(_train_args("--no-watchdog-abort"))["watchdog_abort"] is False
    assert "watchdog_abort" not in explicit_options(_train_args())
    with pytest.raises(SystemExit):
        _train_args("--watchdog-abort", "1")
    # saved flat configs of older runs hold 0 / 1
    assert config_from_dict({"watchdog_abort": 1}).observability.watchdog_abort is True


def test_custom_model_shapes_are_accepted_and_bad_ones_name_the_field(capsys):
    cfg = TrainConfig.of(**explicit_options(_train_args("--model", SHAPE)))
    assert (cfg.model.shape.name, cfg.model.shape.d_model, cfg.model.shape.vocab_size) == (
        "custom",
        64,
        512,
    )
    assert TrainConfig.of(preset="TINY") == TrainConfig()
    for shape, message in (
        ("d_model=64,n_layers=2", "--model: missing n_heads, n_kv_heads, ffn_dim, vocab_size"),
        (SHAPE.replace("n_kv_heads=2", "n_kv_heads=3"), "n_heads 4 is not a multiple of n_kv"),
        (SHAPE + ",depth=3", "--model: unknown field 'depth'"),
        (SHAPE.replace("d_model=64", "d_model=x"), "--model: d_model must be a number"),
        ("gpt5", "--model 'gpt5' is not a preset"),
    ):
        assert main(["train", "--model", shape, "--print-config"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_a_custom_shape_sets_rope_theta_and_the_trained_tokenizers_vocabulary(capsys):
    cfg = TrainConfig.of(**explicit_options(_train_args("--model", SHAPE + ",rope_theta=10000")))
    assert cfg.model.shape.rope_theta == 10_000.0
    assert TrainConfig.of(preset=SHAPE).model.shape.rope_theta == 500_000.0  # Llama 3's default
    # the shape's vocab_size, not --vocab-size's 4096
    assert trained_vocab_size(cfg.model.shape, cfg.data.vocab_size) == 512
    tiny = TrainConfig.of(vocab_size=1024)
    assert trained_vocab_size(tiny.model.shape, tiny.data.vocab_size) == 1024  # --vocab-size
    large = TrainConfig.of(preset="llama3-1b", vocab_size=1024)
    assert trained_vocab_size(large.model.shape, large.data.vocab_size) == 1024
    # the shape round-trips through --print-config's TOML and the flag's text
    assert model_text(cfg.model.shape) == SHAPE + ",rope_theta=10000"
    assert main(["train", "--model", SHAPE + ",rope_theta=1", "--print-config"]) == 2
    assert "--model: rope_theta must be a finite number > 1, got 1.0" in capsys.readouterr().err


def test_train_and_plan_share_the_model_parser_and_the_parallel_flags():
    from titan.shapes import resolve_model

    assert resolve_model(SHAPE) == TrainConfig.of(preset=SHAPE).model.shape
    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = ("--dp", "--fsdp", "--tp", "--pp", "--microbatches", "--schedule", "--virtual-stages")
    for flag in flags:
        ours, theirs = (p._option_string_actions[flag] for p in (plan, train))
        assert (ours.help, ours.choices, ours.type) == (theirs.help, theirs.choices, theirs.type)
    args = plan.parse_args(
        [
            "--model",
            "tiny",
            "--gpu",
            "h200",
            "--gpus",
            "1",
            "--tokens",
            "1e9",
            "--batch-size",
            "16",
            "--seq-len",
            "128",
        ]
    )
    from titan.commands.plan import batch_tokens

    assert batch_tokens(args) == 16 * 128


def test_old_flat_config_json_of_the_sample_runs_loads():
    for path in sorted((REPO / "sample_runs").glob("*/config.json")):
        saved = json.loads(path.read_text())
        cfg = config_from_dict(saved["train"])
        assert cfg.model.shape.name == saved["model"]["name"]
        assert cfg.data.batch_size == saved["train"]["batch_size"]
        assert cfg.record()["profile_steps"] == saved["train"].get("profile_steps", "")
    flat = {"preset": "tiny", "stage_layers": "", "ops": "", "profile_steps": "", "data": "x"}
    assert config_from_dict(flat) == TrainConfig.of(data="x")
    with pytest.raises(TitanError, match="unknown option 'nope'"):
        config_from_dict({"nope": 1})


def test_a_run_saved_flat_resumes_with_its_options(tmp_path: Path):
    flat = json.loads((REPO / "sample_runs/tiny-watchdog-stall/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(flat))
    (tmp_path / "tokenizer.model").write_bytes(b"")
    changes = {"steps": 300, "watchdog_abort": False}
    cfg = resume_options(tmp_path, changes)
    placement = {"runs_root": str(tmp_path.parent), "run_id": tmp_path.name}
    kept = {"decay_steps": flat["train"]["steps"]}  # the schedule keeps its length
    assert cfg == TrainConfig.of(**flat["train"]).replace(**changes, **placement, **kept)
    assert cfg.optimizer.steps == 300 and cfg.observability.watchdog_abort is False
    assert flat["train"]["watchdog_abort"] == 1  # saved as 0 / 1 before it was a switch
    with pytest.raises(TitanError, match="--batch-size cannot change on --resume"):
        resume_options(tmp_path, {"batch_size": 3})


def test_literal_types_name_the_registries():
    assert typing.get_args(Remat) == (AUTO, *REMAT_POLICIES)
    assert typing.get_args(Schedule) == tuple(SCHEDULES)


@pytest.mark.parametrize(
    ("name", "pp", "m", "v"),
    [
        ("gpipe", 4, 8, 1),
        ("1f1b", 2, 4, 1),
        ("1f1b", 4, 16, 1),
        ("zero-bubble", 4, 8, 1),
        ("interleaved-1f1b", 2, 4, 2),
        ("interleaved-1f1b", 4, 8, 3),
    ],
)
def test_config_executor_and_planner_agree_on_each_schedule(name, pp, m, v):
    cfg = TrainConfig.of(
        layout="mpmd", pp=pp, microbatches=m, schedule=name, virtual_stages=v, batch_size=m
    )
    schedule = build_schedule(cfg.parallel.schedule, pp, m, v)  # what the executor runs
    layout = Layout(pp=pp, microbatches=m, schedule=name, virtual_stages=v)
    bubble = theoretical_bubble(name, pp, m, v)  # what the executor reports
    # the planner's bubble is the same formula, relative to the busy time instead of the step
    assert bubble_fraction(layout) == pytest.approx(bubble / (1 - bubble))
    # the planner's microbatches in flight are those counted on the executed schedule
    assert in_flight_microbatches(layout) == pytest.approx(schedule.peak_in_flight(0) / v)


def test_config_validation_asks_the_schedule_registry():
    with pytest.raises(TitanError, match="--virtual-stages 2 needs --schedule interleaved-1f1b"):
        TrainConfig.of(layout="mpmd", pp=2, virtual_stages=2)
    with pytest.raises(TitanError, match="--microbatches 2 must be a multiple of --pp 4"):
        TrainConfig.of(
            layout="mpmd", pp=4, microbatches=2, schedule="interleaved-1f1b", virtual_stages=2
        )


def test_config_imports_without_jax():
    code = "import sys, titan.config, titan.commands.plan; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"data": ""}, "--data is empty"),
        ({"data": "  "}, "--data is empty"),
        ({"eval_data": " ", "eval_every": 5}, "--eval-data is empty"),
        ({"eval_data": "a:0.5,b:0.5", "eval_every": 5}, "--eval-data .* takes one corpus"),
        ({"task": "diffusion", "data": "web/"}, r"--data does not apply to --task diffusion"),
        ({"task": "diffusion", "tokenizer": "t.model"}, "--tokenizer does not apply"),
        ({"task": "diffusion", "eval_every": 5}, "--eval-every does not apply"),
        ({"task": "diffusion", "vocab_size": 512}, "--vocab-size does not apply"),
        ({"objective": "v"}, r"--objective does not apply to --task lm"),
    ],
)
def test_options_the_run_would_ignore_or_misread_are_refused(options, message):
    with pytest.raises(TitanError, match=message):
        TrainConfig.of(**options)


def _saved_run(run_dir: Path, runs_root: str) -> None:
    """A run dir that resume_options reads: config.json (runs_root as given) and a tokenizer."""
    run_dir.mkdir(parents=True)
    cfg = TrainConfig.of(runs_root=runs_root, run_id=run_dir.name)
    (run_dir / "config.json").write_text(json.dumps({"train": config_to_data(cfg), "model": {}}))
    (run_dir / "tokenizer.model").write_bytes(b"")


def test_a_resume_keeps_the_runs_root_however_the_run_dir_is_spelled(tmp_path: Path, monkeypatch):
    root = tmp_path / "runs"
    _saved_run(root / "r1", str(root))
    for spelled, cwd in (
        ("runs/r1", tmp_path),
        ("./runs/../runs/r1/", tmp_path),
        (".", root / "r1"),
    ):
        monkeypatch.chdir(cwd)
        run = resume_options(Path(spelled), {}).run
        assert (run.runs_root, run.run_id) == (str(root), "r1"), spelled
    moved = tmp_path / "elsewhere"
    (root / "r1").rename(moved)
    monkeypatch.chdir(tmp_path)
    run = resume_options(Path("elsewhere"), {}).run
    assert (run.runs_root, run.run_id) == (str(tmp_path), "elsewhere")


@pytest.mark.parametrize(
    ("option", "value", "message", "shown"),
    [
        ("lr", 0.0, "--lr must be > 0, got 0.0", "> 0"),
        ("min_lr_ratio", 1.5, "--min-lr-ratio must be <= 1, got 1.5", "0 to 1"),
        ("eval_split", 1.0, "--eval-split must be < 1, got 1.0", ">= 0, < 1"),
        ("vocab_size", 258, "--vocab-size must be >= 259, got 258", ">= 259"),
        ("watchdog_factor", 0.0, "--watchdog-factor must be > 0, got 0.0", "> 0"),
        ("label_dropout", 2.0, "--label-dropout must be <= 1, got 2.0", "0 to 1"),
        ("flow_shift", -1.0, "--flow-shift must be >= 0.001, got -1.0", "0.001 to 1000"),
    ],
)
def test_each_bound_is_declared_once_checked_and_shown(option, value, message, shown):
    with pytest.raises(TitanError, match=f"^{re.escape(message)}$"):
        TrainConfig.of(**{option: value})
    assert bounds_text(options_by_name()[option]) == shown  # --help and docs/options.md


def test_a_resume_refuses_an_option_of_the_other_task_typed_at_its_default(capsys, tmp_path):
    run = tmp_path / "lm-run"
    sample = Path(__file__).resolve().parents[2] / "sample_runs" / "tiny-20261129-185806-39fc"
    run.mkdir()
    (run / "config.json").write_bytes((sample / "config.json").read_bytes())
    (run / "tokenizer.model").write_bytes(b"a resume checks only that it is there")
    assert main(["train", "--resume", str(run), "--steps", "9", "--print-config"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--images", "digits", "--print-config"]) == 2
    assert "--images does not apply to --task lm" in capsys.readouterr().err
