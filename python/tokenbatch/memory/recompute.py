"""The names of the ``recompute`` option and their codes in the core.

Three modes (``none``, ``selective``, ``full``) and the modules of Megatron-Core's
selective recomputation (``recompute_modules``), each alone or several joined with ``+``
in any order and case: ``"core_attn+mlp"``. A set of modules is coded as 2 plus its bits,
so that ``core_attn`` alone, Megatron-Core's default, is 3.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["RECOMPUTE_MODES", "RECOMPUTE_MODULES", "RecomputeNames", "recompute_name"]

#: The plain modes and their codes.
RECOMPUTE_MODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}

#: Megatron-Core's ``recompute_modules`` the estimate models, each a bit of the code.
RECOMPUTE_MODULES: dict[str, int] = {
    "core_attn": 1,
    "mlp": 2,
    "layernorm": 4,
    "moe": 8,
    "shared_experts": 16,
    "mla_up_proj": 32,
    "moe_act": 64,
}

#: The code of the empty set of modules (which is no set: at least one is named).
_SET_BASE = 2
_SEPARATOR = "+"


def _code(name: str) -> int | None:
    """The code of a name in lowercase, or None."""
    mode = RECOMPUTE_MODES.get(name)
    if mode is not None:
        return mode
    bits = 0
    for part in name.split(_SEPARATOR):
        bit = RECOMPUTE_MODULES.get(part)
        if bit is None:
            return None
        bits |= bit
    return _SET_BASE + bits


def recompute_name(code: int) -> str:
    """The name of a ``recompute`` code: a mode, or the modules in the order of
    :data:`RECOMPUTE_MODULES` joined with ``+``."""
    for name, mode in RECOMPUTE_MODES.items():
        if mode == code:
            return name
    bits = code - _SET_BASE
    names = [name for name, bit in RECOMPUTE_MODULES.items() if bits & bit]
    if bits <= 0 or sum(RECOMPUTE_MODULES[name] for name in names) != bits:
        raise ValueError(f"no recompute mode has code {code}")
    return _SEPARATOR.join(names)


class RecomputeNames(Mapping[str, int]):
    """``recompute`` names (lowercase) to codes, sets of modules included; iterating
    gives the modes and the single modules, the names a grid's string column is matched
    against before it looks at sets (:attr:`sets`)."""

    #: How the choices read in an error message.
    choices = (
        f"{', '.join(RECOMPUTE_MODES)} or Megatron-Core modules "
        f"({', '.join(RECOMPUTE_MODULES)}) joined with '{_SEPARATOR}'"
    )

    def __getitem__(self, name: str) -> int:
        code = _code(name) if isinstance(name, str) else None
        if code is None:
            raise KeyError(name)
        return code

    def __iter__(self) -> Iterator[str]:
        yield from RECOMPUTE_MODES
        yield from RECOMPUTE_MODULES

    def __len__(self) -> int:
        return len(RECOMPUTE_MODES) + len(RECOMPUTE_MODULES)

    @property
    def sets(self) -> tuple[str, list[str], list[int], float]:
        """The sets of modules for the core's name matcher: separator, modules, bits and
        the code of the empty set."""
        return (
            _SEPARATOR,
            list(RECOMPUTE_MODULES),
            list(RECOMPUTE_MODULES.values()),
            float(_SET_BASE),
        )
