"""Typed run events: old records parse, every type round-trips, readers skip what they do not
know, and docs/events.md is generated from the classes."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from titan.analysis import ettr
from titan.telemetry.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    Checkpoint,
    CheckpointFailed,
    CheckpointUnrestorable,
    Compile,
    Eval,
    EventError,
    FlopsPerToken,
    LossSpike,
    Mfu,
    PinnedHost,
    Pipeline,
    PipelineTiming,
    Profile,
    RunEnd,
    RunStart,
    Stall,
    Step,
    UnknownEvent,
    markdown,
    parse_event,
)
from titan.telemetry.records import EVENTS_FILE, EventTail, RunRecord
from tui.run_state import RunState

REPO = Path(__file__).resolve().parents[2]
RECORDS = sorted(
    [*REPO.glob("sample_runs/*/events.jsonl"), *REPO.glob("bench/results/**/events.jsonl")]
)

EXAMPLES = [
    RunStart(
        config={"preset": "tiny", "steps": 4},
        model={"d_model": 64},
        param_count=1234,
        layout={"layout": "spmd", "devices": 1},
        compute_dtype="float32",
        ops={"attention": "native"},
        env={"device_kinds": ["cpu"]},
        tokenizer={"vocab_size": 512, "source": "trained"},
        data={"source": "stdlib", "tokens": 10, "sequences": 2},
        start_step=0,
        total_steps=4,
        resumed_from_step=None,
        power={"source": None, "available": False, "reason": "no source"},
    ),
    Compile(what="stage", seconds=1.5, stage=1),
    Step(
        step=3,
        loss=2.5,
        grad_norm=0.7,
        lr=1e-3,
        tokens=2048,
        tokens_seen=6144,
        step_time_s=0.5,
        tokens_per_s=4096.0,
        data_position=48,
        batch_digest="fc0d0fc2",
        model_flops_per_token=FlopsPerToken(causal=2.4e7, full=2.5e7),
        mfu=Mfu(causal=0.4, full=0.43, hfu_causal=0.5, hfu_full=0.52, peak_flops=989.5e12),
        energy_j=350.0,
        joules_per_token=0.17,
        dispatch_s=0.01,
    ),
    Step(step=1, mfu=None, mfu_reason="no peak for cpu"),
    Step(
        step=7,
        loss=None,
        grad_norm=None,
        nonfinite={"loss": "nan", "grad_norm": "inf"},
        skipped=True,
    ),
    Checkpoint(step=4, seconds=0.25, path="checkpoints/4"),
    LossSpike(step=9, loss=9.5, mean=5.0, std=0.5, threshold=8.0, window=100),
    Eval(step=4, loss=2.0, perplexity=7.389, tokens=1024, batches=4, seconds=0.5),
    Checkpoint(step=4, seconds=0.25, commit_s=1.5, asynchronous=True, path="checkpoints/4"),
    CheckpointFailed(step=6, error="OSError: [Errno 28] No space left", seconds=0.1, commit_s=0.4),
    CheckpointUnrestorable(step=8, error="ValueError: corrupt"),
    PinnedHost(bytes=17_981_792_264, seconds=9.1),
    Profile(steps=[2, 3], requested=[2, 3], complete=True, dir="profile", files=[], seconds=0.1),
    Stall(phase="step", elapsed_s=9.9, threshold_s=9.4, step=25, stacks=[{"thread": "main"}]),
    Pipeline(
        stages=2,
        virtual_stages=1,
        devices_per_stage=1,
        layers_per_chunk=[2, 2],
        chunk_stage=[0, 1],
        schedule="gpipe",
        microbatches=2,
        theoretical_bubble=1 / 3,
        actions=[["F0.0", "F0.1"], ["F1.0", "F1.1"]],
    ),
    PipelineTiming(step=2, actions=[[0, 0, 0, "F", 0.0, 2.0]], step_time_s=6.0),
    RunEnd(status="failed", step=25, reason="stall", error="stalled in step for 9.9 s"),
    RunEnd(
        status="failed",
        step=25,
        reason="stall",
        error="stalled in data_wait for 9.9 s",
        checkpoint_step=24,
        saved="saved",
    ),
    RunEnd(
        status="failed", step=7, reason="nonfinite", error="step 7: loss nan", checkpoint_step=6
    ),
]


def test_docs_events_md_is_generated_from_the_dataclasses():
    assert (REPO / "docs" / "events.md").read_text() == markdown(), (
        "docs/events.md is stale: python -m titan.telemetry.events --markdown > docs/events.md"
    )


def test_every_event_type_is_documented_and_has_an_example():
    text = markdown()
    assert all(f"## `{cls.type}`" in text for cls in EVENT_TYPES)
    assert {type(e) for e in EXAMPLES} == set(EVENT_TYPES)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.parent.relative_to(REPO)))
def test_every_stored_record_parses_into_known_types_and_writes_back_the_same(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        event = parse_event(line)
        assert not isinstance(event, UnknownEvent) and event.extra == {}
        assert (event.type, event.time, event.schema) == (line["type"], line["time"], 1)
        # Keys written as null where the writer now leaves them out (e.g. run_end's signal).
        written = {k: v for k, v in event.to_json().items() if v is not None}
        assert written == {k: v for k, v in line.items() if v is not None}
    steps = [e for e in map(parse_event, lines) if isinstance(e, Step)]
    assert steps and all(isinstance(e.step, int) for e in steps)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_to_json_and_from_json_round_trip(event):
    written = {**event.to_json(), "time": 12.5, "run_id": "r"}
    assert json.loads(json.dumps(written)) == written
    back = parse_event(written)
    assert type(back) is type(event) and back.schema == SCHEMA_VERSION
    assert back == type(event).from_json(written)
    assert back.to_json() == written
    assert (back.time, back.run_id) == (12.5, "r")


def test_old_lines_without_schema_keep_extra_keys_and_default_missing_ones():
    event = parse_event({"type": "step", "time": 3, "step": 2.0, "novel": [1], "loss": "x"})
    assert isinstance(event, Step) and event.schema == 0
    assert (event.step, event.time, event.loss, event.mfu) == (2, 3.0, None, None)
    assert event.extra == {"novel": [1]} and event.to_json()["novel"] == [1]


@pytest.mark.parametrize(
    "line",
    [
        [1, 2],
        {"time": 1.0},
        {"type": "step", "time": "x", "step": 1},
        {"type": "step", "time": 1.0},  # a step without its number
        {"type": "run_end", "time": 1.0, "step": 3},  # no status
    ],
)
def test_objects_that_are_not_events_are_refused(line):
    with pytest.raises(EventError):
        parse_event(line)


def test_readers_ignore_an_unknown_event_type(tmp_path):
    record = RunRecord(tmp_path, "r")
    record.emit(RunStart(start_step=0, total_steps=2))
    record.emit(Step(step=1, loss=3.0, step_time_s=1.0))
    record.close()
    with open(tmp_path / EVENTS_FILE, "a") as f:
        f.write(json.dumps({"schema": 9, "type": "novel", "time": 1e10, "step": 7}) + "\n")
        f.write("not json\n" + '{"type": "step", "ti')  # a bad line and a torn last line
    tail = EventTail(tmp_path / EVENTS_FILE)
    events = tail.read_new_events()
    assert [e.type for e in events] == ["run_start", "step", "novel"] and tail.bad_lines == 1
    assert isinstance(events[-1], UnknownEvent) and events[-1].extra == {"step": 7}
    g = ettr.analyze(events)
    assert [a.last_step for a in g.attempts] == [1]
    state = RunState()
    state.apply(events)
    assert (state.step, state.curve.losses, state.phase) == (1, [3.0], "step")


def test_emit_stamps_time_and_run_id_and_returns_the_event_as_written(tmp_path):
    record = RunRecord(tmp_path, "run-x")
    written = record.emit(Checkpoint(step=2, seconds=0.5, path="c/2"))
    record.close()
    (line,) = [json.loads(s) for s in (tmp_path / EVENTS_FILE).read_text().splitlines()]
    assert written.run_id == "run-x" and written.time == line["time"]
    assert parse_event(line) == written
    assert line == {"schema": 1, "type": "checkpoint", "time": written.time, "run_id": "run-x",
                    "step": 2, "seconds": 0.5, "path": "c/2"}  # fmt: skip


def test_a_record_that_is_a_fifo_or_a_directory_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / EVENTS_FILE)  # no reader: a blocking open would wait for one
    with pytest.raises(OSError):
        RunRecord(tmp_path, "r")
    (tmp_path / EVENTS_FILE).unlink()
    (tmp_path / EVENTS_FILE).mkdir()
    with pytest.raises(OSError):
        RunRecord(tmp_path, "r")


def test_step_from_fields_takes_the_flops_meters_json_shape():
    step = Step.from_fields(
        step=1, model_flops_per_token={"causal": 1.0, "full": 2.0}, mfu=None, mfu_reason="cpu"
    )
    assert step.model_flops_per_token == FlopsPerToken(causal=1.0, full=2.0)
    assert step.to_json()["mfu_reason"] == "cpu"
    with pytest.raises(TypeError, match="no field 'mfu_convention'"):
        Step.from_fields(step=1, mfu_convention="causal")


def test_the_summary_columns_are_event_fields():
    from titan.analysis.summarize import EVENT_FIELDS

    names = {f.name for cls in EVENT_TYPES for f in dataclasses.fields(cls)} | {"type"}
    assert set(EVENT_FIELDS) <= names


def test_the_consoles_fold_reads_only_fields_its_events_declare():
    """tui/run_state.py folds each event type in ``_on_<type>``: every ``event.<name>`` it reads
    is a field of that type's dataclass here, so a renamed or removed field fails this test."""
    import ast

    source = Path(__file__).parents[2] / "tui" / "run_state.py"
    by_type = {cls.type: cls for cls in EVENT_TYPES}
    handlers = [
        node
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_on_")
    ]
    assert {h.name.removeprefix("_on_") for h in handlers} <= set(by_type), "a fold of no event"
    for handler in handlers:
        cls = by_type[handler.name.removeprefix("_on_")]
        fields = {f.name for f in dataclasses.fields(cls)} | {"type", "written_time"}
        fields |= {n for n in dir(cls) if isinstance(getattr(cls, n, None), property)}
        read = {
            node.attr
            for node in ast.walk(handler)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "event"
        }
        assert read <= fields, (handler.name, sorted(read - fields))


def test_the_summary_columns_take_their_types_from_the_event_dataclasses():
    from titan.analysis.summarize import EVENT_FIELDS, event_column_type

    assert EVENT_FIELDS["step"] == "BIGINT" and EVENT_FIELDS["loss"] == "DOUBLE"
    assert EVENT_FIELDS["mfu"] == "JSON" and EVENT_FIELDS["type"] == "VARCHAR"
    with pytest.raises(TypeError, match="'no_such_field'"):
        event_column_type("no_such_field")
