"""The FLOPs panel: achieved TFLOP/s, MFU under the convention the trainer recorded, tokens/s,
and device memory (measured peak and the compiled program's buffers)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from tui.run_state import RunState
from tui.widgets.stat import Stat


class FlopsPanel(Vertical):
    """Achieved model TFLOP/s (tokens/s x model FLOPs per token of the convention, all devices),
    MFU with its convention and the peak it divides by (or why there is none), tokens/s,
    device memory per device (the last step's measured peak, where the backend reports one,
    and the compiled program's).

    Args:
        id: the widget id.
    """

    def compose(self) -> ComposeResult:
        yield Stat("TFLOP/s", id="fl-tflops")
        yield Stat("MFU", id="fl-mfu")
        yield Stat("tokens/s", id="fl-tokens")
        yield Stat("FLOP/token", id="fl-per-token")
        yield Stat("memory", id="fl-memory")

    def show(self, state: RunState) -> None:
        per_token, tokens_per_s = state.flops_per_token, state.tokens_per_s
        achieved = None if not (per_token and tokens_per_s) else per_token * tokens_per_s / 1e12
        convention = state.mfu_convention or "?"
        self.query_one("#fl-tflops", Stat).show("-" if achieved is None else f"{achieved:.3f}")
        if state.mfu is not None:
            mfu = f"{state.mfu:.1%} ({convention} attention FLOPs, of {state.mfu_peak})"
        else:
            mfu = f"- ({state.mfu_reason})" if state.mfu_reason else "-"
        # shown whole (wrapped), not cut at the column's end: the peak, or why there is none
        self.query_one("#fl-mfu", Stat).show(mfu, wrap=True)
        self.query_one("#fl-tokens", Stat).show(
            "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"
        )
        self.query_one("#fl-per-token", Stat).show(
            "-" if per_token is None else f"{per_token:,.0f} ({convention})"
        )
        self.query_one("#fl-memory", Stat).show(_memory(state))


def _memory(state: RunState) -> str:
    peak, compiled = state.peak_memory_bytes, state.compiled_memory_bytes
    measured = "peak not reported" if peak is None else f"peak {peak / 1e9:,.2f} GB"
    program = "" if compiled is None else f" · compiled {compiled / 1e9:,.2f} GB"
    return measured + program
