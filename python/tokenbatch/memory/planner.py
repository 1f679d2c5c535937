"""Parallel-layout planning: enumerate the layouts that fit, rank them by estimated step time.

The planner, in the Rust core, enumerates data, tensor, pipeline (with interleaving),
context and expert parallelism, the ZeRO stage, recomputation and the micro-batch size;
estimates the memory of the candidates (pipeline stages split to balance their compute, so
that 61 or 126 layers split over 16 stages); keeps those within ``usable_fraction`` of the
GPU's memory; and ranks them by the step-time model of
:mod:`tokenbatch.memory.steptime` on a :class:`~tokenbatch.memory.hardware.Hardware`.
Sequence parallelism is on whenever tensor parallelism is, tensor parallelism stays
within a node, context parallelism is at most 32-way and ZeRO-2 and -3 are not combined with
pipeline parallelism (Megatron-LM and DeepSpeed do not support it): bounds of the search,
not of the model. :meth:`PlannedLayout.explain` shows where each candidate's time goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tokenbatch import _core
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError
from tokenbatch.memory.hardware import Hardware
from tokenbatch.memory.options import LAYOUT_FIELDS, scalar_inputs
from tokenbatch.memory.results import GIB
from tokenbatch.memory.spec import ModelSpec
from tokenbatch.memory.steptime import TIME_PARTS, core_hardware
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD, MATMUL_EFFICIENCY

__all__ = ["PlannedLayout", "plan_layouts"]

# The recomputation modes `plan_layouts` considers unless told otherwise.
_DEFAULT_RECOMPUTE = ("none", "selective", "full")
#: The layout fields the plan chooses itself, so ``options`` must not name them.
_CHOSEN = frozenset(_core.planner_names()["chosen"])

_PART_TEXT = {
    "compute": "matmuls and attention, forward, backward and recomputation (roofline)",
    "elementwise": "norms, activations, residual adds and the loss, at HBM bandwidth",
    "overhead": "kernel launches and synchronizations, per layer pass",
    "optimizer": "the optimizer step over the local shard, at HBM bandwidth",
    "bubble": "pipeline fill and drain: (pp - 1) / vpp micro-batch times",
    "tp_comm": "tensor-parallel all-gathers and reduce-scatters, 8 per layer (12 recomputed)",
    "cp_comm": "context-parallel key/value ring not hidden by the attention core",
    "ep_comm": "expert-parallel all-to-all dispatch and combine, forward and backward",
    "pp_comm": "pipeline activations and gradients between stages",
    "dp_comm": "data-parallel gradient reduction and weight gathers not hidden by compute",
}


@dataclasses.dataclass(frozen=True)
class PlannedLayout:
    """One layout that fits, with its estimated memory and speed.

    ``num_gpus = dp * tp * pp * cp``; experts are sharded over ``ep`` ranks inside
    ``dp * cp``. ``micro_batch`` sequences per micro-batch, ``grad_accum_steps``
    micro-batches per step, so ``dp * micro_batch * grad_accum_steps`` sequences per step.
    ``vpp`` model chunks per pipeline stage (interleaved 1F1B when > 1) and
    ``stage_layers`` the layers of each stage, split by the rule ``pipeline_split`` and the
    explicit ``first_stage_layers``/``last_stage_layers`` (see
    :func:`~tokenbatch.estimate_memory`). ``time_parts`` splits ``step_time``
    (seconds) into compute, bubble and exposed communication of each kind.
    """

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    micro_batch: int
    grad_accum_steps: int
    memory: int
    step_time: float
    mfu: float
    tokens_per_second: float
    time_parts: dict[str, float]
    vpp: int = 1
    stage_layers: tuple[int, ...] = ()
    pipeline_split: str = "even"
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    hardware: str = "h100"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def layout(self) -> dict[str, Any]:
        """The options to pass back to :func:`~tokenbatch.estimate_memory`."""
        return {
            **self.options,
            "micro_batch": self.micro_batch,
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "vpp": self.vpp,
            "zero": self.zero,
            "sequence_parallel": self.tp > 1,
            "recompute": self.recompute,
            "grad_accum_steps": self.grad_accum_steps,
            "pipeline_split": self.pipeline_split,
            "first_stage_layers": self.first_stage_layers,
            "last_stage_layers": self.last_stage_layers,
        }

    def explain(self) -> str:
        """Where the step's time goes, part by part, with the layout and its memory."""
        stages = ""
        if self.pp > 1:
            shown = sorted(set(self.stage_layers), reverse=True)
            stages = f" (layers per stage: {', '.join(map(str, shown))})"
        lines = [
            f"dp={self.dp} tp={self.tp} pp={self.pp} vpp={self.vpp} cp={self.cp} "
            f"ep={self.ep} zero={self.zero} recompute={self.recompute}{stages}",
            f"micro-batch {self.micro_batch} x {self.grad_accum_steps} per step, "
            f"{self.memory / GIB:.1f} GiB per GPU on {self.hardware}",
            f"step {self.step_time:.3f} s, {self.tokens_per_second:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}",
        ]
        for part in TIME_PARTS:
            seconds = self.time_parts[part]
            share = seconds / self.step_time if self.step_time else 0.0
            lines.append(f"  {part:<9}{seconds:9.3f} s {share:6.1%}  {_PART_TEXT[part]}")
        return "\n".join(lines)


