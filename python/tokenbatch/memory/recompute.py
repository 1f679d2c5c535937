"""The names of the ``recompute`` option, as the core's ``Recompute`` defines them.

Three modes (``none``, ``selective``, ``full``) and the modules of Megatron-Core's
selective recomputation (``recompute_modules``), each alone or several joined with ``+``
in any order and case: ``"core_attn+mlp"``. A set of modules is coded as 2 plus its bits,
so that ``core_attn`` alone, Megatron-Core's default, is 3.
"""

from __future__ import annotations

from tokenbatch import _core

__all__ = ["RECOMPUTE_MODES", "RECOMPUTE_MODULES", "recompute_name"]

#: The plain modes and their codes.
RECOMPUTE_MODES: dict[str, int] = {
    name: int(code) for name, code in _core.memory_option_choices("recompute")
}

#: Megatron-Core's ``recompute_modules`` the estimate models, each a bit of the code.
RECOMPUTE_MODULES: dict[str, int] = dict(_core.memory_recompute_modules())


def recompute_name(code: int) -> str:
    """The name of a ``recompute`` code: a mode, or the modules in the order of
    :data:`RECOMPUTE_MODULES` joined with ``+``."""
    name = _core.memory_recompute_name(code)
    if name is None:
        raise ValueError(f"no recompute mode has code {code}")
    return name
