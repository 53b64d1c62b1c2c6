"""ETTR and goodput of constructed multi-attempt runs, against values computed by hand."""

from __future__ import annotations

import copy

import pytest
from records import crash_then_resume, run_event

from titan.analysis import ettr
from titan.analysis.ettr import RUNNING_WINDOW_S
from titan.telemetry.events import parse_events


def analyze(lines: list[dict], now: float | None = None) -> ettr.Goodput:
    """:func:`ettr.analyze` of JSON lines, parsed as a reader parses them."""
    return ettr.analyze(parse_events(lines)[0], now)


def test_ettr_and_badput_of_a_crash_and_resume_match_hand_computation():
    g = analyze(crash_then_resume())
    assert [a.status for a in g.attempts] == ["crashed", "completed"]
    assert g.available_s == pytest.approx(16.5 + 12.5)
    # Steps 1-2 of attempt 0 (1.0 + 1.0) and steps 3-6 of attempt 1 (1.0 + 1.0 + 1.0 + 1.0).
    assert g.productive_s == pytest.approx(6.0)
    assert g.ettr == pytest.approx(6.0 / 29.0)
    assert g.goodput == pytest.approx(6.0 / 29.0)
    assert g.badput_s == pytest.approx(
        {
            "initialization": 2.0,
            "compilation": 15.0,
            "data_wait": 0.25,
            "checkpoint_save": 1.0,
            "checkpoint_restore": 3.0,
            "eval": 0.0,
            "lost_progress": 1.0 + 0.75,  # attempt 0's steps 3 and 4, redone in attempt 1
            "other": 0.0,
        },
        abs=1e-9,
    )
    assert g.restarts == 1
    assert g.restart_gap_s == pytest.approx(83.5)
    assert [a.surviving_upto for a in g.attempts] == [2, 6]
    assert sum(a.stalls for a in g.attempts) == 1
    assert g.data_wait_recorded
    assert sum(g.as_dict()["badput"].values()) + g.ettr == pytest.approx(1.0)


def test_final_crashed_attempt_keeps_only_steps_up_to_its_last_checkpoint():
    events = [
        run_event("run_start", 0.0, start_step=0, resumed_from_step=None),
        run_event("compile", 3.0, seconds=2.0),
        run_event("step", 4.0, step=1, step_time_s=1.0),
        run_event("checkpoint", 4.5, step=1, seconds=0.5),
        run_event("step", 6.0, step=2, step_time_s=1.5),
        run_event("step", 8.0, step=3, step_time_s=2.0),
    ]
    g = analyze(events)
    assert g.attempts[0].status == "crashed"
    assert g.productive_s == pytest.approx(1.0)
    assert g.badput_s["lost_progress"] == pytest.approx(1.0 + 2.0)
    assert g.badput_s["initialization"] == pytest.approx(1.0)
    assert g.ettr == pytest.approx(1.0 / 8.0)
    assert not g.data_wait_recorded


def test_resume_from_an_older_checkpoint_loses_the_steps_after_it_in_every_attempt():
    """Attempt 1 resumed from 2 and crashed at 5 (checkpoint 4 unusable); attempt 2 resumed from
    step 2 again: steps 3-5 of attempt 1 and 3-4 of attempt 0 are lost, each step counts once."""
    events = [
        run_event("run_start", 0.0, start_step=0),
        *[run_event("step", float(s), step=s, step_time_s=1.0) for s in (1, 2, 3, 4)],
        run_event("run_start", 10.0, start_step=2, resumed_from_step=2),
        *[run_event("step", 10.0 + s, step=s, step_time_s=1.0) for s in (3, 4, 5)],
        run_event("run_start", 20.0, start_step=2, resumed_from_step=2),
        *[run_event("step", 20.0 + s - 2, step=s, step_time_s=1.0) for s in (3, 4, 5, 6)],
        run_event("run_end", 24.0, status="stopped", step=6),
    ]
    g = analyze(events)
    assert [a.surviving_upto for a in g.attempts] == [2, 2, 6]
    assert [a.productive_s for a in g.attempts] == [2.0, 0.0, 4.0]
    assert g.badput_s["lost_progress"] == pytest.approx(2.0 + 3.0)
    assert g.restarts == 2


