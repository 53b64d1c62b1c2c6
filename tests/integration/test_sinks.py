"""Metric sinks: ``titan export`` to TensorBoard (read back with tensorboard's own reader), CSV
and a W&B offline run, from the run's events.jsonl."""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from helpers import events

from titan.cli import main
from titan.telemetry.records import EVENTS_FILE
from titan.telemetry.sinks import WANDB_ID_CHARS, LiveTensorBoard, metric_rows, wandb_run_id

WANDB_HEADER = 7  # ":W&B", magic 0xBEE1, version: the LevelDB log format's records follow
WANDB_BLOCK = 32768


def _wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file (LevelDB log framing: 32 KiB blocks of
    records with a 7-byte header: crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    data, records, parts, offset = path.read_bytes(), [], b"", WANDB_HEADER
    while offset + 7 <= len(data):
        if WANDB_BLOCK - offset % WANDB_BLOCK < 7:  # a block's tail too short for a header
            offset += WANDB_BLOCK - offset % WANDB_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0:
            break
        parts += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


@pytest.mark.slow
def test_tensorboard_export_reads_back_with_tensorboards_reader_at_every_step(
    finished_run, tmp_path, capsys
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    assert main(["export", "tensorboard", str(finished_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert main(["export", "tensorboard", str(finished_run), "--out", str(out)]) == 0
    assert len(list(out.iterdir())) == 1  # a second export replaces the first
    accumulator = EventAccumulator(str(out))
    accumulator.Reload()
    steps = events(finished_run, "step")
    assert [e["step"] for e in steps] == [1, 2]
    for tag, field in (
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("train/grad_norm", "grad_norm"),
    ):
        scalars = accumulator.Scalars(tag)
        assert [(s.step, s.value) for s in scalars] == [
            (e["step"], pytest.approx(e[field])) for e in steps
        ]


@pytest.mark.slow
def test_csv_export_holds_every_step(finished_run, tmp_path):
    out = tmp_path / "metrics.csv"
    assert main(["export", "csv", str(finished_run), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    steps = events(finished_run, "step")
    assert [int(r["step"]) for r in rows] == [e["step"] for e in steps]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx([e["loss"] for e in steps])
    assert float(rows[0]["time"]) == pytest.approx(steps[0]["time"])


@pytest.mark.parametrize("name", ["events.jsonl", "config.json"])
def test_csv_export_never_replaces_a_file_of_the_run_even_with_force(
    finished_run, tmp_path, capsys, name
):
    run = shutil.copytree(finished_run, tmp_path / "run")
    before = (run / name).read_bytes()
    assert main(["export", "csv", str(run), "--out", str(run / name), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file of the run" in err
    assert (run / name).read_bytes() == before
    assert main(["export", "csv", str(run), "--out", str(run / "metrics.csv"), "--force"]) == 0


def test_csv_export_refuses_a_device_or_fifo_as_out(finished_run, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for out in (fifo, Path("/dev/null")):
        assert main(["export", "csv", str(finished_run), "--out", str(out), "--force"]) == 2
        assert "is not a regular file" in capsys.readouterr().err
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()


@pytest.mark.parametrize("sink", ["wandb-offline", "tensorboard"])
def test_an_export_into_a_dir_it_cannot_write_is_one_line_exit_2(
    finished_run, tmp_path, capsys, sink
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        assert main(["export", sink, str(finished_run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--out {out}" in err, err
    assert blocker.read_text() == ""


@pytest.mark.slow
def test_wandb_offline_export_is_a_run_that_wandb_sync_reads(finished_run, tmp_path, capsys):
    out = tmp_path / "wb"
    assert main(["export", "wandb-offline", str(finished_run), "--out", str(out)]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert run_dir.parent == out / "wandb" and run_dir.name.startswith("offline-run-")
    (wandb_file,) = run_dir.glob("run-*.wandb")
    history = [r.history for r in _wandb_records(wandb_file) if r.HasField("history")]
    logged = [
        {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in h.item}
        for h in history
    ]
    steps = events(finished_run, "step")
    assert [h["_step"] for h in logged] == [e["step"] for e in steps]
    assert [h["train/loss"] for h in logged] == pytest.approx([e["loss"] for e in steps])


def test_a_foreign_run_id_is_made_a_wandb_id_and_the_config_is_the_runs(
    finished_run, tmp_path, capsys
):
    run = shutil.copytree(finished_run, tmp_path / "run")
    lines = (run / EVENTS_FILE).read_text().splitlines()
    hostile = "esc-\x1b]0;PWNED\x07:a/b"
    records = [json.loads(line) for line in lines]
    records = [{**r, "run_id": hostile} for r in records]
    (run / EVENTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["export", "wandb-offline", str(run), "--out", str(tmp_path / "wb")]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1])
    (wandb_file,) = written.glob("run-*.wandb")
    config = {
        item.key
        for r in _wandb_records(wandb_file)
        if r.HasField("run")
        for item in r.run.config.update
    }
    start = next(r for r in records if r["type"] == "run_start")
    assert wandb_file.name == "run-esc---0-PWNED--a-b.wandb"
    assert set(start["config"]) <= config and "type" not in config


@pytest.mark.slow
def test_wandb_offline_export_lands_in_the_run_dirs_wandb_folder(finished_run, tmp_path, capsys):
    run = shutil.copytree(finished_run, tmp_path / "run")
    assert main(["export", "wandb-offline", str(run)]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert written.parent == run / "wandb" and written.name.startswith("offline-run-")


def test_a_wandb_id_is_cleaned_and_a_long_one_cut_to_stay_distinct():
    long_a, long_b = "x" * 300, "x" * 299 + "y"
    assert wandb_run_id("a:b/c") == "a-b-c" and wandb_run_id("") == "run"
    assert len(wandb_run_id(long_a)) == WANDB_ID_CHARS
    assert wandb_run_id(long_a) != wandb_run_id(long_b)


def test_a_replayed_step_is_exported_once_as_its_last_record():
    records = [
        {"type": "step", "time": 1.0, "step": 1, "loss": 5.0, "mfu": {"mfu": 0.1, "hfu": None}},
        {"type": "step", "time": 2.0, "step": 2, "loss": 4.0, "skipped": True},
        {"type": "run_start", "time": 3.0, "step": 0, "param_count": 7},
        {"type": "step", "time": 4.0, "step": 2, "loss": 3.5},  # replayed after a resume
        {"type": "step", "time": 5.0, "step": 3, "loss": float("nan")},
    ]
    rows = metric_rows(records)
    assert [(r.step, r.time, r.values) for r in rows] == [
        (1, 1.0, {"train/skipped": 0.0, "train/loss": 5.0, "train/mfu.mfu": 0.1}),
        (2, 4.0, {"train/skipped": 0.0, "train/loss": 3.5}),
        (3, 5.0, {"train/skipped": 0.0}),
    ]


def test_a_skipped_step_is_marked_in_the_exports_and_its_rates_left_out(tmp_path, capsys):
    step = {"type": "step", "tokens": 128, "lr": 1e-3, "mfu": {"causal": 0.3}}
    records = [
        {**step, "time": 1.0, "step": 1, "loss": 5.0, "step_time_s": 0.05, "tokens_per_s": 2560.0},
        {**step, "time": 1.1, "step": 2, "loss": None, "nonfinite": {"loss": "nan"}}
        | {"skipped": True, "step_time_s": 4.4e-05, "tokens_per_s": 2_892_263.0},
        {**step, "time": 1.2, "step": 3, "loss": 4.0, "step_time_s": 0.07, "tokens_per_s": 1828.0},
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["export", "csv", str(run_dir)]) == 0
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["train/skipped"] for r in rows] == ["0.0", "1.0", "0.0"]
    assert [r["train/tokens_per_s"] for r in rows] == ["2560.0", "", "1828.0"]
    assert [r["train/step_time_s"] for r in rows] == ["0.05", "", "0.07"]
    assert rows[1]["train/lr"] == "0.001" and rows[1]["train/mfu.causal"] == ""


def test_export_of_a_dir_without_a_record_is_one_line_exit_2(tmp_path, capsys):
    assert main(["export", "csv", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no events.jsonl" in err
    assert not (tmp_path / "metrics.csv").exists()


def _line(event: dict) -> bytes:
    return (json.dumps({"schema": 1, "run_id": "r", **event}) + "\n").encode()


def test_live_tensorboard_follows_the_events_written_after_it_started(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = tmp_path / "events.jsonl"
    record.write_bytes(_line({"type": "step", "time": 1.0, "step": 1, "loss": 6.0}))
    live = LiveTensorBoard(tmp_path, poll_s=0.01)  # a resumed run: step 1 is an earlier one's
    live.start()
    with open(record, "ab") as f:
        f.write(_line({"type": "step", "time": 2.0, "step": 2, "loss": 5.0}))
        f.flush()
        torn = _line({"type": "step", "time": 3.0, "step": 3, "loss": 4.0})
        f.write(torn[:20])  # the trainer mid-write
        f.flush()
        f.write(torn[20:])
    live.stop()  # writes what is left
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert [(s.step, s.value) for s in accumulator.Scalars("train/loss")] == [(2, 5.0), (3, 4.0)]


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling link"])
@pytest.mark.parametrize("command", [["report"], ["export", "csv"]])
def test_a_record_that_is_no_regular_file_is_named_as_unreadable(tmp_path, capsys, kind, command):
    events = tmp_path / "run" / "events.jsonl"
    events.parent.mkdir()
    {
        "fifo": os.mkfifo,
        "directory": Path.mkdir,
        "dangling link": lambda p: p.symlink_to(tmp_path / "gone"),
    }[kind](events)
    assert main([*command, str(events.parent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read events.jsonl" in err, err
    assert sorted(p.name for p in events.parent.iterdir()) == ["events.jsonl"]
