"""The power panel: watts per device against the board power (TDP), energy so far, joules per
token and a sparkline of the power of recent steps."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from tui.run_state import RunState
from tui.widgets.sparkline import ColumnSparkline
from tui.widgets.stat import Stat, tone_of

# Fractions of TDP where the watts turn yellow and red (nvitop's thresholds are the same idea).
WARN_OF_TDP, HOT_OF_TDP = 0.8, 0.95
# Steps in the sparkline.
SPARK_STEPS = 120


class PowerPanel(Vertical):
    """Average watts per device of the last step (its ``energy_j`` over ``step_time_s``, split
    over the devices the layout uses), energy, J/token and tokens/J.

    Args:
        id: the widget id.
    """

    def compose(self) -> ComposeResult:
        yield Stat("per device", id="pw-watts")
        yield Stat("energy", id="pw-energy")
        yield Stat("J/token", id="pw-jpt")
        yield Stat("source", id="pw-source")
        yield ColumnSparkline([], id="pw-spark")

    def show(self, state: RunState) -> None:
        watts = self.query_one("#pw-watts", Stat)
        devices = state.devices or 1
        if state.power_w:
            per_device = state.power_w[-1] / devices
            if state.tdp_w:
                fraction = per_device / state.tdp_w
                watts.show(
                    f"{per_device:,.0f} W of {state.tdp_w:,.0f} W TDP ({fraction:.0%}) x {devices}",
                    tone_of(fraction, WARN_OF_TDP, HOT_OF_TDP),
                )
            else:
                watts.show(f"{per_device:,.0f} W x {devices} (no TDP in the catalog)")
        else:
            watts.show("-")
        energy = state.energy_j
        self.query_one("#pw-energy", Stat).show(
            "-" if energy is None else f"{energy / 3.6e6:.4f} kWh ({energy:,.0f} J)"
        )
        jpt = energy / state.energy_tokens if energy and state.energy_tokens else None
        self.query_one("#pw-jpt", Stat).show(
            "-" if not jpt else f"{jpt:.4g} J/token · {1 / jpt:,.1f} tokens/J over the run"
        )
        self.query_one("#pw-source", Stat).show(
            "measured" if energy is not None else f"none: {state.power_reason or 'no reading yet'}",
            wrap=energy is None,  # why there is none, whole
        )
        self.query_one(ColumnSparkline).data = list(state.power_w)[-SPARK_STEPS:]
