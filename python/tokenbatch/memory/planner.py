"""Parallel-layout planning: enumerate the layouts that fit, rank them by estimated step time.

Assumptions (deliberately simple, stated so they can be argued with):

* **Compute.** Model FLOPs per token are ``6 N + 3 L a s (d_qk + d_v)``: ``N`` the active
  matmul parameters (embedding lookups excluded, output head included), and causal
  attention counted once for the lower triangle (Kaplan et al. 2020; PaLM, Chowdhery et
  al. 2022, appendix B, halved for causality). Full recomputation adds one forward pass
  (``2 N`` plus the attention forward), selective recomputation the attention forward.
  GPUs reach ``compute_efficiency`` of ``peak_flops`` on large matmuls, scaled by
  ``x / (x + 512)`` where ``x`` is the tokens per micro-batch per GPU (small micro-batches
  run slower kernels).
* **Pipeline bubble.** 1F1B idles ``(pp - 1) / m`` of the compute time for ``m``
  micro-batches per step (Narayanan et al. 2021).
* **Communication**, ring algorithms, not overlapped with compute unless said:
  tensor parallelism all-reduces (or reduce-scatters and all-gathers, with sequence
  parallelism) the ``b s h`` activations 4 times per layer and micro-batch (6 with full
  recomputation); context parallelism passes keys and values around the ring; expert
  parallelism does 4 all-to-alls of the routed tokens per MoE layer; pipeline stages send
  activations point to point; data parallelism reduces gradients once per step (ZeRO-0/1),
  per micro-batch (ZeRO-2), and also gathers weights twice per micro-batch (ZeRO-3), hidden
  behind the backward pass of the last micro-batch (ZeRO-0/1), of every micro-batch (ZeRO-2)
  or all compute (ZeRO-3). A group within ``gpus_per_node`` GPUs uses ``intra_node_bandwidth``,
  otherwise ``inter_node_bandwidth`` (bytes/s per GPU).
* **Memory.** A layout fits when the estimate is at most ``usable_fraction`` of
  ``gpu_memory`` (the rest: CUDA context, communication buffers, allocator fragmentation).
  Sequence parallelism is always on with tensor parallelism; tensor parallelism is capped at
  ``gpus_per_node``; ``vpp`` is 1.
* **Not modelled**, so weigh the ranking of large mixture-of-experts models with care:
  kernel efficiency of narrow expert matmuls (experts split over ``tp``), load imbalance
  between experts, and the limits of overlapping ZeRO-3 gathers with compute. For
  DeepSeek-V3 on 2,048 GPUs the model ranks ZeRO-3 without expert parallelism first, where
  the published run used expert parallelism (64-way) with ZeRO-1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.memory.estimate import estimate_memory_grid, scalar_inputs
from tokenbatch.memory.spec import ModelSpec

__all__ = ["PlannedLayout", "plan"]

_F64 = npt.NDArray[np.float64]
_RECOMPUTE = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class PlannedLayout:
    """One layout that fits, with its estimated memory and speed.

    ``num_gpus = dp * tp * pp * cp``; experts are sharded over ``ep`` ranks inside
    ``dp * cp``. ``micro_batch`` sequences per micro-batch, ``grad_accum_steps``
    micro-batches per step, so ``dp * micro_batch * grad_accum_steps`` sequences per step.
    ``time_parts`` splits ``step_time`` (seconds) into compute, bubble and exposed
    communication of each kind.
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

    def layout(self) -> dict[str, Any]:
        """The options to pass back to :func:`~tokenbatch.estimate_memory`."""
        return {
            "micro_batch": self.micro_batch,
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "zero": self.zero,
            "sequence_parallel": self.tp > 1,
            "recompute": self.recompute,
            "grad_accum_steps": self.grad_accum_steps,
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _candidates(
    spec: ModelSpec, num_gpus: int, seq_len: int, sequences: int, gpus_per_node: int
) -> dict[str, npt.NDArray[np.int64]]:
    rows: list[tuple[int, ...]] = []
    for tp in _divisors(num_gpus):
        if tp > gpus_per_node or spec.num_heads % tp:
            continue
        for pp in _divisors(num_gpus // tp):
            if spec.num_layers % pp:
                continue
            for cp in _divisors(num_gpus // (tp * pp)):
                if seq_len % cp or cp > 16:
                    continue
                dp = num_gpus // (tp * pp * cp)
                if sequences % dp:
                    continue
                eps = (
                    [e for e in _divisors(dp * cp) if spec.num_experts % e == 0]
                    if spec.is_moe
                    else [1]
                )
                zeros = (0, 1, 2, 3) if dp * cp > 1 else (0,)
                per_rank = sequences // dp
                for micro_batch in _divisors(per_rank):
                    if micro_batch > 64:
                        break
                    steps = per_rank // micro_batch
                    for ep in eps:
                        for zero in zeros:
                            for recompute in range(3):
                                rows.append(
                                    (dp, tp, pp, cp, ep, zero, recompute, micro_batch, steps)
                                )
    names = ("dp", "tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch", "grad_accum_steps")
    if not rows:
        return {name: np.empty(0, dtype=np.int64) for name in names}
    table = np.asarray(rows, dtype=np.int64)
    return {name: table[:, i] for i, name in enumerate(names)}


def plan(
    spec: ModelSpec,
    *,
    num_gpus: int,
    gpu_memory: float,
    seq_len: int,
    global_batch_tokens: int,
    gpus_per_node: int = 8,
    peak_flops: float = 989e12,
    compute_efficiency: float = 0.6,
    intra_node_bandwidth: float = 300e9,
    inter_node_bandwidth: float = 40e9,
    usable_fraction: float = 0.9,
    top: int | None = 20,
    **options: Any,
) -> list[PlannedLayout]:
    """Layouts of ``num_gpus`` GPUs that fit ``gpu_memory`` bytes, fastest first.

    Enumerates ``dp``, ``tp``, ``pp``, ``cp``, ``ep``, ZeRO stage, recomputation and the
    micro-batch size (gradient accumulation making up ``global_batch_tokens``, which must
    be a multiple of ``seq_len``), estimates memory for all of them in one grid call and
    ranks those that fit by the step-time model of this module's docstring. Defaults
    describe an H100 SXM node (989 TFLOP/s dense bf16, NVLink, 400 Gb/s InfiniBand per
    GPU). ``options`` go to the memory estimate (dtypes, optimizer, activation model...).
    Returns at most ``top`` layouts (all with ``top=None``); an empty list when none fits.
    """
    if not isinstance(spec, ModelSpec):
        raise InvalidTypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    num_gpus = as_int(num_gpus, "num_gpus", minimum=1)
    seq_len = as_int(seq_len, "seq_len", minimum=1)
    global_batch_tokens = as_int(global_batch_tokens, "global_batch_tokens", minimum=1)
    gpus_per_node = as_int(gpus_per_node, "gpus_per_node", minimum=1)
    for name, value in (
        ("gpu_memory", gpu_memory),
        ("peak_flops", peak_flops),
        ("compute_efficiency", compute_efficiency),
        ("intra_node_bandwidth", intra_node_bandwidth),
        ("inter_node_bandwidth", inter_node_bandwidth),
        ("usable_fraction", usable_fraction),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise InvalidValueError(f"{name} must be a positive number, got {value!r}")
    if global_batch_tokens % seq_len:
        raise InvalidValueError(
            f"global_batch_tokens={global_batch_tokens} must be a multiple of seq_len={seq_len}"
        )
    clash = {"micro_batch", "dp", "tp", "pp", "cp", "ep", "zero", "recompute", "seq_len"} & set(
        options
    )
    if clash:
        raise InvalidTypeError(f"plan chooses {', '.join(sorted(clash))} itself")
    sequences = global_batch_tokens // seq_len
    c = _candidates(spec, num_gpus, seq_len, sequences, gpus_per_node)
    if c["dp"].size == 0:
        return []
    recompute_names = np.asarray(_RECOMPUTE)[c["recompute"]]
    grid = estimate_memory_grid(
        spec,
        seq_len=seq_len,
        micro_batch=c["micro_batch"],
        dp=c["dp"],
        tp=c["tp"],
        pp=c["pp"],
        cp=c["cp"],
        ep=c["ep"],
        zero=c["zero"],
        recompute=recompute_names,
        sequence_parallel=c["tp"] > 1,
        grad_accum_steps=c["grad_accum_steps"],
        **options,
    )
    fits = grid.fits(usable_fraction * gpu_memory)
    if not fits.any():
        return []
    keep = np.flatnonzero(fits)
    cols = {k: v[keep].astype(np.float64) for k, v in c.items()}
    resolved = scalar_inputs(options)
    param_bytes = resolved["param_bytes"]
    act_bytes = resolved["activation_bytes"]
    times = _step_time(
        spec,
        cols,
        params_bytes=grid.params[keep],
        num_gpus=num_gpus,
        seq_len=seq_len,
        tokens=float(global_batch_tokens),
        gpus_per_node=gpus_per_node,
        peak_flops=peak_flops,
        efficiency=compute_efficiency,
        intra=intra_node_bandwidth,
        inter=inter_node_bandwidth,
        param_bytes=param_bytes,
        act_bytes=act_bytes,
    )
    total_time = times["total"]
    memory = grid.total[keep]
    order = np.lexsort((memory, total_time))
    if top is not None:
        order = order[: as_int(top, "top", minimum=1)]
    result = []
    for i in order:
        result.append(
            PlannedLayout(
                dp=int(cols["dp"][i]),
                tp=int(cols["tp"][i]),
                pp=int(cols["pp"][i]),
                cp=int(cols["cp"][i]),
                ep=int(cols["ep"][i]),
                zero=int(cols["zero"][i]),
                recompute=_RECOMPUTE[int(cols["recompute"][i])],
                micro_batch=int(cols["micro_batch"][i]),
                grad_accum_steps=int(cols["grad_accum_steps"][i]),
                memory=int(memory[i]),
                step_time=float(total_time[i]),
                mfu=float(times["mfu"][i]),
                tokens_per_second=float(global_batch_tokens / total_time[i]),
                time_parts={k: float(v[i]) for k, v in times.items() if k not in ("total", "mfu")},
            )
        )
    return result


def _step_time(
    spec: ModelSpec,
    c: dict[str, _F64],
    *,
    params_bytes: _F64,
    num_gpus: int,
    seq_len: int,
    tokens: float,
    gpus_per_node: int,
    peak_flops: float,
    efficiency: float,
    intra: float,
    inter: float,
    param_bytes: float,
    act_bytes: float,
) -> dict[str, _F64]:
    """Vectorized step-time model (see the module docstring)."""
    dp, tp, pp, cp, ep = c["dp"], c["tp"], c["pp"], c["cp"], c["ep"]
    zero, recompute, b, m = c["zero"], c["recompute"], c["micro_batch"], c["grad_accum_steps"]
    h = float(spec.hidden_size)
    layers = float(spec.num_layers)
    head_dims = (
        spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim
        if spec.is_mla
        else 2 * spec.head_size
    )
    embedding = (
        spec.vocab_size * h * (0 if spec.tied_embeddings else 1) + spec.learned_positions * h
    )
    n_matmul = spec.num_active_params() - embedding
    attention = 3.0 * layers * spec.num_heads * seq_len * head_dims / 2.0
    model_flops = 6.0 * n_matmul + attention
    extra = np.where(recompute == 2, 2.0 * n_matmul + attention / 3.0, 0.0)
    extra = extra + np.where(recompute == 1, attention / 3.0, 0.0)
    micro_tokens = b * seq_len / cp
    kernel = efficiency * micro_tokens / (micro_tokens + 512.0)
    compute = (model_flops + extra) * tokens / (num_gpus * peak_flops * kernel)
    bubble = compute * (pp - 1.0) / m

    def bandwidth(group: _F64) -> _F64:
        result: _F64 = np.where(group <= gpus_per_node, intra, inter)
        return result

    layers_per_stage = layers / pp
    tp_calls = np.where(recompute == 2, 6.0, 4.0)
    tp_bytes = tp_calls * 2.0 * (tp - 1.0) / tp * micro_tokens * h * act_bytes
    tp_comm = layers_per_stage * m * tp_bytes / bandwidth(tp)
    kv_width = (
        spec.num_heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim)
        if spec.is_mla
        else 2 * spec.kv_heads * spec.head_size
    )
    cp_bytes = 3.0 * (cp - 1.0) * micro_tokens * kv_width * act_bytes
    cp_comm = layers_per_stage * m * cp_bytes / bandwidth(tp * cp)
    moe_per_stage = (spec.num_layers - spec.first_dense_layers) / pp if spec.is_moe else 0.0
    ep_bytes = 4.0 * (ep - 1.0) / ep * micro_tokens * spec.top_k * h * act_bytes / tp
    ep_comm = moe_per_stage * m * ep_bytes / bandwidth(ep * tp)
    pp_comm = np.where(pp > 1, 2.0 * m * micro_tokens * h * act_bytes / tp / inter, 0.0)
    group = dp * cp
    local_params = np.where(zero >= 3, params_bytes * group, params_bytes) / param_bytes
    ring = (group - 1.0) / group * local_params * param_bytes
    dp_bw = bandwidth(group * tp * pp)
    dp_volume = np.select([zero <= 1, zero == 2], [2.0 * ring, (m + 1.0) * ring], 3.0 * m * ring)
    backward = 2.0 / 3.0 * compute
    window = np.select([zero <= 1, zero == 2], [backward / m, backward], compute)
    dp_comm = np.maximum(0.0, dp_volume / dp_bw - window)
    total = compute + bubble + tp_comm + cp_comm + ep_comm + pp_comm + dp_comm
    mfu = model_flops * tokens / (total * num_gpus * peak_flops)
    return {
        "compute": compute,
        "bubble": bubble,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm,
        "ep_comm": ep_comm,
        "pp_comm": pp_comm,
        "dp_comm": dp_comm,
        "total": total,
        "mfu": mfu,
    }
