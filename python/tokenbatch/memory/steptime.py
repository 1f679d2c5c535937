"""The planner's step-time model: seconds per optimizer step of a parallel layout.

Evaluated in the Rust core over candidate layouts (every argument in ``c`` is an array).
Standard formulas
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

import numpy as np
import numpy.typing as npt

from tokenbatch import _core
from tokenbatch.memory.hardware import HARDWARE_FIGURES, Hardware
from tokenbatch.memory.options import LAYOUT_FIELDS
from tokenbatch.memory.spec import ModelSpec
from tokenbatch.memory.steptime_fit import LAYER_PASS_OVERHEAD

__all__ = ["TIME_PARTS", "step_time"]

_F64 = npt.NDArray[np.float64]

_TIME_PARTS, _CANDIDATE_FIELDS = _core.planner_names()[2:]

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
