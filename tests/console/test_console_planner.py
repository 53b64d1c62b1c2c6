"""The console's planner says what ``titan plan`` says for the same options: its totals as the
command writes them, a misfit offered to no launch, a search's refusals and its GPUs needed, and
a bad field's error kept on show while the focus moves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from console_helpers import fill_form, open_planner, wait_until
from textual.widgets import DataTable, Static

from titan.cli import main
from titan.errors import TitanError
from tui.app import TitanConsole
from tui.planner_form import plan_argv, plan_options, plan_report, start_texts
from tui.widgets.plan_tables import PlanTables, totals_rows

# A budget of 1e7 tokens: under a minute on 8 GPUs, fractions of a GPU-hour and of a kWh.
SMALL = {
    "model": "llama3-1b",
    "gpu": "h100",
    "gpus": "8",
    "fsdp": "8",
    "microbatches": "4",
    "remat": "full",
    "tokens": "1e7",
    "price": "2.5",
}
# llama3-1b unsharded on 8 GPUs: does not fit (its optimizer state alone fills an H100).
MISFIT = {**SMALL, "fsdp": "1", "microbatches": "1", "tokens": "1e9", "remat": "auto"}


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _cli_totals(out: str) -> dict[str, str]:
    """The rows of ``titan plan``'s tables (``│ quantity │ value │``): quantity -> value."""
    rows = (line.split("│")[1:-1] for line in out.splitlines() if line.count("│") == 3)
    return {name.strip(): value.strip() for name, value in rows}


def test_the_planners_totals_are_written_as_titan_plan_writes_them(capsys):
    texts = {**start_texts(), **SMALL}
    code, out, _ = _cli(plan_argv(texts), capsys)
    cli = _cli_totals(out)
    form = dict(totals_rows(plan_report(texts)["plans"][0]))
    assert code == 0
    assert cli["total time"].endswith(" s") and cli["GPU-hours"].startswith("0.0")
    assert form["total time"] == cli["total time"]
    assert form["GPU-hours"] == cli["GPU-hours"]
    assert form["energy"] == f"{cli['energy (kWh)']} kWh"
    assert form["cost (¤)"] == cli["cost (--price currency)"]  # its unit named
    tpu = {**texts, "gpu": "v5e", "gpus": "8"}  # a TPU slice counts chip-hours, as the CLI
    code, out, _ = _cli(plan_argv(tpu), capsys)
    form = dict(totals_rows(plan_report(tpu)["plans"][0]))
    assert form["chip-hours"] == _cli_totals(out)["chip-hours"] and "GPU-hours" not in form


def test_a_plan_that_does_not_fit_offers_no_train_options_as_titan_plan_prints_no_command(
    capsys,
):
    texts = {**start_texts(), **MISFIT}
    code, out, _ = _cli(plan_argv(texts), capsys)
    report = plan_report(texts)
    assert code == 1 and "does not fit" in out and "titan train" not in out
    assert not report["plans"][0]["fits"]
    assert report["train_options"] is None


def _said(out: str) -> str:
    """``titan plan``'s output with its tables' borders and line breaks taken out: the words of
    its captions and lines, wherever the table cut them."""
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘━─┳┻╇╈┼]", " ", out).split())


def test_the_planner_notes_say_what_titan_plan_says_under_its_tables(capsys):
    code, out, _ = _cli(plan_argv({**start_texts(), **MISFIT}), capsys)
    report = plan_report({**start_texts(), **MISFIT})
    notes = report["notes"]
    assert code == 1 and report["verdict"] in _said(out) and "GB over the" in report["verdict"]
    assert notes[0].endswith("of the peak per GPU: 989.5 TFLOP/s dense bfloat16")
    assert notes[1].startswith("eta = ") and notes[2] == "would fit with:" and notes[3:]
    for note in notes:
        assert " ".join(note.split()) in _said(out)