def test_no_run_start_gives_no_ettr():
    g = analyze([run_event("step", 1.0, step=1, step_time_s=1.0), {"type": "step", "time": "x"}])
    assert g.attempts == [] and g.ettr is None


def test_a_recent_last_attempt_without_run_end_is_running_and_loses_nothing():
    events = crash_then_resume()[:8]  # attempt 0 only: steps 1-4, checkpoint at 2, no run_end
    end = events[-1]["time"]
    running = analyze(events, now=end + 10.0)
    crashed = analyze(events, now=end + RUNNING_WINDOW_S + 1.0)
    assert [a.status for a in running.attempts] == ["running"]
    assert running.badput_s["lost_progress"] == 0.0
    assert [a.status for a in crashed.attempts] == ["crashed"]
    # Steps 3 (1.5 s less the 0.5 s save of step 2) and 4 (1.0 s less 0.25 s data wait).
    assert crashed.badput_s["lost_progress"] == pytest.approx(1.0 + 0.75)


def test_a_failed_save_is_badput_but_no_checkpoint_to_survive_on():
    """Step 2's save failed after the loop waited 0.5 s for it; the attempt crashed after step
    3: only step 1, saved, survives, and the failed save's wait is checkpoint badput."""
    events = [
        run_event("run_start", 0.0, start_step=0, resumed_from_step=None),
        run_event("step", 1.0, step=1, step_time_s=1.0),
        run_event("checkpoint", 1.2, step=1, seconds=0.2, commit_s=0.9, asynchronous=True),
        run_event("step", 2.2, step=2, step_time_s=1.2),
        run_event("checkpoint_failed", 2.7, step=2, seconds=0.5, commit_s=1.0, error="OSError"),
        run_event("step", 4.2, step=3, step_time_s=1.5),
    ]
    g = analyze(events)
    assert g.attempts[0].last_checkpoint == 1
    assert g.badput_s["checkpoint_save"] == pytest.approx(0.2 + 0.5)
    assert g.productive_s == pytest.approx(1.0)
    assert g.badput_s["lost_progress"] == pytest.approx((1.2 - 0.2) + (1.5 - 0.5))


def remat_auto_run(**start_fields) -> list[dict]:
    """A two-step run whose ``--remat auto`` compilation (26 s) was made before ``run_start``
    and recorded, with the finite check's (0.5 s), just after it; step 1 starts at 4.0."""
    return [
        run_event("run_start", 0.0, start_step=0, **start_fields),
        run_event("compile", 0.5, what="train_step", seconds=26.0),
        run_event("compile", 0.6, what="finite_check", seconds=0.5),
        run_event("step", 5.0, step=1, step_time_s=1.0),
        run_event("step", 6.0, step=2, step_time_s=1.0),
        run_event("run_end", 6.0, status="completed", step=2),
    ]


def test_a_compilation_made_before_run_start_is_outside_the_attempt():
    """Recorded without ``setup_start``: the 26 s reach back before the attempt, which leaves
    them out. The 4 s up to step 1's start, less the finite check's compilation, are
    initialization; no badput is negative."""
    g = analyze(remat_auto_run())
    assert g.badput_s["compilation"] == pytest.approx(0.5)
    assert g.attempts[0].startup_compile_s == pytest.approx(26.0)
    assert g.badput_s["initialization"] == pytest.approx(3.5)
    assert g.badput_s["other"] == pytest.approx(0.0)
    assert min(g.badput_s.values()) >= 0
    assert g.ettr == pytest.approx(2.0 / 6.0)


