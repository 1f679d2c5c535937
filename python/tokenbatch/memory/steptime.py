"""The planner's step-time model: seconds per optimizer step of a parallel layout.

Vectorized over candidate layouts (every argument in ``c`` is an array). Standard formulas
on stated hardware figures (:class:`~tokenbatch.memory.hardware.Hardware`) and two
constants fitted once on 19 published runs (:mod:`tokenbatch.memory.steptime_fit`: the
efficiency large matmuls reach, the planner's default, and a fixed cost per layer pass):

* **Matmuls** (roofline, Williams et al. 2009): a matmul of ``W`` weights over ``M``
  tokens takes ``max(2 W M / (peak x efficiency), W x weight_bytes / HBM bandwidth)``
  forward, three times that forward and backward (input and weight gradients). The
  second term is what makes narrow expert matmuls slow: a routed expert that receives
  fewer than about ``peak x efficiency x weight_bytes / (2 x HBM bandwidth)`` tokens (about
  220 on an H100 in BF16) is bound by reading its weights. FP8 linear layers (``fp8``) run
  at the FP8 peak and read 1-byte weights. Routed experts get ``k x ep / E`` times a rank's
  tokens each (times the capacity factor when inputs are padded to capacity). Each pass
  also reads its inputs and writes its outputs at the HBM bandwidth, ``M (K + N)``
  elements for a ``K x N`` matrix, which is what makes narrow or short matmuls reach less
  of the peak than large ones.
* **Element-wise kernels** (memory-bound): per layer, the two norms and two residual adds
  (10 passes over hidden-size tensors, split by sequence parallelism), rotary embeddings
  and the MLP activation, read and written at the HBM bandwidth forward, twice that
  backward, once more with full recomputation; eager attention (``attention="eager"``)
  also computes masked scores and moves the ``s x s`` scores through softmax and dropout.
  The loss reads the logits and writes their gradient on the last stage.
* **Overhead**: a fixed cost per pass (forward or backward) of a layer over a micro-batch
  (kernel launches and synchronizations), fitted.
* **Optimizer**: Adam over the local shard (the stage's weights, over ``dp x cp`` with
  ZeRO), reading gradients, master weights and moments and writing them back.
* **Attention core**: causal attention over the whole sequence, ``s a (dq + dv)`` FLOPs per
  token forward and twice that backward, at the BF16 peak times ``efficiency``.
* **Recomputation**: full recomputation repeats each layer's forward pass, selective the
  attention core's forward; Megatron-Core's modules the forward of each module named
  (``core_attn`` the attention core, ``mlp`` a dense layer's MLP, ``moe`` a MoE layer's
  experts and its all-to-all exchanges, ``shared_experts`` the shared experts,
  ``mla_up_proj`` MLA's up-projections; ``layernorm`` and ``moe_act``, elementwise, are
  not timed).
* **Pipeline** (Narayanan et al. 2021): ``(pp - 1) / vpp`` micro-batch times of bubble per
  step on the slowest stage; each micro-batch sends its activations and receives their
  gradients at each of the ``vpp`` chunk boundaries over the network.
* **Tensor parallelism** (Korthikanti et al. 2022, sequence parallelism): per layer and
  micro-batch, 4 all-gathers or reduce-scatters of the ``tokens x h`` activations forward
  and 4 backward (6 and 6 with full recomputation), ring algorithm, not overlapped.
* **Context parallelism**: per layer, ``cp - 1`` chunks of keys and values reach each rank
  forward, and keys, values and their gradients backward. A ring (``cp_comm="p2p"``: ring
  attention, Liu et al. 2023; Transformer Engine) overlaps them with the attention core:
  only what the core's compute does not hide is counted. An all-gather of the keys and
  values (``cp_comm="all_gather"``, as Llama 3 does: Dubey et al. 2024, section 3.3.2)
  is exposed; so is an all-to-all (``"a2a"``), counted with the same volume.
* **Expert parallelism**: per MoE layer and micro-batch, an all-to-all dispatch and combine
  of the routed copies forward and backward (in FP8 for the forward dispatch with
  ``fp8``), the share of each rank's traffic that stays in its node at the intra-node
  bandwidth, the rest over the network; not overlapped unless ``overlap_ep_comm``, which
  hides it behind another micro-batch's compute (DeepSeek-V3's DualPipe, Megatron-Core's
  ``--overlap-moe-expert-parallel-comm``). ``deduplicated_dispatch`` sends a token once to
  each remote node that hosts some of its experts and forwards it inside the node
  (DeepSeek-V3 section 3.2.2, DeepEP); with group-limited routing (``router_groups``) and
  nodes that hold whole groups, a token reaches at most ``router_group_top_k`` nodes.
* **Data parallelism** (ring reduce-scatter and all-gather over ``dp x cp`` ranks, over
  ``dp x cp / ep`` for experts): ZeRO-0 all-reduces the gradients once per step behind
  the last micro-batch's backward; ZeRO-1 reduce-scatters them there and all-gathers the
  updated weights behind the next step's first forward; ZeRO-2 reduce-scatters after
  every micro-batch's backward; ZeRO-3 also gathers the weights before every micro-batch's
  forward and backward (Rajbhandari et al. 2020), each hidden only behind the compute of
  the same micro-batch.
* **Latency**: every collective also pays NCCL's own latency model for rings (NCCL
  ``src/graph/tuning.cc``, Simple protocol): 8.4 us, plus 3.4 us per step over NVLink and
  9.6 us per step over the network; a pipeline send pays one network step.
* **Placement**: ranks are laid out tensor-parallel first, then context-parallel, then
  data-parallel (expert-parallel groups inside it, after the tensor-parallel ranks), then
  pipeline stages, as Megatron-LM does; a group whose ranks share a node talks at the
  intra-node bandwidth, one that spans nodes at the network's.

Data-parallel collectives hidden behind compute still cost ``OVERLAP_TAX`` (0.2) of the
time they hide: their kernels take streaming multiprocessors and HBM bandwidth from it.

Not modelled: load imbalance between experts beyond a capacity factor, congestion, and
overlap of tensor-parallel or pipeline communication.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch.memory.hardware import Hardware
from tokenbatch.memory.recompute import RECOMPUTE_MODULES
from tokenbatch.memory.spec import ModelSpec
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD

__all__ = ["TIME_PARTS", "step_time"]

_F64 = npt.NDArray[np.float64]

#: The parts of a step's time, in the order :func:`step_time` reports them.
TIME_PARTS = (
    "compute",
    "elementwise",
    "overhead",
    "optimizer",
    "bubble",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
)

# Element-wise passes of one layer's forward, in tensors of the hidden size per token: the
# two norms (read, write) and the two residual adds with their dropout (read two, write).
_HIDDEN_PASSES = 10.0


# NCCL's own cost model for ring collectives with its Simple protocol (NCCL
# src/graph/tuning.cc): a base latency per collective and one per step, by link.
_BASE_LATENCY = 8.4e-6
# The share of a collective hidden behind compute that the compute still loses to it:
# NCCL runs each of its 16 to 32 channels as a thread block on its own streaming
# multiprocessor (of 108 on an A100, 132 on an H100), and its traffic shares HBM.
OVERLAP_TAX = 0.2
_NVLINK_STEP = 3.4e-6
_NETWORK_STEP = 9.6e-6


def _steps_latency(group: _F64, on_node: _F64) -> _F64:
    """Latency of a ring collective over ``group`` ranks, ``on_node`` of them per node."""
    nodes = group / np.minimum(group, on_node)
    result: _F64 = np.where(
        group > 1,
        _BASE_LATENCY + (group - nodes) * _NVLINK_STEP + (nodes - 1.0) * _NETWORK_STEP,
        0.0,
    )
    return result


def _ring(bytes_: _F64, group: _F64, stride: _F64, hw: Hardware) -> _F64:
    """A ring all-gather or reduce-scatter of ``bytes_`` per rank over ``group`` ranks that
    are ``stride`` apart: NCCL's latency plus the bandwidth term."""
    on_node = np.maximum(1.0, hw.gpus_per_node // stride)
    bandwidth = _group_bandwidth(group, stride, hw)
    result: _F64 = _steps_latency(group, on_node) + (group - 1.0) / group * bytes_ / bandwidth
    return result


def _group_bandwidth(group: _F64, stride: _F64, hw: Hardware) -> _F64:
    """Bandwidth of a group whose ranks are ``stride`` apart: intra-node if it fits in one."""
    result: _F64 = np.where(
        group * stride <= hw.gpus_per_node, hw.intra_node_bandwidth, hw.inter_node_bandwidth
    )
    return result


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
    overlap_tax: float = OVERLAP_TAX,
) -> dict[str, _F64]:
    """Seconds per step of each candidate in ``c``, split into :data:`TIME_PARTS`.

    ``c`` holds arrays ``dp``, ``tp``, ``pp``, ``cp``, ``ep``, ``vpp``, ``zero``,
    ``recompute`` (0 none, 1 selective, 2 full, 2 + the bits of Megatron-Core's modules:
    :data:`~tokenbatch.memory.recompute.RECOMPUTE_MODULES`), ``micro_batch``, ``grad_accum_steps``
    and the layers of the first, middle and last pipeline stages (``first_layers``,
    ``middle_layers``, ``last_layers``). ``inputs`` are the memory estimate's numeric
    options (:func:`~tokenbatch.memory.estimate.scalar_inputs`). ``layer_pass_overhead``
    is the fixed cost in seconds of one pass (forward or backward) of one layer over one
    micro-batch (default: the fitted
    :data:`~tokenbatch.memory.steptime_fit.LAYER_PASS_OVERHEAD`) and ``overlap_tax`` the
    share of a data-parallel collective hidden behind compute that still slows it. Also
    returns ``total`` and ``model_flops`` (per step, for MFU).
    """
    dense_row, moe_row, _, embedding, projection = _core.memory_layer_params(spec)
    dp, tp, pp, cp, ep, vpp = (c[k] for k in ("dp", "tp", "pp", "cp", "ep", "vpp"))
    zero, recompute, m = c["zero"], c["recompute"], c["grad_accum_steps"]
    fp8 = inputs["fp8"] == 1.0
    e = inputs["activation_bytes"]
    dispatch_bytes = 1.0 if fp8 else e
    weight_bytes = 1.0 if fp8 else inputs["param_bytes"]
    matmul_peak = (hw.fp8_flops if fp8 else hw.peak_flops) * efficiency
    attention_peak = hw.peak_flops * efficiency
    h = float(spec.hidden_size)
    tokens = c["micro_batch"] * seq_len / cp
    kv_fraction = np.minimum(1.0, np.maximum(1.0, spec.kv_heads / tp) / spec.kv_heads)

    def local_weights(row: list[float]) -> _F64:
        replicated, tp_split, kv, _ = row
        result: _F64 = replicated + tp_split / tp + kv * kv_fraction
        return result

    hbm = hw.memory_bandwidth

    def matmul(weights: _F64, rows: _F64, widths: Any, flops_weights: _F64 | None = None) -> _F64:
        """Forward and backward of matmuls holding ``weights``, over ``rows`` tokens whose
        inputs and outputs are ``widths`` wide in all (each pass reads its inputs and
        writes its outputs once, on top of the roofline)."""
        used = weights if flops_weights is None else flops_weights
        result: _F64 = 3.0 * (
            np.maximum(2.0 * used * rows / matmul_peak, weights * weight_bytes / hbm)
            + rows * widths * e / hbm
        )
        return result

    # Inputs plus outputs of each matmul, per token (the tensor-parallel side split).
    heads_local = spec.num_heads / tp
    kv_local = spec.kv_heads * kv_fraction
    gated = spec.ffn_type == "swiglu"

    def mlp_widths(width: float) -> _F64:
        result: _F64 = (2.0 if gated else 1.0) * width / tp + width / tp + 2.0 * h
        return result

    if spec.is_mla:
        query = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        up_widths = (
            (spec.q_lora_rank + heads_local * query if spec.q_lora_rank else 0.0)
            + spec.kv_lora_rank
            + heads_local * (spec.qk_nope_head_dim + spec.v_head_dim)
        )
        attention_widths = (
            (h + spec.q_lora_rank if spec.q_lora_rank else h + heads_local * query)
            + h
            + spec.kv_lora_rank
            + spec.qk_rope_head_dim
            + up_widths
            + heads_local * spec.v_head_dim
            + h
        )
        rotary = heads_local * spec.qk_rope_head_dim + spec.qk_rope_head_dim
    else:
        up_widths = np.zeros_like(tp)
        attention_widths = 2.0 * h + (2.0 * heads_local + 2.0 * kv_local) * spec.head_size
        rotary = (heads_local + kv_local) * spec.head_size
    if spec.learned_positions:
        rotary = np.zeros_like(tp)

    # One layer, forward and backward, per micro-batch (without recomputation).
    heads = spec.num_heads / tp
    head_dims = (
        spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim
        if spec.is_mla
        else 2 * spec.head_size
    )
    # Eager attention (inputs["attention"] == 1) computes every score, masked or not, and
    # moves the s x s scores through softmax and dropout (Megatron-LM's fused softmax):
    # written by the first matmul, read and written by softmax and by dropout with a
    # 1-byte mask, read by the second; backward twice that.
    eager = inputs["attention"] == 1.0
    attention_fwd_flops = tokens * seq_len * heads * head_dims * (2.0 if eager else 1.0)
    score_bytes = np.where(eager, tokens * seq_len * heads * (6.0 * e + 1.0), 0.0)
    attention_core = 3.0 * attention_fwd_flops / attention_peak
    dense_layer = (
        matmul(local_weights(dense_row), tokens, attention_widths + mlp_widths(spec.ffn_size))
        + attention_core
    )
    mlp_matrices = 3.0 if spec.ffn_type == "swiglu" else 2.0

    def mlp_forward(width: float) -> _F64:
        """The forward pass of an MLP ``width`` wide (whole, split over ``tp``)."""
        return matmul(np.asarray(mlp_matrices * h * width) / tp, tokens, mlp_widths(width)) / 3.0

    modules = np.where(recompute > 2, recompute - 2, 0).astype(np.int64)

    def recomputed(module: str) -> npt.NDArray[np.bool_]:
        result: npt.NDArray[np.bool_] = (modules & RECOMPUTE_MODULES[module]) != 0
        return result

    core_rebuilt = (recompute == 1) | recomputed("core_attn")
    # MLA's up-projections: the query's from its low-rank path (or from the hidden state),
    # the keys' and values' from theirs.
    query_rank = spec.q_lora_rank or spec.hidden_size
    up_weights = spec.num_heads * (
        query_rank * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        + spec.kv_lora_rank * (spec.qk_nope_head_dim + spec.v_head_dim)
    )
    up_cost = np.where(
        recomputed("mla_up_proj") & spec.is_mla,
        matmul(np.asarray(float(up_weights)) / tp, tokens, up_widths) / 3.0,
        0.0,
    )
    shared_forward = mlp_forward(float(spec.num_shared_experts * spec.moe_ffn_size))
    if spec.is_moe:
        copies = spec.top_k * (inputs["moe_capacity_factor"] or 1.0)
        per_expert = moe_row[3] / spec.num_experts
        # Each of a rank's E / ep experts gets k ep / E of the ranks' tokens.
        shared_width = float(spec.num_shared_experts * spec.moe_ffn_size)
        experts = matmul(
            per_expert * spec.num_experts / (ep * tp),
            tokens,
            copies * mlp_widths(spec.moe_ffn_size),
            flops_weights=per_expert * copies / tp,
        )
        moe_widths = attention_widths + np.where(shared_width > 0, mlp_widths(shared_width), 0.0)
        moe_layer = matmul(local_weights(moe_row), tokens, moe_widths) + attention_core + experts
        moe_share = (spec.num_layers - spec.first_dense_layers) / spec.num_layers
    else:
        copies = 0.0
        moe_layer = dense_layer
        moe_share = 0.0
    layer = moe_share * moe_layer + (1.0 - moe_share) * dense_layer
    layer_forward = layer / 3.0
    # Selective modes rebuild the attention core (and elementwise activations, whose
    # time is not modelled), Megatron-Core's modules each their own forward pass.
    attention_cost = np.where(core_rebuilt, attention_core / 3.0, 0.0) + up_cost
    dense_cost = attention_cost + np.where(
        recomputed("mlp"), mlp_forward(float(spec.ffn_size)), 0.0
    )
    if spec.is_moe:
        moe_cost = attention_cost + np.where(
            recomputed("moe"),
            experts / 3.0 + shared_forward,
            np.where(recomputed("shared_experts"), shared_forward, 0.0),
        )
    else:
        moe_cost = dense_cost
    recompute_cost = np.where(
        recompute == 2, layer_forward, moe_share * moe_cost + (1.0 - moe_share) * dense_cost
    )
    head = matmul((projection or embedding) / tp, tokens, h + spec.vocab_size / tp)

    # Element-wise kernels, memory-bound: each pass reads and writes its tensors at the
    # HBM bandwidth; backward moves twice what forward does, full recomputation once more.
    # Sequence parallelism splits the hidden-size tensors over tp.
    activation_passes = 3.0 if gated else 2.0

    def elementwise_forward(width: float, rows: Any) -> _F64:
        """Bytes of one layer's element-wise forward with an MLP ``width`` wide over
        ``rows`` routed tokens."""
        result: _F64 = (
            e
            * tokens
            * (_HIDDEN_PASSES * h / tp + 2.0 * rotary + activation_passes * rows * width / tp)
            + score_bytes
        )
        return result

    dense_bytes = elementwise_forward(float(spec.ffn_size), 1.0)
    moe_bytes = (
        elementwise_forward(float(spec.moe_ffn_size), copies)
        + e * tokens * activation_passes * spec.num_shared_experts * spec.moe_ffn_size / tp
    )
    passes = np.where(recompute == 2, 4.0, 3.0)
    layer_elementwise = passes * (moe_share * moe_bytes + (1.0 - moe_share) * dense_bytes) / hbm
    # The loss: softmax over the logits read in their dtype, kept in logits_dtype, and
    # their gradient written back.
    loss = tokens * spec.vocab_size / tp * 2.0 * (e + inputs["logits_bytes"]) / hbm
    layer_overhead = layer_pass_overhead * np.where(recompute == 2, 3.0, 2.0)
    # The last stage also runs the output layer and the multi-token-prediction modules.
    mtp = spec.mtp_layers * (moe_layer + recompute_cost + head)
    end_compute = head + mtp
    end_elementwise = (1.0 + spec.mtp_layers) * loss + spec.mtp_layers * layer_elementwise
    end_overhead = (1.0 + 2.0 * spec.mtp_layers) * layer_overhead
    per_layer = layer + recompute_cost
    stages = [c["first_layers"], c["middle_layers"], c["last_layers"]]
    stage_times = [layers * (per_layer + layer_elementwise + layer_overhead) for layers in stages]
    stage_times[2] = stage_times[2] + end_compute + end_elementwise + end_overhead
    slowest = np.argmax(np.stack(np.broadcast_arrays(*stage_times)), axis=0)
    slowest_layers = np.choose(slowest, np.broadcast_arrays(*stages))
    last = slowest == 2
    stage_compute = slowest_layers * per_layer + np.where(last, end_compute, 0.0)
    stage_elementwise = slowest_layers * layer_elementwise + np.where(last, end_elementwise, 0.0)
    stage_overhead = slowest_layers * layer_overhead + np.where(last, end_overhead, 0.0)
    stage_layers = np.maximum.reduce(stages)

    # Communication per micro-batch on that stage.
    tp_collectives = np.where(recompute == 2, 12.0, 8.0)
    tp_comm = stage_layers * tp_collectives * _ring(tokens * h * e, tp, np.ones_like(tp), hw)
    kv_width = (
        spec.num_heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim)
        if spec.is_mla
        else 2 * spec.kv_heads * spec.head_size
    ) * np.where(spec.is_mla, 1.0 / tp, kv_fraction)
    # Forward, backward (keys and values again, and their gradients) and, with full
    # recomputation, the forward again: each moves (cp - 1) chunks of keys and values.
    cp_bytes = passes * (cp - 1.0) * tokens * kv_width * e
    cp_time = cp_bytes / _group_bandwidth(cp, tp, hw)
    cp_latency = passes * _steps_latency(cp, np.maximum(1.0, hw.gpus_per_node // tp))
    if inputs["cp_comm"] == 0.0:
        # The ring overlaps each step's transfer with the attention of the chunk in hand;
        # the latency of its steps stays on the critical path.
        cp_time = np.maximum(0.0, cp_time - attention_core)
    cp_time = cp_time + cp_latency
    cp_comm = stage_layers * cp_time
    if spec.is_moe:
        # Expert-parallel ranks are tp apart: on_node of them share a node.
        on_node = np.minimum(ep, np.maximum(1.0, hw.gpus_per_node // tp))
        nodes = ep / on_node
        intra_copies = copies * (on_node - 1.0) / ep
        if deduplicated_dispatch:
            # Once per remote node that hosts some of the token's experts: of `nodes`
            # nodes, a token's k experts (or its topk_group groups, each on one node when
            # the nodes hold whole groups) touch nodes * (1 - (1 - 1/nodes)^picks).
            grouped = spec.router_groups > 1
            picks = np.where(
                grouped & (nodes <= spec.router_groups), spec.router_group_top_k, spec.top_k
            )
            touched = nodes * (1.0 - (1.0 - 1.0 / nodes) ** picks)
            inter_copies = touched * (nodes - 1.0) / nodes
        else:
            inter_copies = copies * (ep - on_node) / ep
        per_byte = intra_copies / hw.intra_node_bandwidth + inter_copies / hw.inter_node_bandwidth
        routed = tokens / tp * h
        # Full recomputation and `moe` repeat the forward dispatch and combine.
        again = (recompute == 2) | recomputed("moe")
        exchanges = routed * (dispatch_bytes + 3.0 * e + np.where(again, 2.0 * e, 0.0))
        latency = 4.0 * _steps_latency(ep, on_node)
        ep_time = np.where(ep > 1, exchanges * per_byte + latency, 0.0)
        if overlap_ep_comm:
            ep_time = np.maximum(0.0, ep_time - layer)
        ep_comm = stage_layers * moe_share * ep_time
    else:
        ep_comm = np.zeros_like(tp)
    point_to_point = _BASE_LATENCY + _NETWORK_STEP + tokens * h * e / tp / hw.inter_node_bandwidth
    pp_comm = np.where(pp > 1, 2.0 * vpp * point_to_point, 0.0)
    micro_batch_time = (
        stage_compute + stage_elementwise + stage_overhead + tp_comm + cp_comm + ep_comm + pp_comm
    )

    # Data parallelism, on the stage with the most weights.
    dense_weights = (
        stage_layers
        * (moe_share * local_weights(moe_row) + (1.0 - moe_share) * local_weights(dense_row))
        + np.where(pp > 1, embedding, embedding + projection) / tp
    )
    expert_weights = stage_layers * moe_share * moe_row[3] / (ep * tp)
    grad_bytes = inputs["grad_bytes"] + inputs["grad_buffer_bytes"]
    param_bytes = inputs["param_bytes"]
    forward = micro_batch_time / 3.0
    backward = micro_batch_time - forward

    # The dense weights' and the experts' collectives share the same compute to hide behind.
    dense_group, expert_group = dp * cp, dp * cp / ep
    reduce = _ring(dense_weights * grad_bytes, dense_group, tp, hw) + _ring(
        expert_weights * grad_bytes, expert_group, tp * ep, hw
    )
    gather = _ring(dense_weights * param_bytes, dense_group, tp, hw) + _ring(
        expert_weights * param_bytes, expert_group, tp * ep, hw
    )

    def exposed(comm: _F64, window: _F64) -> _F64:
        """What ``comm`` adds to ``window`` of compute it overlaps: the part the window
        does not hide, and the share of the hidden part the collective's kernels take
        from the compute (streaming multiprocessors and memory bandwidth)."""
        result: _F64 = np.maximum(0.0, comm - window) + overlap_tax * np.minimum(comm, window)
        return result

    dp_comm = np.select(
        [zero == 0, zero == 1, zero == 2],
        [
            exposed(2.0 * reduce, backward),
            exposed(reduce, backward) + exposed(gather, forward),
            m * exposed(reduce, backward) + exposed(gather, forward),
        ],
        m * (exposed(gather, forward) + exposed(gather + reduce, backward)),
    )
    # The optimizer step (Adam) on the local shard: reads the gradient, reads and writes
    # the master weights and both moments, writes the weights.
    sharded = zero >= 1
    local_params = dense_weights / np.where(sharded, dense_group, 1.0) + expert_weights / np.where(
        sharded, expert_group, 1.0
    )
    update_bytes = (
        inputs["grad_bytes"]
        + 2.0 * (inputs["master_bytes"] + inputs["optimizer_state_bytes"])
        + param_bytes
    )
    optimizer = local_params * update_bytes / hbm
    compute = m * stage_compute
    bubble = (pp - 1.0) / vpp * micro_batch_time
    total = m * micro_batch_time + bubble + dp_comm + optimizer
    steps_tokens = dp * m * c["micro_batch"] * seq_len
    active = spec.num_active_params() - embedding
    model_flops = steps_tokens * (
        6.0 * active + 3.0 * spec.num_layers * seq_len * spec.num_heads * head_dims
    )
    parts: dict[str, Any] = {
        "compute": compute,
        "elementwise": m * stage_elementwise,
        "overhead": m * stage_overhead,
        "optimizer": optimizer,
        "bubble": bubble,
        "tp_comm": m * tp_comm,
        "cp_comm": m * cp_comm,
        "ep_comm": m * ep_comm,
        "pp_comm": m * pp_comm,
        "dp_comm": dp_comm,
        "total": total,
        "model_flops": model_flops,
    }
    return {k: np.asarray(v, dtype=np.float64) for k, v in parts.items()}
