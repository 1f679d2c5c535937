"""Parallel-layout planning: enumerate the layouts that fit, rank them by estimated step time.

The planner enumerates data, tensor, pipeline (with interleaving), context and expert
parallelism, the ZeRO stage, recomputation and the micro-batch size; estimates the memory
of every candidate in one grid call (pipeline stages split by the ``"auto"`` rule, so
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

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.memory.estimate import (
    _RECOMPUTE,
    GIB,
    PIPELINE_SPLITS,
    _invalid,
    estimate_memory_grid,
    scalar_inputs,
)
from tokenbatch.memory.hardware import Hardware, positive_number
from tokenbatch.memory.recompute import recompute_name
from tokenbatch.memory.spec import ModelSpec
from tokenbatch.memory.steptime import TIME_PARTS, step_time
from tokenbatch.memory.steptime_fit import MATMUL_EFFICIENCY

__all__ = ["PlannedLayout", "plan"]

_F64 = npt.NDArray[np.float64]
# The recomputation modes `plan` considers unless told otherwise.
_DEFAULT_RECOMPUTE = ("none", "selective", "full")
_MAX_CP = 32
_MAX_MICRO_BATCH = 64
_VPP = (1, 2, 4, 8)

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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _split(
    num_layers: int, pp: int, vpp: int, split: str, first: int = 0, last: int = 0
) -> list[int] | None:
    """Layers per stage under a ``pipeline_split`` rule and explicit end stages, or None."""
    return _core.memory_pipeline_layers(num_layers, pp, vpp, PIPELINE_SPLITS[split], first, last)


def _balanced_split(
    spec: ModelSpec, pp: int, vpp: int, end_cost: float
) -> tuple[str, int, int, list[int]] | None:
    """The split of the layers over stages that balances the stages' compute.

    Every layer costs 1, the last stage ``end_cost`` more (the output layer and the
    multi-token-prediction modules, in layers of compute). Among the splits Megatron-LM
    can express (even; the embedding and/or the loss counted as a layer; explicit first and
    last stage sizes, the rest even), the one whose slowest stage is fastest; ties go to
    fewer layers on the first stage, which keeps the most micro-batches in flight, then to
    the simpler rule. Returns the rule, the explicit first and last sizes (0 unless
    explicit) and the layers of each stage.
    """
    layers = spec.num_layers
    options: list[tuple[float, int, int, str, int, int, list[int]]] = []

    def consider(rank: int, split: str, first: int = 0, last: int = 0) -> None:
        stages = _split(layers, pp, vpp, split, first, last)
        if stages is not None:
            cost = max([*stages[:-1], stages[-1] + end_cost])
            options.append((cost, stages[0], rank, split, first, last, stages))

    for rank, split in enumerate(("even", "embedding_and_loss", "embedding", "loss")):
        consider(rank, split)
    if pp > 1:
        widest = 2 * -(-layers // pp)
        for first in range(vpp, widest + 1, vpp):
            for last in range(vpp, widest + 1, vpp):
                consider(4, "even", first, last)
    if not options:
        return None
    _, _, _, split, first, last, stages = min(options, key=lambda o: o[:3])
    return split, first, last, stages


_COLUMNS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "vpp",
    "zero",
    "recompute",
    "micro_batch",
    "grad_accum_steps",
    "first_layers",
    "middle_layers",
    "last_layers",
    "first_stage_layers",
    "last_stage_layers",
    "pipeline_split",
)


def _end_cost(spec: ModelSpec) -> float:
    """The output layer and multi-token-prediction modules, in layers of compute."""
    dense, _, moe_active, embedding, projection = _core.memory_layer_params(spec)
    moe_layers = spec.num_layers - spec.first_dense_layers if spec.is_moe else 0
    active = (sum(dense) * (spec.num_layers - moe_layers) + sum(moe_active) * moe_layers) / (
        spec.num_layers
    )
    head = (projection or embedding) / active
    last_layer = sum(moe_active) if moe_layers else sum(dense)
    return head + spec.mtp_layers * (last_layer / active + head)


def _recompute_codes(modes: str | Sequence[str]) -> tuple[int, ...]:
    """The codes of the recomputation modes ``plan`` is told to consider, in order, once."""
    not_names = InvalidTypeError(
        f"recompute must be a mode name or a sequence of them, got {type(modes).__name__}"
    )
    if isinstance(modes, bytes | bytearray):
        raise not_names
    try:
        names = [modes] if isinstance(modes, str) else list(modes)
    except TypeError:
        raise not_names from None
    codes: list[int] = []
    for name in names:
        if not isinstance(name, str):
            raise InvalidTypeError(f"recompute modes must be strings, got {name!r}")
        code = _RECOMPUTE.get(name.lower())
        if code is None:
            raise InvalidValueError(f"recompute modes must be {_RECOMPUTE.choices}, got {name!r}")
        if code not in codes:
            codes.append(code)
    if not codes:
        raise InvalidValueError("recompute must name at least one mode")
    return tuple(codes)


def _candidates(
    spec: ModelSpec,
    num_gpus: int,
    seq_len: int,
    sequences: int,
    gpus_per_node: int,
    recompute_codes: tuple[int, ...],
) -> dict[str, npt.NDArray[np.int64]]:
    rows: list[tuple[int, ...]] = []
    end_cost = _end_cost(spec)
    for tp in _divisors(num_gpus):
        if tp > gpus_per_node or spec.num_heads % tp:
            continue
        for pp in _divisors(num_gpus // tp):
            for vpp in _VPP if pp > 1 else (1,):
                split = _balanced_split(spec, pp, vpp, end_cost)
                if split is None:
                    continue
                rule, first_stage, last_stage, layers = split
                first, last, middle = layers[0], layers[-1], max(layers)
                for cp in _divisors(num_gpus // (tp * pp)):
                    if cp > _MAX_CP or seq_len < 2 * cp:
                        continue
                    dp = num_gpus // (tp * pp * cp)
                    if sequences % dp:
                        continue
                    eps = (
                        [e for e in _divisors(dp * cp) if spec.num_experts % e == 0]
                        if spec.is_moe
                        else [1]
                    )
                    # ZeRO-2 and -3 reduce gradients after every micro-batch, which neither
                    # Megatron-LM nor DeepSpeed does under pipeline parallelism.
                    zeros = (0,) if dp * cp == 1 else (0, 1) if pp > 1 else (0, 1, 2, 3)
                    per_rank = sequences // dp
                    for micro_batch in _divisors(per_rank):
                        if micro_batch > _MAX_MICRO_BATCH:
                            break
                        steps = per_rank // micro_batch
                        if vpp > 1 and steps % pp:
                            continue
                        for ep in eps:
                            for zero in zeros:
                                for recompute in recompute_codes:
                                    rows.append(
                                        (
                                            *(dp, tp, pp, cp, ep, vpp, zero, recompute),
                                            *(micro_batch, steps, first, middle, last),
                                            *(first_stage, last_stage, PIPELINE_SPLITS[rule]),
                                        )
                                    )
    if not rows:
        return {name: np.empty(0, dtype=np.int64) for name in _COLUMNS}
    table = np.asarray(rows, dtype=np.int64)
    return {name: table[:, i] for i, name in enumerate(_COLUMNS)}


def plan(
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

    Enumerates ``dp``, ``tp``, ``pp`` (with ``vpp`` 1, 2 or 4 and the ``"auto"`` split of
    uneven layers), ``cp``, ``ep``, ZeRO stage, recomputation and the micro-batch size
    (gradient accumulation making up ``global_batch_tokens``, a multiple of ``seq_len``);
    estimates the memory of all of them in one grid call and ranks those within
    ``usable_fraction`` of ``gpu_memory`` by the step-time model of
    :mod:`tokenbatch.memory.steptime`. ``hardware`` is a preset name (``"h100"``,
    ``"h800"``, ``"h200"``, ``"a100"``, ``"mi300x"``; see
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
    overrides: dict[str, Any] = {
        "memory": gpu_memory,
        "peak_flops": peak_flops,
        "intra_node_bandwidth": intra_node_bandwidth,
        "inter_node_bandwidth": inter_node_bandwidth,
    }
    for name, value in overrides.items():
        if value is not None:
            positive_number("gpu_memory" if name == "memory" else name, value)
    if gpus_per_node is not None:
        overrides["gpus_per_node"] = as_int(gpus_per_node, "gpus_per_node", minimum=1)
    hw = hardware.replace(**{k: v for k, v in overrides.items() if v is not None})
    num_gpus = as_int(num_gpus, "num_gpus", minimum=1)
    seq_len = as_int(seq_len, "seq_len", minimum=1)
    global_batch_tokens = as_int(global_batch_tokens, "global_batch_tokens", minimum=1)
    efficiency = positive_number("compute_efficiency", compute_efficiency)
    usable = positive_number("usable_fraction", usable_fraction)
    if efficiency > 1 or usable > 1:
        raise InvalidValueError("compute_efficiency and usable_fraction must be at most 1")
    if global_batch_tokens % seq_len:
        raise InvalidValueError(
            f"global_batch_tokens={global_batch_tokens} must be a multiple of seq_len={seq_len}"
        )
    chosen = {"micro_batch", "dp", "tp", "pp", "cp", "ep", "vpp", "zero"}
    chosen |= {"seq_len", "sequence_parallel", "grad_accum_steps"}
    chosen |= {"pipeline_split", "first_stage_layers", "last_stage_layers"}
    clash = chosen & set(options)
    if clash:
        raise InvalidTypeError(f"plan chooses {', '.join(sorted(clash))} itself")
    inputs = scalar_inputs(options)
    sequences = global_batch_tokens // seq_len
    recompute_codes = _recompute_codes(recompute)
    c = _candidates(spec, num_gpus, seq_len, sequences, hw.gpus_per_node, recompute_codes)
    if c["dp"].size == 0:
        return []
    grid = estimate_memory_grid(
        spec,
        seq_len=seq_len,
        micro_batch=c["micro_batch"],
        dp=c["dp"],
        tp=c["tp"],
        pp=c["pp"],
        cp=c["cp"],
        ep=c["ep"],
        vpp=c["vpp"],
        zero=c["zero"],
        recompute=c["recompute"],
        sequence_parallel=c["tp"] > 1,
        grad_accum_steps=c["grad_accum_steps"],
        first_stage_layers=c["first_stage_layers"],
        last_stage_layers=c["last_stage_layers"],
        pipeline_split=np.asarray(list(PIPELINE_SPLITS))[c["pipeline_split"]],
        **options,
    )
    if not grid.valid.any():
        # The candidates are built to fit the model: when none is valid, an option given
        # (or a model that splits no way over these GPUs) is at fault, and the most
        # common reason says which, where an empty plan would hide it.
        codes, counts = np.unique(grid.reason_code, return_counts=True)
        raise _invalid(int(codes[np.argmax(counts)]), options)
    fits = grid.fits(usable * hw.memory)
    if not fits.any():
        return []
    keep = np.flatnonzero(fits)
    cols = {k: v[keep].astype(np.float64) for k, v in c.items()}
    times = step_time(
        spec,
        cols,
        hw=hw,
        seq_len=seq_len,
        efficiency=efficiency,
        inputs=inputs,
        overlap_ep_comm=overlap_ep_comm,
        deduplicated_dispatch=deduplicated_dispatch,
    )
    total_time = times["total"]
    mfu = times["model_flops"] / (total_time * num_gpus * hw.peak_flops)
    memory = grid.total[keep]
    order = np.lexsort((memory, total_time))
    if distinct:
        layout_keys = np.stack([cols[k][order] for k in ("dp", "tp", "pp", "cp", "ep")], axis=1)
        _, first_seen = np.unique(layout_keys, axis=0, return_index=True)
        order = order[np.sort(first_seen)]
    if top is not None:
        order = order[: as_int(top, "top", minimum=1)]
    result = []
    for i in order:
        pp, vpp = int(cols["pp"][i]), int(cols["vpp"][i])
        rule = list(PIPELINE_SPLITS)[int(cols["pipeline_split"][i])]
        first_stage = int(cols["first_stage_layers"][i])
        last_stage = int(cols["last_stage_layers"][i])
        result.append(
            PlannedLayout(
                dp=int(cols["dp"][i]),
                tp=int(cols["tp"][i]),
                pp=pp,
                cp=int(cols["cp"][i]),
                ep=int(cols["ep"][i]),
                zero=int(cols["zero"][i]),
                recompute=recompute_name(int(cols["recompute"][i])),
                micro_batch=int(cols["micro_batch"][i]),
                grad_accum_steps=int(cols["grad_accum_steps"][i]),
                memory=int(memory[i]),
                step_time=float(total_time[i]),
                mfu=float(mfu[i]),
                tokens_per_second=float(global_batch_tokens / total_time[i]),
                time_parts={part: float(times[part][i]) for part in TIME_PARTS},
                vpp=vpp,
                stage_layers=tuple(
                    _split(spec.num_layers, pp, vpp, rule, first_stage, last_stage) or ()
                ),
                pipeline_split=rule,
                first_stage_layers=first_stage or None,
                last_stage_layers=last_stage or None,
                hardware=hw.name,
                options=dict(options),
            )
        )
    return result
