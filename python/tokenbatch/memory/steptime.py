"""The planner's step-time model: seconds per optimizer step of a parallel layout.

Evaluated in the Rust core over candidate layouts (every argument in ``c`` is an array).
Standard formulas on stated hardware figures (:class:`~tokenbatch.memory.hardware.Hardware`)
and two constants fitted once on 19 published runs (:mod:`tokenbatch.memory.steptime_fit`:
the efficiency large matmuls reach, the planner's default, and a fixed cost per layer
pass): matmuls by the roofline, element-wise kernels and the optimizer step at the HBM
bandwidth, the attention core, recomputation, the interleaved pipeline's bubble, and the
tensor-, context-, expert- and data-parallel collectives by NCCL's ring cost model on the
links their ranks share. ``docs/memory.md`` ("The step-time model") lists every formula,
its source and what is not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch.memory.hardware import HARDWARE_FIGURES, Hardware
from tokenbatch.memory.options import LAYOUT_FIELDS
from tokenbatch.memory.spec import ModelSpec
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD

__all__ = ["TIME_PARTS", "step_time"]

_F64 = npt.NDArray[np.float64]

_NAMES = _core.planner_names()
_TIME_PARTS, _CANDIDATE_FIELDS = _NAMES["time_parts"], _NAMES["candidate_fields"]

#: The parts of a step's time, in the order :func:`step_time` reports them.
TIME_PARTS: tuple[str, ...] = tuple(_TIME_PARTS)


def core_hardware(hw: Hardware) -> tuple[list[float], int]:
    """A :class:`Hardware`'s figures as the core takes them."""
    return [float(getattr(hw, name)) for name in HARDWARE_FIGURES], hw.gpus_per_node


def step_time(
    spec: ModelSpec,
    c: Mapping[str, _F64],
    *,
    hw: Hardware,
    seq_len: int,
    efficiency: float,
    inputs: Mapping[str, float],
    overlap_ep_comm: bool = False,
    deduplicated_dispatch: bool = False,
    layer_pass_overhead: float = LAYER_PASS_OVERHEAD,
    overlap_tax: float | None = None,
) -> dict[str, _F64]:
    """Seconds per step of each candidate in ``c``, split into :data:`TIME_PARTS`.

    ``c`` holds arrays ``dp``, ``tp``, ``pp``, ``cp``, ``ep``, ``vpp``, ``zero``,
    ``recompute`` (0 none, 1 selective, 2 full, 2 + the bits of Megatron-Core's modules:
    :data:`~tokenbatch.memory.recompute.RECOMPUTE_MODULES`), ``micro_batch``, ``grad_accum_steps``
    and the layers of the first, middle and last pipeline stages (``first_layers``,
    ``middle_layers``, ``last_layers``). ``inputs`` are the memory estimate's numeric
    options (:func:`~tokenbatch.memory.options.scalar_inputs`). ``layer_pass_overhead``
    is the fixed cost in seconds of one pass (forward or backward) of one layer over one
    micro-batch (default: the fitted
    :data:`~tokenbatch.memory.steptime_fit.LAYER_PASS_OVERHEAD`) and ``overlap_tax`` the
    share of a data-parallel collective hidden behind compute that still slows it (the
    model's 0.2 unless given). Also returns ``total`` and ``model_flops`` (per step, for
    MFU). The model runs in the Rust core, on all cores.
    """
    columns = [
        np.ascontiguousarray(c[name], dtype=np.float64).reshape(-1) for name in _CANDIDATE_FIELDS
    ]
    times: dict[str, _F64] = _core.planner_step_time(
        spec,
        columns,
        hardware=core_hardware(hw),
        seq_len=float(seq_len),
        options=[float(inputs[name]) for name in LAYOUT_FIELDS],
        constants=(efficiency, layer_pass_overhead, overlap_tax),
        overlap_ep_comm=bool(overlap_ep_comm),
        deduplicated_dispatch=bool(deduplicated_dispatch),
    )
    return times
