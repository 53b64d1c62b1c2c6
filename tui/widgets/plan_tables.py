"""The planner's results as tables: memory per device with the verdict, step time, totals, and
the ranked layouts of a search. Input: ``titan plan --json``'s plan dicts (bytes, seconds)."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from titan.formatting import format_amount, format_span
from tui.plain import short
from tui.widgets.plain_table import PlainTable

GB = 1e9


def _table(id: str, *columns: str) -> PlainTable:
    """A results table; a :class:`PlainTable` for its ``j``/``k``/``g``/``G`` keys."""
    table = PlainTable(id=id, cursor_type="row", zebra_stripes=True)
    table.add_columns(*columns)
    return table


def totals_rows(p: dict[str, Any]) -> list[tuple[str, str]]:
    """``(figure, value)`` of a plan's totals, as the Totals table shows them (written as
    ``titan plan`` writes them: :func:`titan.formatting.format_amount`, ``format_span``)."""
    cost = "-" if p["cost"] is None else format_amount(p["cost"])
    mfu = ", ".join(f"{k} {v:.1%}" for k, v in p["mfu"].items())
    return [
        ("layout", p["layout"]),
        ("tokens/s", f"{p['tokens_per_s']:,.0f}"),
        ("MFU", mfu),
        ("total time", format_span(p["total_s"])),
        (f"{p['device_unit']}-hours", format_amount(p["gpu_hours"])),
        ("energy", "-" if p["energy_kwh"] is None else f"{format_amount(p['energy_kwh'])} kWh"),
        ("cost (¤)", cost),  # ¤: the currency of --price (titan plan: "--price currency")
    ]


def wrapped_rows(rows: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """``(key, value)`` rows whose values are broken between words into lines of at most
    ``width`` cells, the lines after a value's first with an empty key; a word longer than
    ``width`` alone is cut, ending in "…". ``width`` 0 or less (not laid out yet): as they are.
    """
    if width <= 0:
        return rows
    wrapped = []
    for key, value in rows:
        lines = textwrap.wrap(value, width, break_long_words=False) or [value]
        for i, line in enumerate(lines):
            shown = line if cell_len(line) <= width else short(line, width)
            wrapped.append((key if i == 0 else "", shown))
    return wrapped


class PlanTables(VerticalScroll):
    """Verdict line, then the tables of the first plan, the ranking of a search, and the notes
    ``titan plan`` prints under its tables (the MFU's convention and peak, what would make a
    misfit fit)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="plan-verdict", markup=False)
        yield _table("plan-totals", "figure", "value")
        yield _table("plan-memory", "memory / device", "GB")
        yield _table("plan-step", "step time", "s")
        # tokens/s and time first: the layout is the widest cell, and at 80 columns the
        # panel shows about 36 cells (the best layout is in full in the totals above).
        yield _table("plan-ranked", "tokens/s", "time", "layout", "fits", "GPU-h", "cost")
        yield Static("", id="plan-notes", markup=False)

    _shown: dict[str, Any] | None = None  # the report drawn, drawn again at a new width

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(self._shown)

    def show(self, report: dict[str, Any]) -> None:
        """Draw a :func:`tui.planner_form.plan_report`."""
        self._shown = report
        plans = report["plans"]
        verdict = self.query_one("#plan-verdict", Static)
        ranked = self.query_one("#plan-ranked", DataTable)
        ranked.display = report["search"]
        for table in self.query(DataTable):
            table.clear()
        self.query_one("#plan-notes", Static).update("")
        if not plans:
            verdict.update(report["none_fit"])
            verdict.set_class(True, "-bad")
            return
        p = plans[0]
        verdict.update(
            report["verdict"]
            + (f" · best of {report['layouts_fit']} layouts that fit" if report["search"] else "")
        )
        verdict.set_class(not p["fits"], "-bad")
        self.query_one("#plan-notes", Static).update("\n".join(report["notes"]))
        totals = totals_rows(p)
        # whole words at any width: the value column gets what the figure column leaves
        room = (
            self.size.width
            - self.styles.gutter.width
            - self.styles.scrollbar_size_vertical
            - max(cell_len(figure) for figure, _ in totals)
            - 4  # the two columns' cell padding
        )
        self.query_one("#plan-totals", DataTable).add_rows(wrapped_rows(totals, room))
        memory = self.query_one("#plan-memory", DataTable)
        memory.add_rows((k, f"{v / GB:,.2f}") for k, v in p["memory_bytes"].items())
        self.query_one("#plan-step", DataTable).add_rows(
            (k, f"{v:.4g}") for k, v in p["step_s"].items()
        )
        if report["search"]:
            ranked.clear(columns=True)  # the hours column named for the plan's devices
            ranked.add_columns(
                "tokens/s", "time", "layout", "fits", f"{p['device_unit']}-h", "cost"
            )
            ranked.add_rows(
                (
                    f"{q['tokens_per_s']:,.0f}",
                    format_span(q["total_s"]),
                    q["layout"],
                    "yes" if q["fits"] else "no",
                    format_amount(q["gpu_hours"]),
                    "-" if q["cost"] is None else format_amount(q["cost"]),
                )
                for q in plans
            )
