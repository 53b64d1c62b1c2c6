"""Hostile invocations of the real CLI, one table of them (:data:`CASES`): each ends in exit 2
and exactly one line on stderr, with no traceback, within :data:`CASE_TIMEOUT_S`, leaves no
thread behind that would keep the process from exiting, and leaves the test's directory (runs
root, --out targets, a resumed run dir) byte for byte as it was. A new command joins by adding
rows.

The unreadable files are ones no user can read, root included: ``/proc/self/mem`` is a regular
file whose first page is not mapped, so reading it fails with EIO. ``/proc`` and ``/sys`` refuse
new files, even to root.
"""

from __future__ import annotations

import concurrent.futures.thread
import dataclasses
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import cli_args, file_tree, small_run

from titan.cli import main
from titan.config import MAX_DATA_WORKERS, MAX_IMAGE_SIZE, TrainConfig
from titan.config_files import config_to_data
from titan.reading import MAX_DOCUMENT_BYTES, MAX_JSON_DEPTH
from titan.telemetry.records import check_runs_root
from tui.app import main as console_main

UNREADABLE = "/proc/self/mem"
UNWRITABLE = "/sys/kernel"  # sysfs refuses a new directory, even to root
CASE_TIMEOUT_S = 240  # a bad invocation is refused in seconds; generous for a loaded CI host
SAMPLE_RUN = Path(__file__).resolve().parents[2] / "sample_runs" / "llama3-1b-h200"
PLAN_TINY = ["plan", "--model", "tiny", "--gpu", "h200", "--gpus", "8", "--tokens", "1e9"]
DEEP_JSON = "[" * (MAX_JSON_DEPTH * 1000) + "]" * (MAX_JSON_DEPTH * 1000)
STEP_EVENT = '{"type": "step", "time": 1.0, "step": 1}\n'
BINARY = bytes(range(256)) * 4  # not UTF-8 (0x80 is no first byte), no line of JSON


@dataclass
class Places:
    """What the rows build on: the test's directory, the test corpus and a finished 2-step run
    (copied before any change), and small files made on demand."""

    tmp: Path
    corpus: Path
    finished: Path

    @property
    def runs(self) -> Path:
        return self.tmp / "runs"

    def train(self, **options) -> list[str]:
        """``titan train`` of the small run with ``options`` on top."""
        base = small_run(self.corpus, self.runs, steps=2, dp=1)
        if "tokenizer" in options:  # --vocab-size is refused beside it
            del base["vocab_size"]
        return ["train", *cli_args({**base, **options})]

    def file(self, name: str, data: bytes | str) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(path)

    def link(self, name: str, target: str) -> str:
        (self.tmp / name).symlink_to(target)
        return str(self.tmp / name)

    def fifo(self, name: str) -> str:
        os.mkfifo(self.tmp / name)
        return str(self.tmp / name)

    def dir(self, name: str) -> str:
        (self.tmp / name).mkdir(parents=True)
        return str(self.tmp / name)

    def unreadable_dir(self) -> str:
        """A corpus dir of a readable text and a link to :data:`UNREADABLE`."""
        directory = Path(self.file("corpus/a.txt", "some text\n" * 100)).parent
        (directory / "b.txt").symlink_to(UNREADABLE)
        return str(directory)

    def run_copy(self, edit: Callable[[Path], None] = lambda run_dir: None) -> str:
        """A copy of the finished run under the runs root, changed by ``edit``."""
        run_dir = self.runs / "done"
        shutil.copytree(self.finished, run_dir, symlinks=True)
        edit(run_dir)
        return str(run_dir)

    def resume(self, edit: Callable[[Path], None]) -> list[str]:
        return ["train", "--resume", self.run_copy(edit), "--steps", "4"]

    def saved_run(self, name: str, **options) -> str:
        """A run dir holding only the ``config.json`` a run of ``options`` records."""
        cfg = TrainConfig.of(**options)
        saved = {"train": config_to_data(cfg), "model": dataclasses.asdict(cfg.model.shape)}
        return self.file(f"{name}/config.json", json.dumps(saved)).removesuffix("/config.json")

    def events_run(self, events: bytes | str) -> str:
        return self.file("run/events.jsonl", events).removesuffix("/events.jsonl")

    def hf_dir(self, **config) -> str:
        """A Hugging Face Llama directory holding only ``config.json`` (a small shape)."""
        shape = {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 512,
        }
        return self.file("hf/config.json", json.dumps({**shape, **config})).removesuffix(
            "/config.json"
        )


@dataclass(frozen=True)
class Case:
    """One hostile invocation: its argv (built in the test's directory), the text its one line
    names, and the environment it runs in."""

    argv: Callable[[Places], list[str]]
    names: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _export_into_checkpoints(run_dir: str) -> list[str]:
    return ["export", "hf", run_dir, "--out", f"{run_dir}/checkpoints/99"]