def test_a_budget_past_the_steps_limit_of_titan_train_gets_no_command_and_says_why(capsys):
    texts = {**start_texts(), **SMALL, "tokens": "1e20"}
    code, out, _ = _cli(plan_argv(texts), capsys)
    report = plan_report(texts)
    assert code == 0 and "titan train --" not in out
    refusal = "above titan train's --steps limit of 2,147,483,647"
    assert refusal in out and refusal in report["notes"][-1]
    assert report["train_options"] is None
    assert main(["plan", *plan_argv(texts), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["train_command"] is None and refusal in said["no_train_command"]


def test_a_batch_past_two_to_the_forty_tokens_is_one_line_exit_2(capsys):
    texts = {**start_texts(), **SMALL, "batch_tokens": str(2**40 + 8192)}
    code, _, err = _cli(plan_argv(texts), capsys)
    with pytest.raises(TitanError) as refused:
        plan_report(texts)
    assert code == 2 and err == f"titan plan: error: {refused.value}\n"
    assert str(refused.value) == (
        "--batch-tokens must be <= 1,099,511,627,776 (2^40), got 1,099,511,635,968"
    )
    code, _, err = _cli([*plan_argv(SMALL), "--batch-size", str(2**40)], capsys)
    assert code == 2 and err == (
        "titan plan: error: --batch-size 1,099,511,627,776 x --seq-len 8,192 must be <= "
        "1,099,511,627,776 tokens (2^40), got 9,007,199,254,740,992\n"
    )


@pytest.mark.parametrize(
    "texts",
    [
        {"model": "llama3-8b", "gpus": "7"},  # no layout splits 8B and the batch over 7 GPUs
        {"model": "llama3-8b", "gpus": "0"},
    ],
)
def test_a_search_the_command_refuses_is_refused_by_the_form_in_the_same_words(texts, capsys):
    form_texts = {**start_texts(), **texts, "search": "1"}
    code, _, err = _cli(plan_argv(form_texts), capsys)
    with pytest.raises(TitanError) as refused:
        plan_report(form_texts)
    assert code == 2
    assert err.strip() == f"titan plan: error: {refused.value}"


def test_a_search_that_finds_no_layout_names_the_gpus_needed_as_titan_plan_does(capsys):
    texts = {**start_texts(), "model": "llama3-70b", "gpus": "8", "search": "1"}
    code, out, _ = _cli(plan_argv(texts), capsys)
    report = plan_report(texts)
    assert code == 1
    assert report["plans"] == [] and report["train_options"] is None
    assert "GPUs would be needed" in report["none_fit"]
    assert report["none_fit"] in " ".join(out.split())


def test_the_form_leaves_out_the_output_options_of_titan_plan():
    dests = {option.dest for option in plan_options()}
    assert not dests & {"json", "top", "wide"}
    assert {"search", "gpus", "tokens"} <= dests


async def test_ctrl_t_sends_no_plan_that_does_not_fit(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        planner = await open_planner(app, pilot)
        fill_form(app, MISFIT)
        verdict = planner.query_one("#plan-verdict", Static)
        shown = lambda: planner.current and str(verdict.render()).startswith("does not fit")  # noqa: E731
        await wait_until(pilot, shown, lambda: str(verdict.render()), 30)
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        screen = app.screen
    assert screen is planner


async def test_a_bad_fields_error_stays_on_show_while_the_focus_moves(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        planner = await open_planner(app, pilot)
        fill_form(app, {"gpus": "abc"})
        help_line = planner.query_one("#plan-help", Static)
        await wait_until(pilot, lambda: "--gpus" in str(help_line.render()), lambda: "no error", 30)
        error = str(help_line.render())
        await pilot.press("tab", "tab")
        await pilot.pause(0.2)
        after_tab = str(help_line.render())
        fill_form(app, {"gpus": "64"})
        await wait_until(pilot, lambda: planner.current, lambda: "no plan again", 30)
        stale = planner.query_one(PlanTables).has_class("-stale")
        rows = planner.query_one("#plan-totals", DataTable).row_count
    assert "invalid int value: 'abc'" in error
    assert after_tab == error
    assert not stale and rows > 0
