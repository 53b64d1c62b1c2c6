"""The test suite's filing: every test file in a level folder whose name is a registered marker
(tests/conftest.py marks each test by its folder), and no two test files of one name (pytest
imports them by file name: tests/ has no packages)."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def test_a_test_carries_the_marker_of_its_level_folder(request: pytest.FixtureRequest):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("console") is None


def test_every_level_folder_is_a_marker_of_pyproject():
    folders = {path.parent.name for path in TESTS.glob("*/test_*.py")}
    pytest_options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]
    registered = {line.split(":")[0] for line in pytest_options["ini_options"]["markers"]}
    assert folders == registered - {"slow"}
    assert not list(TESTS.glob("test_*.py")), "a test file goes in a level folder of tests/"


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
