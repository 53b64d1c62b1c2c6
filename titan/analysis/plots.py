"""Figures of ``titan report``: PNGs drawn with matplotlib's Agg backend (no display needed).

Each function draws one figure from per-attempt series (:class:`StepSeries`; a resumed run has
one series per attempt, drawn in its own colour, so redone steps show as overlaps) and writes
it to ``path``. matplotlib is imported when a figure is drawn, never at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DPI = 120
FIGSIZE_IN = (8.0, 4.5)
LINE_STYLES = ("-", "--", ":", "-.")


@dataclass
class StepSeries:
    """The step events of one attempt, as parallel lists (None where a field is missing).

    Attributes:
        label: legend entry, e.g. ``attempt 2 (resumed from step 20)``.
        steps: 1-based step numbers.
        time_s: seconds since the run's first ``run_start``.
        loss: mean token cross-entropy, nats.
        tokens_per_s: tokens per second of the step.
        mfu: fraction of peak per convention (``causal``, ``full``; or the recorded name).
        step_time_s: wall time of the step, seconds.
        energy_j: energy of the step, joules.
        eval_steps, eval_loss: the steps after which the held-out data was evaluated, and
            its loss (``eval`` events), nats.
    """

    label: str
    steps: list[int] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    tokens_per_s: list[float | None] = field(default_factory=list)
    mfu: dict[str, list[float | None]] = field(default_factory=dict)
    step_time_s: list[float | None] = field(default_factory=list)
    energy_j: list[float | None] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float | None] = field(default_factory=list)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _points(xs: list[Any], ys: list[Any]) -> tuple[list[Any], list[Any]]:
    """The (x, y) pairs whose y is known."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _from_zero(ax: Any) -> None:
    """Start the y axis at 0 and leave 10% headroom above the highest point."""
    top = ax.dataLim.y1
    ax.set_ylim(0, 1.1 * top if top > 0 else 1)


def _save(fig: Any, ax: Any, path: Path, legend: bool) -> Path:
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(loc="best", fontsize="small")
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:
        _pyplot().close(fig)
    return path


def plot_loss(path: Path, series: list[StepSeries]) -> Path:
    """Training loss (nats) against step, and the held-out (eval) loss where recorded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE_IN)
    evaluated = any(s.eval_steps for s in series)
    for s in series:
        label = f"{s.label}, train" if evaluated else s.label
        ax.plot(*_points(s.steps, s.loss), marker=".", markersize=3, label=label)
        if s.eval_steps:
            xs, ys = _points(s.eval_steps, s.eval_loss)
            ax.plot(xs, ys, marker="o", markersize=4, linestyle="--", label=f"{s.label}, eval")
    title = "Training and eval loss" if evaluated else "Training loss"
    ax.set(title=title, xlabel="step", ylabel="loss (mean token cross-entropy, nats)")
    return _save(fig, ax, path, legend=len(series) > 1 or evaluated)


def plot_throughput(path: Path, series: list[StepSeries], median: float | None) -> Path:
    """Tokens per second against step, with the run's median (the summary's) as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE_IN)
    for s in series:
        ax.plot(*_points(s.steps, s.tokens_per_s), marker=".", markersize=3, label=s.label)
    if median is not None:
        ax.axhline(median, color="grey", linestyle="--", label=f"median {median:,.0f} tokens/s")
    ax.set(title="Throughput", xlabel="step", ylabel="tokens/s")
    _from_zero(ax)
    return _save(fig, ax, path, legend=True)


def plot_mfu(path: Path, series: list[StepSeries], peak: str) -> Path:
    """MFU (percent of ``peak``, the divisor named in the title) against step: a colour per
    convention, a line style per attempt."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE_IN)
    conventions = sorted({c for s in series for c in s.mfu})
    for index, s in enumerate(series):
        for convention, values in s.mfu.items():
            xs, ys = _points(s.steps, values)
            ax.plot(
                xs,
                [100 * y for y in ys],
                color=f"C{conventions.index(convention)}",
                linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                marker=".",
                markersize=3,
                label=f"{convention}, {s.label}" if len(series) > 1 else convention,
            )
    ax.set(title=f"MFU: model FLOPs/s over {peak}", xlabel="step", ylabel="MFU (% of peak)")
    _from_zero(ax)
    return _save(fig, ax, path, legend=True)


def power_windows(s: StepSeries, window_s: float) -> tuple[list[float], list[float]]:
    """(end time s, mean power W) over windows of consecutive steps lasting at least
    ``window_s`` seconds: the sampler reads the counter about once a second, so one short step's
    ``energy_j`` is coarse while the sum over a window is exact."""
    times, watts = [], []
    energy, duration = 0.0, 0.0
    for t, e, d in zip(s.time_s, s.energy_j, s.step_time_s, strict=True):
        if e is None or d is None:
            continue
        energy, duration = energy + e, duration + d
        if duration >= window_s:
            times.append(t)
            watts.append(energy / duration)
            energy, duration = 0.0, 0.0
    return times, watts


def plot_power(path: Path, series: list[StepSeries], window_s: float) -> Path:
    """Mean power (W) over windows of at least ``window_s`` and cumulative energy of the steps
    (J), against seconds since the first ``run_start``."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(FIGSIZE_IN[0], 6.5), sharex=True)
    total = 0.0
    for s in series:
        top.plot(*power_windows(s, window_s), marker=".", markersize=3, label=s.label)
        times, cumulative = [], []
        for t, e in zip(s.time_s, s.energy_j, strict=True):
            if e is not None:
                total += e
                times.append(t)
                cumulative.append(total)
        bottom.plot(times, cumulative, label=s.label)
    top.set(title=f"Power (mean over windows of >= {window_s:g} s)", ylabel="power (W)")
    _from_zero(top)
    top.grid(True, alpha=0.3)
    bottom.set(
        title="Cumulative energy of the steps",
        xlabel="time since first run_start (s)",
        ylabel="energy (J)",
    )
    return _save(fig, bottom, path, legend=len(series) > 1)
