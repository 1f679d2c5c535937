"""What a Hugging Face model needs besides a packed row's tensors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def without_cache(model: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with ``use_cache=False`` for a model whose config has a cache setting.

    Hugging Face models keep attention inside each document of a packed row (read from
    its ``position_ids``) only when they build no key/value cache; with the default
    ``use_cache=True`` the documents of a row attend to each other under sdpa and eager
    attention, in training as in evaluation.
    """
    if getattr(getattr(model, "config", None), "use_cache", None) is None:
        return dict(inputs)
    return {**inputs, "use_cache": False}