def _shape_toml(extra: str) -> str:
    """A ``--config`` file whose [model] is a small custom shape with ``extra`` fields."""
    fields = "d_model = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 128"
    return f"[model]\nmodel = {{{fields}, vocab_size = 512, {extra}}}\n"


# --- edits of a finished run's files ------------------------------------------------------------


def _edit_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        data = json.loads((run_dir / "config.json").read_text())
        edit(data)
        (run_dir / "config.json").write_text(json.dumps(data))

    return apply


def _set(section: str, key: str, value) -> Callable[[Path], None]:
    return _edit_config(lambda data: data["train"][section].__setitem__(key, value))


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda run_dir: (run_dir / name).write_bytes(data)


def _without_saved_option(section: str, name: str) -> Callable[[Path], None]:
    """An edit of a run's ``config.json`` that leaves one option out."""

    def apply(run_dir: Path) -> None:
        saved = json.loads((run_dir / "config.json").read_text())
        del saved["train"][section][name]
        (run_dir / "config.json").write_text(json.dumps(saved))

    return apply


def _replace_with_dir(name: str) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        (run_dir / name).unlink()
        (run_dir / name).mkdir()

    return apply


def _checkpoints_a_file(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").write_text("not a directory\n")


META = "checkpoints/2/meta/metadata"


def _meta_without_layout(run_dir: Path) -> None:
    data = json.loads((run_dir / META).read_text())
    del data["layout"]
    (run_dir / META).write_text(json.dumps(data))


def _garble_arrays(run_dir: Path) -> None:
    """Every array file of checkpoint 2 cut to 100 bytes of garbage (tensorstore: DATA_LOSS or
    OUT_OF_RANGE)."""
    chunk = run_dir / "checkpoints" / "2" / "chunk_0"
    for path in [*chunk.glob("d/*"), *chunk.glob("ocdbt.process_*/d/*")]:
        path.write_bytes(bytes(range(100)))


def _unreadable_events(run_dir: Path) -> None:
    (run_dir / "events.jsonl").unlink()
    (run_dir / "events.jsonl").symlink_to(UNREADABLE)


# --- the table ------------------------------------------------------------------------------------

CASES: dict[str, Case] = {
    # train: the corpus, the tokenizer, the runs root, the run id
    "train_data_unreadable_file": Case(lambda p: p.train(data=UNREADABLE)),
    "train_data_dir_holding_an_unreadable_file": Case(lambda p: p.train(data=p.unreadable_dir())),
    "train_data_jsonl_not_utf8": Case(
        lambda p: p.train(data=p.file("bad.jsonl", b'{"text": "fine"}\n{"text": "\xff\xfe"}\n'))
    ),
    "train_tokenizer_unreadable": Case(lambda p: p.train(tokenizer=UNREADABLE)),
    "train_tokenizer_a_directory": Case(lambda p: p.train(tokenizer=p.tmp)),
    "train_runs_root_under_a_file": Case(lambda p: p.train(runs_root=p.file("a_file", "x") + "/r")),
    "train_titan_runs_under_a_file": Case(
        lambda p: p.file("a_file", "x") and p.train(runs_root=""),
        "$TITAN_RUNS: cannot create a_file/runs/",
        env={"TITAN_RUNS": "a_file/runs"},
    ),
    "train_titan_runs_a_file": Case(
        lambda p: p.file("a_file", "x") and p.train(runs_root=""),
        "$TITAN_RUNS a_file is not a directory",
        env={"TITAN_RUNS": "a_file"},
    ),
    "train_steps_past_optaxs_int32_count": Case(
        lambda p: p.train(steps=2**31), "--steps must be <= 2147483647, got 2147483648"
    ),
    "train_refused_after_making_a_nested_new_runs_root": Case(
        lambda p: p.train(
            runs_root=p.tmp / "new" / "a" / "b",
            data=p.file("small.txt", "hello world\nthe quick brown fox\n"),
            vocab_size=512,
        ),
        "--vocab-size 512 is more pieces than --data yields",
    ),
    "report_out_inside_the_runs_checkpoints": Case(
        lambda p: ["report", (r := p.run_copy()), "--out", f"{r}/checkpoints/2/report"],
        "is inside the run's checkpoints/",
    ),
    "train_custom_vocab_more_than_the_data_yields_names_the_model": Case(
        lambda p: p.train(
            data=p.file("small.txt", "hello world\nthe quick brown fox\n"),
            model="d_model=32,n_layers=1,n_heads=2,n_kv_heads=1,ffn_dim=64,vocab_size=600",
            vocab_size=600,
        ),
        "--model vocab_size=600 is more pieces than --data yields",
    ),
    "train_vocab_size_beside_a_tokenizer": Case(
        lambda p: p.train(tokenizer=str(p.finished / "tokenizer.model"), vocab_size=1000),
        "--vocab-size 1000 sizes only a tokenizer trained on --data; --tokenizer",
    ),
    "train_default_vocab_size_typed_beside_a_tokenizer": Case(
        lambda p: p.train(tokenizer=str(p.finished / "tokenizer.model"), vocab_size=4096),
        "--vocab-size 4096 sizes only a tokenizer trained on --data; --tokenizer",
    ),
    "tokenize_vocab_size_beside_a_tokenizer": Case(
        lambda p: [
            "tokenize",
            *("--data", str(p.corpus), "--vocab-size", "4096"),
            *("--tokenizer", str(p.finished / "tokenizer.model")),
        ],
        "leave --vocab-size out",
    ),
    "train_runs_root_unwritable": Case(lambda p: p.train(runs_root=UNWRITABLE + "/titan-runs")),
    "train_runs_root_in_proc": Case(lambda p: p.train(runs_root="/proc/titan-runs")),
    "train_run_id_256_characters": Case(lambda p: p.train(run_id="r" * 256)),
    "train_model_and_preset": Case(
        lambda p: ["train", "--model", "tiny", "--preset", "llama3-1b"],
        "argument --preset: not allowed with argument --model",
    ),
    "train_data_workers_10000": Case(
        lambda p: p.train(data_workers=10000), f"--data-workers must be <= {MAX_DATA_WORKERS}"
    ),
    "train_mixture_weights_whose_sum_overflows": Case(
        lambda p: p.train(data=f"{p.corpus}:1e308,{p.corpus}/:1e308"), "the weights sum past"
    ),
    "train_eval_split_holding_out_every_document": Case(
        lambda p: p.train(eval_split=0.999999, eval_every=1),
        "(the documents left by --eval-split 0.999999): no non-empty",
    ),
    "train_mixture_weight_never_sampled": Case(
        lambda p: p.train(data=f"{p.corpus}:1e-30,{p.corpus}/:1"), "would never be sampled"
    ),
    "tokenize_eval_data_of_no_document": Case(
        lambda p: [
            "tokenize",
            *("--data", str(p.corpus), "--vocab-size", "512"),
            *("--eval-data", p.file("empty.jsonl", "\n")),
        ],
        "--eval-data",
    ),
    "train_eval_data_of_no_document": Case(
        lambda p: p.train(eval_data=p.file("empty.jsonl", "\n"), eval_every=1),
        "--eval-data",
    ),
    "train_mixture_part_named_twice": Case(
        lambda p: p.train(data=f"{p.corpus}:0.5,{p.corpus}:0.5"), "is named twice"
    ),
    "train_mixture_weight_inf": Case(
        lambda p: p.train(data=f"{p.corpus}:inf,{p.corpus}/:1"), "needs a finite weight > 0"
    ),
    "train_diffusion_image_size_2048": Case(
        lambda p: ["train", "--task", "diffusion", "--image-size", "2048"],
        f"--image-size must be <= {MAX_IMAGE_SIZE}",
    ),
    "train_diffusion_flow_shift_past_its_bound": Case(
        lambda p: ["train", "--task", "diffusion", "--flow-shift", "1e20"],
        "--flow-shift must be <= 1000",
    ),
    "train_diffusion_flow_shift_below_its_bound": Case(
        lambda p: ["train", "--task", "diffusion", "--flow-shift", "1e-20"],
        "--flow-shift must be >= 0.001",
    ),
    "train_text_field_empty": Case(lambda p: p.train(text_field=""), "--text-field is empty"),
    "train_resume_of_an_empty_run_dir": Case(
        lambda p: ["train", "--resume", "", "--steps", "2"], "--resume is empty"
    ),
    "train_diffusion_with_the_typed_tiny_preset": Case(
        lambda p: ["train", "--task", "diffusion", "--preset", "tiny"],
        "--preset tiny is a llama model; --task diffusion trains dit models",
    ),
    "train_maxtext_with_the_typed_tiny_preset": Case(
        lambda p: [
            *("train", "--model-source", "maxtext", "--maxtext-model", "llama2-7b"),
            *("--preset", "tiny"),
        ],
        "--preset/--model: not with --model-source maxtext",
    ),
    "train_diffusion_with_data": Case(
        lambda p: ["train", "--task", "diffusion", "--data", str(p.tmp)],
        "--data does not apply to --task diffusion",
    ),
    "train_diffusion_with_seq_len": Case(
        lambda p: ["train", "--task", "diffusion", "--seq-len", "64"],
        "--seq-len does not apply to --task diffusion",
    ),
    "train_diffusion_with_attention_mask": Case(
        lambda p: ["train", "--task", "diffusion", "--attention-mask", "causal"],
        "--attention-mask does not apply to --task diffusion",
    ),
    # the memory check on CPU: the host's memory, before the state is made
    "train_llama3_70b_on_cpu": Case(
        lambda p: p.train(preset="llama3-70b", tokenizer=p.finished / "tokenizer.model"),
        "memory check: --batch-size 8",
    ),
    "train_llama3_405b_on_cpu": Case(
        lambda p: p.train(preset="llama3-405b", tokenizer=p.finished / "tokenizer.model"),
        "memory check: --batch-size 8",
    ),
    # --config files
    "config_file_unreadable": Case(lambda p: p.train(config=UNREADABLE), "--config"),
    "config_file_not_utf8": Case(
        lambda p: p.train(config=p.file("c.toml", b"[data]\nbatch_size = 8 # \xff\n")),
        "not UTF-8 text (byte 24: 0xff)",
    ),
    "config_file_binary": Case(lambda p: p.train(config=p.file("c.toml", BINARY)), "not UTF-8"),
    "config_file_a_fifo": Case(
        lambda p: p.train(config=p.fifo("c.toml")), "a FIFO, not a regular file"
    ),
    "config_file_a_directory": Case(
        lambda p: p.train(config=p.dir("c.toml")), "a directory, not a regular file"
    ),
    "config_file_a_device": Case(
        lambda p: p.train(config="/dev/zero"), "a character device, not a regular file"
    ),
    "config_file_too_large": Case(
        lambda p: p.train(config=p.file("c.toml", b"#" * (MAX_DOCUMENT_BYTES + 1))),
        f"larger than {MAX_DOCUMENT_BYTES:,} bytes",
    ),
    "config_file_value_of_the_wrong_type": Case(
        lambda p: p.train(config=p.file("c.toml", '[optimizer]\nlr = "fast"\n')),
        "c.toml: [optimizer] lr: --lr must be a number, got 'fast'",
    ),
    "config_file_shape_missing_fields": Case(
        lambda p: p.train(config=p.file("c.toml", "[model]\nmodel = {d_model = 64}\n")),
        "[model] model: --model: missing n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size",
    ),
    "config_file_shape_field_a_text": Case(
        lambda p: p.train(config=p.file("c.toml", '[model]\nmodel = {d_model = "64"}\n')),
        "--model: d_model must be of type int, got '64'",
    ),
    "config_file_shape_unknown_field": Case(
        lambda p: p.train(config=p.file("c.toml", "[model]\nmodel = {width = 64}\n")),
        "--model: unknown field 'width'; fields: name, vocab_size, d_model",
    ),
    "config_file_shape_rope_scaling_a_text": Case(
        lambda p: p.train(config=p.file("c.toml", _shape_toml('rope_scaling = "yes"'))),
        "rope_scaling must be a table of factor, low_freq_factor",
    ),
    "config_file_shape_negative_norm_eps": Case(
        lambda p: p.train(config=p.file("c.toml", _shape_toml("norm_eps = -1"))),
        "--model: norm_eps must be a number in (0, 1), got -1",
    ),
    "config_file_shape_of_another_family": Case(
        lambda p: p.train(config=p.file("c.toml", _shape_toml('family = "dit"'))),
        "--model is a dit model (its family field); --task lm trains llama models",
    ),
    "config_file_section_an_array_of_tables": Case(
        lambda p: p.train(config=p.file("c.toml", "[[optimizer]]\nsteps = 3\n")),
        "[optimizer] must be one table, got an array of tables",
    ),
    "config_file_nested_deep": Case(
        lambda p: p.train(config=p.file("c.toml", "a = " + DEEP_JSON)), "--config"
    ),
    # --resume of a run whose record was changed
    "resume_config_steps_a_list": Case(lambda p: p.resume(_set("optimizer", "steps", [1]))),
    "resume_config_batch_size_a_text": Case(
        lambda p: p.resume(_set("data", "batch_size", "eight")),
        "train.data: field 'batch_size' must be a number, got a string",
    ),
    "resume_config_batch_size_a_number_as_text": Case(
        lambda p: p.resume(_set("data", "batch_size", "8")),
        "train.data: field 'batch_size' must be a number, got a string",
    ),
    "resume_saved_layout_larger_than_the_devices": Case(
        lambda p: p.resume(_set("parallel", "dp", 64)),
        "the run's saved layout does not fit here (--dp 64 x",
    ),
    "resume_layout_that_does_not_split_the_run_batch": Case(
        lambda p: [*p.resume(lambda run_dir: None), "--dp", "3"],
        "--batch-size 8 is the run's and cannot change on --resume: give --dp, --fsdp and "
        "--microbatches whose product divides it",
    ),
    "resume_config_lr_a_dict": Case(lambda p: p.resume(_set("optimizer", "lr", {"x": 1}))),
    "resume_config_seed_null": Case(lambda p: p.resume(_set("run", "seed", None))),
    "resume_config_section_a_number": Case(
        lambda p: p.resume(_edit_config(lambda d: d["train"].__setitem__("data", 5)))
    ),
    "resume_config_train_a_list": Case(
        lambda p: p.resume(_edit_config(lambda d: d.__setitem__("train", []))),
        "field 'train' must be an object, got an array",
    ),
    "resume_config_json_a_list": Case(
        lambda p: p.resume(_write("config.json", b"[1, 2]")), "the document is an array"
    ),
    "resume_config_json_binary": Case(
        lambda p: p.resume(_write("config.json", BINARY)), "config.json: not UTF-8"
    ),
    "resume_config_json_nested_deep": Case(
        lambda p: p.resume(_write("config.json", DEEP_JSON.encode())), "nested deeper than 64"
    ),
    "resume_events_a_fifo": Case(
        lambda p: p.resume(
            lambda r: (r / "events.jsonl").unlink() or os.mkfifo(r / "events.jsonl")
        ),
        "events.jsonl (a FIFO, not a regular file)",
    ),
    "resume_events_missing": Case(
        lambda p: p.resume(lambda r: (r / "events.jsonl").unlink()), "cannot read the run record"
    ),
    "resume_events_a_directory": Case(lambda p: p.resume(_replace_with_dir("events.jsonl"))),
    "resume_events_binary": Case(
        lambda p: p.resume(_write("events.jsonl", BINARY)), "starts with no run_start event"
    ),
    "resume_events_without_a_run_start": Case(
        lambda p: p.resume(_write("events.jsonl", STEP_EVENT.encode())), "no run_start event"
    ),
    "resume_config_json_without_an_option_that_cannot_change": Case(
        lambda p: p.resume(_without_saved_option("data", "batch_size")),
        "config.json says --batch-size 16 but the run recorded",
    ),
    "resume_config_json_a_directory": Case(lambda p: p.resume(_replace_with_dir("config.json"))),
    "resume_config_json_a_fifo": Case(
        lambda p: p.resume(lambda r: (r / "config.json").unlink() or os.mkfifo(r / "config.json")),
        "a FIFO",
    ),
    "resume_events_jsonl_a_directory": Case(lambda p: p.resume(_replace_with_dir("events.jsonl"))),
    "resume_tokenizer_not_a_model": Case(
        lambda p: p.resume(_write("tokenizer.model", b"not a sentencepiece model"))
    ),
    "resume_checkpoints_a_file": Case(lambda p: p.resume(_checkpoints_a_file)),
    "resume_checkpoint_meta_garbage": Case(
        lambda p: p.resume(_write(META, b"\x00{not json")), "checkpoint 2"
    ),
    "resume_checkpoint_meta_without_layout": Case(lambda p: p.resume(_meta_without_layout)),
    "resume_checkpoint_arrays_garbled": Case(lambda p: p.resume(_garble_arrays), "checkpoint 2"),
    # --init-from
    "init_from_a_maxtext_run_onto_titan": Case(
        lambda p: [
            *("train", "--dp", "1", "--init-from"),
            p.saved_run("mt", model_source="maxtext", maxtext_model="llama2-7b"),
        ],
        "holds a maxtext model (--model-source maxtext); this run builds titan's llama "
        "(--model-source titan)",
    ),
    "init_from_a_titan_run_onto_maxtext": Case(
        lambda p: [
            *("train", "--model-source", "maxtext", "--maxtext-model", "llama2-7b"),
            *("--init-from", p.saved_run("titan")),
        ],
        "holds titan's llama (--model-source titan); this run builds a maxtext model",
    ),
    # titan launch
    "launch_with_coordinator": Case(
        lambda p: ["launch", "--processes", "2", "--", *p.train(coordinator="127.0.0.1:1")],
        "--coordinator is set by titan launch",
    ),
    "launch_with_distributed_off": Case(
        lambda p: ["launch", "--processes", "2", "--", "train", "--distrib", "off"],
        "--distributed off: titan launch runs its processes as one run",
    ),
    "launch_with_a_prefix_of_process_id": Case(
        lambda p: ["launch", "--processes", "2", "--", "train", "--process-i=1"],
        "--process-id is set by titan launch",
    ),
    # titan tokenize
    "tokenize_data_empty": Case(lambda p: ["tokenize", "--data", ""], "--data is empty"),
    "tokenize_data_workers_negative": Case(
        lambda p: ["tokenize", "--data", "stdlib", "--data-workers", "-1"], "--data-workers"
    ),
    "tokenize_data_workers_10000": Case(
        lambda p: ["tokenize", "--data", "stdlib", "--data-workers", "10000"], "--data-workers"
    ),
    # titan plan
    "plan_d_model_inf": Case(lambda p: [*PLAN_TINY[:2], "d_model=inf", *PLAN_TINY[3:]]),
    "plan_d_model_nan": Case(lambda p: [*PLAN_TINY[:2], "d_model=nan", *PLAN_TINY[3:]]),
    "plan_a_dit_model": Case(
        lambda p: [*PLAN_TINY[:2], "dit-tiny", *PLAN_TINY[3:]], "--model dit-tiny: a dit model"
    ),
    "plan_from_a_missing_dir": Case(
        lambda p: ["plan", "--from", str(p.tmp / "gone")], "gone: no such directory"
    ),
    "plan_from_a_file": Case(
        lambda p: ["plan", "--from", str(SAMPLE_RUN / "events.jsonl")], "jsonl: not a directory"
    ),
    "plan_from_with_gpus": Case(
        lambda p: ["plan", "--from", str(SAMPLE_RUN), "--gpus", "8"], "--gpus conflicts with --from"
    ),
    "plan_from_with_model": Case(
        lambda p: ["plan", "--from", str(SAMPLE_RUN), "--model", "tiny"],
        "--model conflicts with --from",
    ),
    "plan_from_with_a_typed_default": Case(  # the run's attention, not the typed one
        lambda p: ["plan", "--from", str(SAMPLE_RUN), "--attention", "flash"],
        "--attention conflicts with --from",
    ),
    "plan_from_with_a_typed_default_seq_len": Case(
        lambda p: ["plan", "--from", str(SAMPLE_RUN), "--seq-len", "8192"],
        "--seq-len conflicts with --from",
    ),
    "plan_search_with_a_typed_zero": Case(  # 0 == False: told by identity, not equality
        lambda p: [*PLAN_TINY, "--search", "--dp", "0"], "--dp conflicts with --search"
    ),
    "plan_search_with_a_typed_default_layout": Case(
        lambda p: [*PLAN_TINY, "--search", "--remat", "auto"], "--remat conflicts with --search"
    ),
    "plan_search_with_a_layout": Case(
        lambda p: [*PLAN_TINY, "--search", "--dp", "2", "--tp", "4"],
        "--dp conflicts with --search",
    ),
    "plan_top_without_search": Case(lambda p: [*PLAN_TINY, "--top", "3"], "--top needs --search"),
    "plan_wide_without_search": Case(lambda p: [*PLAN_TINY, "--wide"], "--wide needs --search"),
    "plan_schedule_without_a_pipeline": Case(
        lambda p: [*PLAN_TINY, "--schedule", "zero-bubble"],
        "--schedule needs a pipeline (--pp > 1)",
    ),
    "plan_search_over_gpus_no_layout_spans": Case(
        lambda p: [*PLAN_TINY[:-3], "3", "--tokens", "1e9", "--search"],
        "--gpus 3: no layout splits this model and batch over 3 GPUs",
    ),
    "plan_search_over_no_gpus": Case(
        lambda p: [*PLAN_TINY[:-3], "0", "--tokens", "1e9", "--search"], "--gpus must be >= 1"
    ),
    "plan_search_over_negative_gpus": Case(
        lambda p: [*PLAN_TINY[:-3], "-4", "--tokens", "1e9", "--search"], "--gpus must be >= 1"
    ),
    "plan_totals_past_a_float": Case(
        lambda p: [*PLAN_TINY[:-1], "1e12", "--price", "1e308"],
        "the run's totals overflow a float",
    ),
    "plan_perfdb_calibration_of_an_empty_runs_root": Case(
        lambda p: [*PLAN_TINY, "--calibration", "perfdb", "--runs-root", p.dir("empty")],
        "--calibration perfdb: no measured run",
    ),
    "plan_calibration_nested_deep": Case(
        lambda p: [*PLAN_TINY, "--calibration", p.file("c.json", DEEP_JSON)],
        "nested deeper than 64",
    ),
    "plan_calibration_a_fifo": Case(
        lambda p: [*PLAN_TINY, "--calibration", p.fifo("c.json")], "--calibration"
    ),
    "plan_calibration_a_list": Case(
        lambda p: [*PLAN_TINY, "--calibration", p.file("c.json", "[0.5]")], "an array"
    ),
    # titan import / export
    "import_hf_layer_count_a_text": Case(
        lambda p: ["import", "hf", p.hf_dir(num_hidden_layers="two"), "--out", str(p.tmp / "o")],
        "field 'num_hidden_layers' must be an integer, got a string",
    ),
    "import_hf_rope_theta_a_list": Case(
        lambda p: ["import", "hf", p.hf_dir(rope_theta=[1]), "--out", str(p.tmp / "o")],
        "field 'rope_theta'",
    ),
    # a shape's errors name the file's keys, not Titan's fields
    "import_hf_kv_heads_that_do_not_divide_the_heads": Case(
        lambda p: ["import", "hf", p.hf_dir(num_key_value_heads=3), "--out", str(p.tmp / "o")],
        "config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3",
    ),
    "import_hf_a_negative_norm_eps": Case(
        lambda p: ["import", "hf", p.hf_dir(rms_norm_eps=-1.0), "--out", str(p.tmp / "o")],
        "config.json: rms_norm_eps must be",
    ),
    # an output never replaces the run's files (links followed) nor goes into its checkpoints
    "sample_out_a_link_to_the_runs_record": Case(
        lambda p: ["sample", (r := p.run_copy()), "--out", p.link("s.png", f"{r}/events.jsonl")],
        "is a file of the run",
    ),
    "sample_out_into_the_runs_checkpoints": Case(
        lambda p: ["sample", (r := p.run_copy()), "--out", f"{r}/checkpoints/2/meta.png"],
        "is inside the run's checkpoints/",
    ),
    "export_tensorboard_into_the_runs_checkpoints": Case(
        lambda p: ["export", "tensorboard", (r := p.run_copy()), "--out", f"{r}/checkpoints"],
        "is inside the run's checkpoints/",
    ),
    "export_csv_to_a_link_to_the_runs_config": Case(
        lambda p: ["export", "csv", (r := p.run_copy()), "--out", p.link("m", f"{r}/config.json")],
        "is a file of the run",
    ),
    "export_maxtext_into_the_runs_checkpoints": Case(
        lambda p: ["export", "maxtext", (r := p.run_copy()), "--out", f"{r}/checkpoints/21"],
        "is inside the run's checkpoints/",
    ),
    "import_hf_of_a_titan_run": Case(
        lambda p: ["import", "hf", p.saved_run("r"), "--out", str(p.tmp / "o")],
        "config.json has no model_type: not a Hugging Face model's config",
    ),
    "import_hf_config_binary": Case(
        lambda p: ["import", "hf", str(Path(p.file("hf/config.json", BINARY)).parent)],
        "not UTF-8",
    ),
    "import_hf_out_under_a_regular_file": Case(
        lambda p: ["import", "hf", str(p.tmp), "--out", p.file("afile", "x") + "/sub"],
        "not a directory",
    ),
    "export_hf_of_a_garbled_checkpoint": Case(
        lambda p: ["export", "hf", p.run_copy(_garble_arrays), "--out", str(p.tmp / "hf")],
        "checkpoint 2",
    ),
    "export_hf_of_a_run_without_its_tokenizer": Case(
        lambda p: ["export", "hf", p.saved_run("r1", vocab_size=512), "--out", str(p.tmp / "o")],
        "no tokenizer.model there",
    ),
    "export_hf_of_a_diffusion_run": Case(
        lambda p: ["export", "hf", p.saved_run("d1", task="diffusion"), "--out", str(p.tmp / "o")],
        "diffusion (DiT) run",
    ),
    "export_maxtext_of_a_diffusion_run": Case(
        lambda p: [
            *("export", "maxtext", p.saved_run("d1", task="diffusion")),
            *("--out", str(p.tmp / "o")),
        ],
        "diffusion (DiT) run",
    ),
    "export_csv_out_a_directory": Case(
        lambda p: [
            "export",
            "csv",
            p.events_run(STEP_EVENT),
            "--out",
            p.dir("o"),
        ],
        "--out",
    ),
    "export_csv_out_under_a_regular_file": Case(
        lambda p: [
            *("export", "csv", p.events_run(STEP_EVENT)),
            *("--out", p.file("t.sh", "x") + "/x.csv"),
        ],
        "t.sh is not a directory",
    ),
    "export_csv_out_an_existing_file": Case(
        lambda p: ["export", "csv", p.run_copy(), "--out", p.file("mine.csv", "keep me\n")],
        "exists already; give a new path or --force",
    ),
    "export_csv_of_binary_events": Case(
        lambda p: ["export", "csv", p.events_run(BINARY)], "holds no event"
    ),
    "export_tensorboard_of_binary_events": Case(
        lambda p: ["export", "tensorboard", p.events_run(BINARY)], "holds no event"
    ),
    "export_wandb_offline_of_binary_events": Case(
        lambda p: ["export", "wandb-offline", p.events_run(BINARY)], "holds no event"
    ),
    "export_csv_of_unreadable_events": Case(
        lambda p: ["export", "csv", p.run_copy(_unreadable_events)], "cannot read events.jsonl"
    ),
    "export_hf_out_among_the_checkpoints": Case(
        lambda p: _export_into_checkpoints(p.run_copy()), "inside the run's checkpoints/"
    ),
    # titan report, summarize, perf
    "report_of_an_events_directory": Case(
        lambda p: ["report", str(Path(p.dir("er/events.jsonl")).parent)]
    ),
    "summarize_a_file": Case(lambda p: ["summarize", p.file("a_file", "x")], "is not a directory"),
    "summarize_a_corpus_dir": Case(  # no database is written into it
        lambda p: ["summarize", str(Path(p.file("code/a.py", "x = 1\n")).parent)],
        "holds no runs",
    ),
    "perf_check_a_corpus_dir": Case(
        lambda p: ["perf", "check", str(Path(p.file("code/a.py", "x = 1\n")).parent)],
        "holds no runs",
    ),
    "perf_check_a_file": Case(
        lambda p: ["perf", "check", p.file("a_file", "x")], "is not a directory"
    ),
    # titan generate, sample
    "generate_temperature_inf": Case(
        lambda p: ["generate", p.run_copy(), "--prompt", "def", "--temperature", "inf"],
        "--temperature must be in [0, 100]",
    ),
    "generate_temperature_above_the_bound": Case(
        lambda p: ["generate", p.run_copy(), "--prompt", "def", "--temperature", "101"],
        "--temperature must be in [0, 100]",
    ),
    "sample_without_checkpoints": Case(
        lambda p: ["sample", p.saved_run("d1", task="diffusion")], "no committed checkpoint"
    ),
    "sample_guidance_negative": Case(
        lambda p: ["sample", p.saved_run("d1", task="diffusion"), "--guidance", "-1"], "--guidance"
    ),
    "sample_guidance_inf": Case(
        lambda p: ["sample", p.saved_run("d1", task="diffusion"), "--guidance", "inf"],
        "--guidance must be a number in [0, 3.402823e+38] (the float32 maximum), got inf",
    ),
    "sample_guidance_past_float32": Case(  # finite as a float64, inf in the float32 sampler
        lambda p: ["sample", p.saved_run("d1", task="diffusion"), "--guidance", "4e38"],
        "got 4e+38",
    ),
    "sample_out_not_a_png": Case(
        lambda p: ["sample", p.saved_run("d1", task="diffusion"), "--out", "grid.jpg"],
        "give a path ending in .png",
    ),
    "sample_out_under_proc": Case(
        lambda p: ["sample", p.saved_run("d1", task="diffusion"), "--out", "/proc/titan.png"],
        "--out /proc/titan.png: /proc is not writable",
    ),
    # TITAN_OPS
    "titan_ops_unknown_op": Case(
        lambda p: p.train(), "TITAN_OPS", {"TITAN_OPS": "attention=bogus"}
    ),
    "titan_ops_unknown_provider": Case(
        lambda p: p.train(), "TITAN_OPS", {"TITAN_OPS": "nosuchop=native"}
    ),
    "titan_ops_malformed": Case(lambda p: p.train(), "TITAN_OPS", {"TITAN_OPS": "attention"}),
}


def _run_main(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``titan ARGV`` run in this process (argparse exits too)."""
    try:
        code = main(argv)
    except SystemExit as err:
        code = err.code
    return code, capsys.readouterr().err


def _blocking_threads() -> set[threading.Thread]:
    """Live threads that would keep the interpreter from exiting (not daemons; an idle
    ``concurrent.futures`` worker is told to stop at exit, so it does not count, whatever its
    pool named it: ``ThreadPoolExecutor-0_0``, asyncio's default pool ``asyncio_0``)."""
    return {
        t
        for t in threading.enumerate()
        if not t.daemon
        and t is not threading.main_thread()
        and getattr(t, "_target", None) is not concurrent.futures.thread._worker
    }


@pytest.mark.timeout(CASE_TIMEOUT_S, func_only=True)  # the fixtures train a run first
@pytest.mark.parametrize("case", CASES)
def test_bad_invocation_is_one_line_exit_2_and_leaves_nothing(
    case, tmp_path, corpus_dir, finished_run, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    row = CASES[case]
    argv = [str(a) for a in row.argv(Places(tmp_path, corpus_dir, finished_run))]
    for name, value in row.env.items():
        monkeypatch.setenv(name, value)
    before, threads = file_tree(tmp_path), _blocking_threads()
    code, err = _run_main(argv, capsys)
    assert "Traceback" not in err, err
    assert (code, len(err.strip().splitlines())) == (2, 1), err
    assert row.names in err
    assert file_tree(tmp_path) == before
    assert _blocking_threads() <= threads


@pytest.mark.parametrize("under", ["", "runs"])
def test_console_refuses_a_runs_root_that_is_no_directory_before_it_starts(under, tmp_path, capsys):
    afile = tmp_path / "a_file"
    afile.write_text("x\n")
    root = afile / under if under else afile
    with pytest.raises(SystemExit) as exited:
        console_main(["--runs-root", str(root)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert err.startswith("titan-console: error: --runs-root: ") and "is not a directory" in err
    # A runs root still to be made is the console's to create at the first launch (the docs).
    assert check_runs_root(tmp_path / "new" / "runs", created=True) == tmp_path / "new" / "runs"
    assert not (tmp_path / "new").exists()
