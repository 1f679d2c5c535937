"""The ``thorough`` hypothesis profile raises every property's budget to 10,000 examples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conftest import THOROUGH_EXAMPLES, pytest_collection_modifyitems
from hypothesis import given, settings
from hypothesis import strategies as st


def _property(counter: list[int]) -> Any:
    @settings(max_examples=20, deadline=None)
    @given(st.integers())
    def check(value: int) -> None:
        counter.append(value)

    return check


def test_thorough_profile_runs_10000_examples_despite_a_test_budget() -> None:
    active = settings.get_current_profile_name()
    calls: list[int] = []
    check = _property(calls)
    try:
        settings.load_profile("thorough")
        pytest_collection_modifyitems([SimpleNamespace(obj=check)])  # type: ignore[list-item]
        check()
    finally:
        settings.load_profile(active)
    assert len(calls) >= THOROUGH_EXAMPLES


def test_default_profile_keeps_each_test_budget() -> None:
    calls: list[int] = []
    check = _property(calls)
    if settings.default.max_examples <= settings.get_profile("default").max_examples:
        pytest_collection_modifyitems([SimpleNamespace(obj=check)])  # type: ignore[list-item]
        check()
        assert len(calls) <= 20
