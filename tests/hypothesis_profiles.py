"""The hypothesis profiles of the test suite (registered when imported; ``conftest.py``
loads the one ``TOKENBATCH_HYPOTHESIS_PROFILE`` names). A module of its own because
``tests/`` and ``benches/`` both have a ``conftest`` module, so importing from
``conftest`` reaches whichever pytest loaded last."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, settings

PROFILE_VARIABLE = "TOKENBATCH_HYPOTHESIS_PROFILE"
THOROUGH_EXAMPLES = 10_000

settings.register_profile(
    "thorough",
    max_examples=THOROUGH_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def raise_budgets(items: Iterable[Any]) -> None:
    """Under a profile with more examples than ``default``, raise each collected
    property's own ``max_examples`` to the profile's where it is lower."""
    floor = settings.default.max_examples
    if floor <= settings.get_profile("default").max_examples:
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples < floor:
            # Hypothesis reads this attribute when the test runs (its own settings).
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                own,
                max_examples=floor,
                deadline=None,
                suppress_health_check=[*own.suppress_health_check, HealthCheck.too_slow],
            )
