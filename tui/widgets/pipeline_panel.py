"""The pipeline timeline of an MPMD run: one row per stage, time across, the bubble as dots.

From the latest ``pipeline_timing`` event (measured spans of one step, every ``--timing-every``
steps); before the first, the schedule of the ``pipeline`` event (one column per action slot).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from titan.inert import inert
from titan.telemetry.events import PipelineTiming
from tui.run_state import RunState

IDLE = "·"


def timeline(timing: PipelineTiming, stages: int, width: int) -> tuple[list[str], float]:
    """Rows of ``width`` cells (the action kind where a stage is busy, :data:`IDLE` where not)
    for the spans ``[group, chunk, microbatch, kind, start_s, end_s]`` of ``timing``, and the
    measured bubble (idle fraction of stages x step time)."""
    step_s = timing.step_time_s
    rows = [[IDLE] * width for _ in range(stages)]
    busy_s = 0.0
    for group, _chunk, _micro, kind, start_s, end_s in timing.actions:
        busy_s += end_s - start_s
        first = int(start_s / step_s * width)
        last = max(first + 1, int(end_s / step_s * width))
        for cell in range(first, min(last, width)):
            rows[group][cell] = kind
    return ["".join(r) for r in rows], 1 - busy_s / (stages * step_s)


class PipelinePanel(Static):
    """Stage x time of the last timed step with its measured bubble, against the schedule's
    theoretical bubble."""

    def show(self, state: RunState) -> None:
        pipeline = state.pipeline
        if pipeline is None:
            self.update("No pipeline: an SPMD run (start one with --layout mpmd --pp N).")
            return
        stages = pipeline.stages
        head = (
            f"{pipeline.schedule} · {stages} stages · {pipeline.microbatches} microbatches"
            f" · theoretical bubble {pipeline.theoretical_bubble:.1%}"
        )
        timing = state.pipeline_timing
        if timing is None:
            rows = ["  ".join(group) for group in pipeline.actions]
            body = "schedule (no timed step yet):"
        else:
            rows, bubble = timeline(timing, stages, max(self.size.width - 6, 10))
            step_s = timing.step_time_s
            body = f"step {timing.step}: {step_s:.3f} s, measured bubble {bubble:.1%}"
        lines = [head, body, *(f"s{i:<3} {row}" for i, row in enumerate(rows))]
        self.update(Text("\n".join(map(inert, lines))))