def _recompute_names(modes: str | Sequence[str]) -> list[str]:
    """The recomputation modes ``plan_layouts`` is told to consider, as a list of strings
    (the core parses them)."""
    not_names = InvalidTypeError(
        f"recompute must be a mode name or a sequence of them, got {type(modes).__name__}"
    )
    if isinstance(modes, bytes | bytearray):
        raise not_names
    try:
        names = [modes] if isinstance(modes, str) else list(modes)
    except TypeError:
        raise not_names from None
    for name in names:
        if not isinstance(name, str):
            raise InvalidTypeError(f"recompute modes must be strings, got {name!r}")
    return names


def plan_layouts(
    spec: ModelSpec,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    gpu_memory: float | None = None,
    hardware: str | Hardware = "h100",
    gpus_per_node: int | None = None,
    peak_flops: float | None = None,
    compute_efficiency: float = MATMUL_EFFICIENCY,
    intra_node_bandwidth: float | None = None,
    inter_node_bandwidth: float | None = None,
    usable_fraction: float = 0.9,
    overlap_ep_comm: bool = False,
    deduplicated_dispatch: bool = False,
    recompute: str | Sequence[str] = _DEFAULT_RECOMPUTE,
    distinct: bool = True,
    top: int | None = 20,
    **options: Any,
) -> list[PlannedLayout]:
    """Layouts of ``num_gpus`` GPUs that fit in memory, fastest first.

    Enumerates ``dp``, ``tp``, ``pp`` (with ``vpp`` 1, 2, 4 or 8 and a balanced split of
    uneven layers), ``cp``, ``ep``, ZeRO stage, recomputation and the micro-batch size
    (gradient accumulation making up ``global_batch_tokens``, a multiple of ``seq_len``);
    ranks them by the step-time model of :mod:`tokenbatch.memory.steptime` and keeps
    those within ``usable_fraction`` of ``gpu_memory`` (the memory of a candidate is
    estimated only when it could be among those returned), all in the Rust core.
    ``hardware`` is a preset name (``"h100"``, ``"h800"``, ``"h200"``, ``"a100"``,
    ``"mi300x"``; see
    :data:`~tokenbatch.memory.hardware.HARDWARE`) or a :class:`Hardware`; ``gpu_memory``,
    ``gpus_per_node``, ``peak_flops`` and the bandwidths (bytes/s, one direction, per GPU)
    override its figures. ``compute_efficiency`` is the fraction of the peak that large
    matmuls reach; ``overlap_ep_comm`` hides expert-parallel all-to-alls behind other
    micro-batches' compute (DualPipe-style schedules) and ``deduplicated_dispatch`` sends
    a token once per remote node (DeepEP-style dispatch). ``recompute`` names the
    recomputation modes to consider (one name or several, as :func:`estimate_memory`'s
    ``recompute`` takes them; Megatron-Core's modules, such as its default selective mode
    ``"core_attn"`` or ``"core_attn+mlp"``, are not among the defaults: ``"core_attn"``
    costs the time of ``"selective"`` and keeps at least as much). ``options`` go to the memory
    estimate (dtypes, ``fp8``, optimizer, ``activation_model``...). With ``distinct``
    (default) each parallel layout (``dp``, ``tp``, ``pp``, ``cp``, ``ep``) appears once,
    with its fastest ZeRO stage, recomputation, interleaving and micro-batch size; with
    ``distinct=False`` every combination that fits is ranked. Returns at most ``top``
    layouts (all with ``top=None``); an empty list when none fits. Raises
    :class:`InvalidValueError` (or :class:`TokenBatchOverflowError`) with the reason when
    no candidate is valid at all, which an option given makes so (``fused_swiglu=0.5``,
    a negative ``overhead_bytes``, a ``moe_capacity_factor`` past the range of a float).
    """
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if isinstance(hardware, str):
        hardware = Hardware.preset(hardware)
    elif not isinstance(hardware, Hardware):
        raise InvalidTypeError(
            f"hardware must be a preset name or a Hardware, got {type(hardware).__name__}"
        )
    clash = _CHOSEN.intersection(options)
    if clash:
        raise InvalidTypeError(f"the plan chooses {', '.join(sorted(clash))} itself")
    inputs = scalar_inputs(options)
    table = _core.planner_plan(
        spec,
        num_gpus=as_int(num_gpus, "num_gpus"),
        seq_len=as_int(seq_len, "seq_len"),
        global_batch_tokens=as_int(global_batch_tokens, "global_batch_tokens"),
        hardware=core_hardware(hardware),
        overrides=(
            gpu_memory,
            peak_flops,
            intra_node_bandwidth,
            inter_node_bandwidth,
            None if gpus_per_node is None else as_int(gpus_per_node, "gpus_per_node"),
        ),
        options=[inputs[name] for name in LAYOUT_FIELDS],
        constants=(compute_efficiency, LAYER_PASS_OVERHEAD, None),
        overlap_ep_comm=bool(overlap_ep_comm),
        deduplicated_dispatch=bool(deduplicated_dispatch),
        usable_fraction=usable_fraction,
        recompute=_recompute_names(recompute),
        distinct=bool(distinct),
        top=None if top is None else as_int(top, "top"),
    )
    columns = {
        name: values.tolist() if hasattr(values, "tolist") else values
        for name, values in table.items()
    }
    return [
        PlannedLayout(
            dp=columns["dp"][i],
            tp=columns["tp"][i],
            pp=columns["pp"][i],
            cp=columns["cp"][i],
            ep=columns["ep"][i],
            zero=columns["zero"][i],
            recompute=columns["recompute"][i],
            micro_batch=columns["micro_batch"][i],
            grad_accum_steps=columns["grad_accum_steps"][i],
            memory=int(columns["memory"][i]),
            step_time=columns["step_time"][i],
            mfu=columns["mfu"][i],
            tokens_per_second=columns["tokens_per_second"][i],
            time_parts={part: columns[part][i] for part in TIME_PARTS},
            vpp=columns["vpp"][i],
            stage_layers=tuple(columns["stage_layers"][i]),
            pipeline_split=columns["pipeline_split"][i],
            first_stage_layers=columns["first_stage_layers"][i] or None,
            last_stage_layers=columns["last_stage_layers"][i] or None,
            hardware=hardware.name,
            options=dict(options),
        )
        for i in range(len(columns["dp"]))
    ]
