"""The console's forms and narrow screens on the real console through Textual's pilot: the first
field focused, typed keys kept from bindings, refused characters told, ``n`` a new launch form."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from tui.app import TitanConsole
from tui.options import default_texts
from tui.screens.launch import LaunchScreen
from tui.screens.planner import PlannerScreen
from tui.widgets.option_input import OptionInput

SIZE = (80, 24)


def _first_field(screen) -> object:
    return screen.query(OptionInput).first().control


async def test_forms_open_with_their_first_field_focused(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        launch_focus, launch_first = app.focused, _first_field(app.screen)
        await pilot.press("ctrl+q")
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        planner_focus, planner_first = app.focused, _first_field(app.screen)
    assert launch_focus is launch_first
    assert planner_focus is planner_first


async def test_typing_in_the_planner_never_fires_a_binding(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        field = app.focused
        assert isinstance(field, Input)
        field.value = ""
        await pilot.press(*"tiny")
        await pilot.pause()
        screen, typed = app.screen, field.value
    assert isinstance(screen, PlannerScreen)
    assert typed == "tiny"


async def test_an_integer_field_refuses_letters_visibly(tmp_path: Path):
    app = TitanConsole(tmp_path, show_launch_form=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        steps = app.screen.query_one("#option-steps", OptionInput).control
        steps.value = "1"
        steps.focus()
        await pilot.press("end", "x", "2")
        await pilot.pause()
        value = steps.value
        notices = [n.message for n in app._notifications]
    assert value == "12"
    assert notices == ["--steps takes a whole number: character refused"]


async def test_n_opens_a_new_launch_form_over_a_resume_form(tmp_path: Path):
    app = TitanConsole(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        resume = LaunchScreen(tmp_path, resume=tmp_path / "old", texts=default_texts(tmp_path))
        app.push_screen(resume)
        await pilot.pause()
        app.set_focus(None)
        await pilot.press("n")
        await pilot.pause()
        screen = app.screen
    assert isinstance(screen, LaunchScreen)
    assert screen is not resume and screen.resume is None
