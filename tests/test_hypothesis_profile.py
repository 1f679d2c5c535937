"""The ``thorough`` hypothesis profile raises every property's budget to 10,000 examples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import THOROUGH_EXAMPLES, raise_budgets


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
        raise_budgets([SimpleNamespace(obj=check)])
        check()
    finally:
        settings.load_profile(active)
    assert len(calls) >= THOROUGH_EXAMPLES


def test_default_profile_keeps_each_test_budget() -> None:
    calls: list[int] = []
    check = _property(calls)
    if settings.default.max_examples <= settings.get_profile("default").max_examples:
        raise_budgets([SimpleNamespace(obj=check)])
        check()
        assert len(calls) <= 20