def test_an_attempt_counts_from_its_setup_start_where_the_record_has_it():
    """Recorded with ``setup_start``, 28 s before run_start: the 26 s compilation reaching back
    before run_start is inside the attempt, compilation badput, and the 32 s to step 1's start
    less both compilations are initialization."""
    events = remat_auto_run(setup_start=-28.0, process={"started": -29.0})
    g = analyze(events)
    assert g.available_s == pytest.approx(34.0)
    assert g.badput_s["compilation"] == pytest.approx(26.5)
    assert g.badput_s["initialization"] == pytest.approx(5.5)
    assert g.badput_s["other"] == pytest.approx(0.0)
    assert g.attempts[0].startup_compile_s == 0.0
    assert g.ettr == pytest.approx(2.0 / 34.0)


@pytest.mark.parametrize(
    "setup_start, started",
    [
        (3.0, -29.0),  # after run_start
        (-28.0, -20.0),  # before its own process started
        (-28.0, None),  # no process start to hold it against
        (float("-inf"), -29.0),
        (float("nan"), -29.0),
        ("soon", -29.0),
        (-28.0, float("nan")),
    ],
)
def test_a_setup_start_that_cannot_be_believed_leaves_the_attempt_at_run_start(
    setup_start, started
):
    g = analyze(remat_auto_run(setup_start=setup_start, process={"started": started}))
    assert g.available_s == pytest.approx(6.0)
    assert g.badput_s["compilation"] == pytest.approx(0.5)


def test_a_resumed_attempt_never_starts_before_the_previous_one_ended():
    events = [
        *remat_auto_run(setup_start=-28.0, process={"started": -29.0})[:-1],  # crashed at 6.0
        run_event("run_start", 20.0, start_step=0, setup_start=5.0, process={"started": 4.0}),
        run_event("step", 21.0, step=1, step_time_s=1.0),
    ]
    g = analyze(events)
    assert [a.start for a in g.attempts] == [-28.0, 20.0]
    assert g.restart_gap_s == pytest.approx(14.0)


def test_durations_that_are_not_finite_positive_numbers_count_as_zero():
    events = remat_auto_run()
    events[2]["seconds"] = -5.0
    events[3]["step_time_s"] = float("nan")
    g = analyze(events)
    assert g.badput_s["compilation"] == 0.0
    assert g.badput_s["initialization"] == pytest.approx(5.0)
    assert all(v == v and v >= 0 for v in g.badput_s.values())


def test_a_pinned_host_reservation_is_checkpoint_badput_not_initialization():
    """A fresh attempt: compile 4 s ending at 1005, a 6 s reservation ending at 1011, steps 1
    and 2 of 1 s (step 1 starts at 1011), a 0.5 s final save. Initialization is what is left
    of the 11 s before step 1: 11 - 4 - 6 = 1; checkpoint badput 6 + 0.5."""
    events = [
        run_event("run_start", 1000.0, start_step=0, resumed_from_step=None, total_steps=2),
        run_event("compile", 1005.0, what="train_step", seconds=4.0),
        run_event("pinned_host", 1011.0, bytes=1 << 30, seconds=6.0),
        run_event("step", 1012.0, step=1, step_time_s=1.0, loss=5.0),
        run_event("step", 1013.0, step=2, step_time_s=1.0, loss=4.0),
        run_event("checkpoint", 1013.5, step=2, seconds=0.5, path="c/2"),
        run_event("run_end", 1013.5, status="completed", step=2, reason=None),
    ]
    g = analyze(events)
    assert g.available_s == pytest.approx(13.5)
    assert g.badput_s["initialization"] == pytest.approx(1.0)
    assert g.badput_s["compilation"] == pytest.approx(4.0)
    assert g.badput_s["checkpoint_save"] == pytest.approx(6.5)
    assert g.badput_s["other"] == pytest.approx(0.0)
    assert g.ettr == pytest.approx(2.0 / 13.5)


def test_a_pinned_host_reservation_after_the_first_step_is_in_no_step():
    """A 6 s reservation between steps 1 and 2, in no step's time (step 2 took 1 s after it):
    initialization 1005 - 1000 - 4 = 1 s, productive 2 s, checkpoint badput 6 + 0.5."""
    events = [
        run_event("run_start", 1000.0, start_step=0, resumed_from_step=None, total_steps=2),
        run_event("compile", 1005.0, what="train_step", seconds=4.0),
        run_event("step", 1006.0, step=1, step_time_s=1.0, loss=5.0),
        run_event("pinned_host", 1012.0, bytes=1 << 30, seconds=6.0),
        run_event("step", 1013.0, step=2, step_time_s=1.0, loss=4.0),
        run_event("checkpoint", 1013.5, step=2, seconds=0.5, path="c/2"),
        run_event("run_end", 1013.5, status="completed", step=2, reason=None),
    ]
    g = analyze(events)
    assert g.badput_s["initialization"] == pytest.approx(1.0)
    assert g.badput_s["checkpoint_save"] == pytest.approx(6.5)
    assert g.productive_s == pytest.approx(2.0)
    assert g.badput_s["other"] == pytest.approx(0.0)


def test_a_clock_set_back_during_an_attempt_leaves_ettr_unknown_not_above_one():
    events = crash_then_resume()[8:]  # attempt 1 alone: wall 12.5 s, productive 4.0 s
    assert analyze(events).clock_believed and analyze(events).ettr == pytest.approx(4.0 / 12.5)
    for e in events[1:]:  # the clock set back 10 s after run_start
        e["time"] -= 10.0
    g = analyze(events)
    assert g.available_s < g.productive_s  # the ratio a naive reader prints: above 100%
    assert (g.clock_believed, g.ettr, g.goodput) == (False, None, None)
    assert g.as_dict()["clock_believed"] is False


def test_a_step_event_written_late_with_the_next_is_not_taken_for_its_steps_end():
    events = crash_then_resume()[8:]  # attempt 1 alone: restore 3 s, steps 3-6
    late = copy.deepcopy(events)
    late[2]["time"] = late[4]["time"]  # step 3's event flushed with step 4's, as a stop does
    for g in (analyze(events), analyze(late)):
        assert g.attempts[0].restore_s == pytest.approx(3.0)  # not 3 + step 4's 1 s
        assert g.badput_s["other"] == pytest.approx(0.0) and g.clock_believed
        assert g.ettr == pytest.approx(4.0 / 12.5)


def test_a_clock_within_its_slack_is_believed():
    events = crash_then_resume()[8:]
    # the clock set back 3.5 s after step 3: the first step's start 3.5 s earlier by the later
    # steps, its 3 s restore none, and the durations 0.5 s beyond the wall time (within
    # CLOCK_SLACK_S)
    for e in events[3:]:
        e["time"] -= 3.5
    g = analyze(events)
    assert g.attempts[0].restore_s == 0.0
    assert g.attempts[0].other_s == pytest.approx(-0.5) and g.clock_believed
    assert g.ettr == pytest.approx(g.productive_s / g.available_s)
    assert g.badput_s["other"] == 0.0  # never a negative badput


def test_an_unreadable_duration_leaves_ettr_unknown_not_zero():
    events = crash_then_resume()[8:]
    assert analyze(events).ettr == pytest.approx(4.0 / 12.5)
    for bad in (-1.0, -1e-9):  # NaN, inf: None when read (titan.telemetry.events)
        corrupt = copy.deepcopy(events)
        next(e for e in corrupt if e["type"] == "step")["step_time_s"] = bad
        g = analyze(corrupt)
        assert (g.ettr, g.goodput, g.unreadable) == (None, None, 1), bad
        assert g.as_dict()["unreadable_durations"] == 1
    missing = copy.deepcopy(events)
    next(e for e in missing if e["type"] == "compile")["seconds"] = None
    assert analyze(missing).ettr is not None and analyze(missing).unreadable == 0
