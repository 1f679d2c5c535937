"""Megatron-Core's GPT models on CPU, measured against ``implementation="fused"``.

Used by tests/test_memory_megatron_core.py (one process) and by
tests/runs/megatron_parallel.py (tensor and expert parallelism, under torchrun).

Two-layer ``GPTModel``s of megatron-core, built with its local (no Transformer Engine)
layer spec (a dense SwiGLU model; one with DeepSeek-V3's multi-latent attention, norms on
its low-rank paths; a mixture of experts with a softmax router and the all-gather token
dispatcher; one with DeepSeek-V3's sigmoid router, expert bias, group-limited routing, a
shared expert and the all-to-all dispatcher; experts run as Megatron-Core's
``SequentialMLP``), each train for one step under :func:`tokenbatch.profile` (bytes saved
for backward, deduplicated by storage, parameters excluded). The model is cast to bf16 as
Megatron's ``Float16Module`` does, uses the fused SwiGLU (``bias_activation_fusion``) and a
softmax that keeps its bf16 output only (``attention_softmax_in_fp32=False``, what the
fused softmax kernels save). The local spec is not Transformer Engine, so the measurement
is the estimate plus the tensors that the local modules keep and the fused ones do not,
each named in :func:`local_spec_extra`.

The local spec runs every norm as a module of its own, where Transformer Engine's layer
(which ``fused`` follows) fuses the input norm into the QKV projection and a dense layer's
pre-MLP norm into the MLP: the local spec's ``layernorm`` recomputes norms that Transformer
Engine's does not, and its ``mlp`` leaves the norm outside; :func:`_layer_norms_extra`
counts both.

Megatron-Core runs on CPU here with substitutions for device placement, RNG
bookkeeping (no dropout runs), CUDA streams and missing optional dependencies:
``torch.cuda.current_device()`` (called for buffers, rotary frequencies) returns
``"cpu"``, the CUDA RNG state functions of ``megatron.core.tensor_parallel.random`` use the
CPU generator, the RNG tracker's states are set from it (``model_parallel_cuda_manual_seed``
calls ``torch.cuda``), the all-to-all dispatcher's side stream for its host copies of the
token counts is the host itself (a stream whose events are always complete) and those
copies are made as on a GPU (the split sizes as numpy arrays, which it only converts when
they are on the GPU), the router's matmul finds Transformer Engine's GEMM absent
(``moe_utils`` refers to ``te_general_gemm`` without defining it when Transformer Engine is
not installed), and the norms' output-discarding checkpoint finds FP8 off (it asks
Transformer Engine's FP8 state, which is undefined without it, whatever the ``fp8``
option). The local norm refuses sequence parallelism, because nothing would all-reduce its
weights' gradients over the tensor-parallel ranks; Transformer Engine's and Apex's norms
mark them for that, and so does the norm built here, which is otherwise the local one
(``torch.nn.RMSNorm``). For MLA: the local core attention takes one head size for keys and
values, which the test's sizes make equal, and a subclass accepts MLA's two; MLA asks
whether its output projection is Transformer Engine's, which megatron-core cannot answer
without it (it imports its Transformer Engine extension and finds a None), and is told it
is not. The causal mask is passed explicitly (its default is built with ``device="cuda"``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tokenbatch import ModelSpec, estimate_memory, profile
from tokenbatch.memory import master_weight_adamw

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer import multi_latent_attention, torch_norm
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.moe import moe_utils, token_dispatcher
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

# Hidden, layers, heads, key/value groups, head size, MLP width, vocabulary, batch, length.
H, L, A, G, D, F, V, B, S = 128, 2, 4, 2, 32, 352, 256, 2, 64
E = 2  # bf16
TOKENS = B * S
# The width of each expert (routed and shared).
MF = 96


def _moe(experts: int, top_k: int, dispatcher: str, **router: Any) -> dict[str, Any]:
    """Megatron-Core's options for a mixture of experts."""
    return {
        "num_moe_experts": experts,
        "moe_router_topk": top_k,
        "moe_ffn_hidden_size": MF,
        "moe_token_dispatcher_type": dispatcher,
        **router,
    }


# Multi-latent attention: query and key/value ranks, key sizes without and with rotary
# positions, value size (qk + rope = v = H / A, the size the local core attention takes).
QL, KVL, DN, DR, DV = 96, 64, 24, 8, 32
_MLA = {
    "q_lora_rank": QL,
    "kv_lora_rank": KVL,
    "qk_head_dim": DN,
    "qk_pos_emb_head_dim": DR,
    "v_head_dim": DV,
    "rope_type": "rope",
}

# Per model: Megatron-Core's TransformerConfig options and the ModelSpec's. The
# DeepSeek-style router takes 4 of 8 experts from 1 of 2 groups, ranking the groups by
# their top 4 / 1 scores (DeepSeek-V3's own 8 / 4 = 2 would not tell the count apart from
# a fixed two).
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dense": ({}, {}),
    # DeepSeek-V3's attention with a dense MLP.
    "mla": (
        _MLA,
        {
            "num_kv_heads": A,
            "q_lora_rank": QL,
            "kv_lora_rank": KVL,
            "qk_nope_head_dim": DN,
            "qk_rope_head_dim": DR,
            "v_head_dim": DV,
        },
    ),
    "moe": (
        _moe(4, 2, "allgather"),
        {"num_experts": 4, "top_k": 2, "moe_ffn_size": MF, "moe_dispatcher": "allgather"},
    ),
    "deepseek_moe": (
        _moe(
            8,
            4,
            "alltoall",
            moe_router_score_function="sigmoid",
            moe_router_enable_expert_bias=True,
            moe_router_num_groups=2,
            moe_router_group_topk=1,
            moe_shared_expert_intermediate_size=MF,
        ),
        {
            "num_experts": 8,
            "top_k": 4,
            "moe_ffn_size": MF,
            "router_bias": True,
            "router_groups": 2,
            "router_group_top_k": 1,
            "num_shared_experts": 1,
        },
    ),
}


class _HostStream:
    """A stream on the host: work on it is done when issued, so its events are complete."""

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return self

    def synchronize(self) -> None:
        pass


class _NoFp8:
    """Transformer Engine's FP8 state where Transformer Engine is absent: FP8 is off."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe() -> None:
        return None


def _to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """``moe_utils.maybe_move_tensor_to_cpu`` for tensors already on the host: the numpy
    array it returns for a GPU tensor when asked for one (the split sizes of the
    all-to-all, which take numpy arrays but not tensors)."""
    return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor


def _norm(
    cls: type, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: Any
) -> torch.nn.Module:
    """The local norm (``torch.nn.RMSNorm``), with its weights marked for the
    all-reduce of their gradients over tensor-parallel ranks under sequence parallelism,
    as Transformer Engine's and Apex's norms mark theirs."""
    norm = torch.nn.RMSNorm(hidden_size, eps=eps)
    for weight in norm.parameters():
        weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
    return norm


@contextlib.contextmanager
def megatron_on_cpu(*, tp: int = 1, ep: int = 1) -> Iterator[None]:
    """Megatron-Core's model parallelism on the gloo backend (over the processes that
    torchrun started, else one process), ``tp``-way tensor and ``ep``-way expert parallel,
    with its CUDA-only device, stream and RNG calls pointed at the CPU."""
    patch = pytest.MonkeyPatch()
    patch.setattr(torch.cuda, "current_device", lambda: "cpu")
    patch.setattr(megatron_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    patch.setattr(
        megatron_random, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state)
    )
    patch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    host = _HostStream()
    patch.setattr(torch.cuda, "Stream", lambda *a, **k: host)
    patch.setattr(torch.cuda, "current_stream", lambda *a, **k: host)
    patch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    patch.setattr(token_dispatcher.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
    patch.setattr(token_dispatcher, "maybe_move_tensor_to_cpu", _to_host)
    patch.setattr(torch_norm.WrappedTorchNorm, "__new__", _norm)
    # The norms' output-discarding checkpoint asks Transformer Engine whether FP8 is on.
    patch.setattr(megatron_random, "FP8GlobalStateManager", _NoFp8, raising=False)
    # megatron-core imports its Transformer Engine extension without Transformer Engine,
    # so MLA asks whether its output projection is Transformer Engine's of a None.
    patch.setattr(multi_latent_attention, "HAVE_TE", False)
    # MLA lays out its down-projections as Transformer Engine's duplicated linear layers
    # where it finds one (and there is none without Transformer Engine).
    patch.setattr(multi_latent_attention, "TELinear", _DuplicatedLinear)
    for context in ("activation_recompute_forward", "fp8_autocast"):
        patch.setattr(
            megatron_random, context, lambda **options: contextlib.nullcontext(), raising=False
        )
    if dist.is_torchelastic_launched():
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep)
        megatron_random.get_cuda_rng_tracker().set_states(
            {
                name: torch.get_rng_state()
                for name in ("model-parallel-rng", "expert-parallel-rng", "data-parallel-rng")
            }
        )
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        patch.undo()


class _CoreAttention(DotProductAttention):  # type: ignore[misc]
    """The local core attention, which takes one head size for keys and values (MLA
    passes the two, equal in this test's sizes)."""

    def __init__(self, *args: Any, k_channels: int = D, v_channels: int = D, **kwargs: Any) -> None:
        assert k_channels == v_channels == D, (k_channels, v_channels)
        super().__init__(*args, **kwargs)


class _DuplicatedLinear(torch.nn.Module):
    """Transformer Engine's ``TELinear(parallel_mode="duplicated")`` as MLA builds its
    down-projections with it: the whole weight on every tensor-parallel rank, applied to the
    rank's part of the sequence (the local spec's column-parallel ones split the weight and
    gather the sequence)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config: TransformerConfig,
        init_method: Any,
        bias: bool,
        parallel_mode: str,
        **_: Any,
    ) -> None:
        super().__init__()
        assert parallel_mode == "duplicated", parallel_mode
        assert not bias
        self.weight = torch.nn.Parameter(
            torch.empty(output_size, input_size, dtype=config.params_dtype)
        )
        init_method(self.weight)
        # Its gradient sums over the ranks' parts of the sequence, as a norm's does.
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.nn.functional.linear(hidden, self.weight), None


def _layer_spec(config_options: dict[str, Any]) -> Any:
    """Megatron-Core's local layer spec for the model (multi-latent attention with norms
    on its low-rank paths, as DeepSeek-V3)."""
    if "q_lora_rank" not in config_options:
        return get_gpt_layer_local_spec(
            num_experts=config_options.get("num_moe_experts"), normalization="RMSNorm"
        )
    spec = get_gpt_layer_local_spec(
        multi_latent_attention=True, qk_layernorm=True, normalization="RMSNorm"
    )
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = _CoreAttention
    attention.linear_q_down_proj = _DuplicatedLinear
    attention.linear_kv_down_proj = _DuplicatedLinear
    return spec


def measure(
    recompute: str, model_name: str = "dense", *, tp: int = 1, sp: bool = False, ep: int = 1
) -> tuple[Any, Any]:
    """One bf16 training step of the GPTModel (AdamW on fp32 master weights) on this
    process (``tp``-way tensor parallel, with sequence parallelism when ``sp``, ``ep``-way
    expert parallel, as :func:`megatron_on_cpu` set up): the profile and the estimate for
    the same sizes and layout."""
    config_options, spec_options = MODELS[model_name]
    options: dict[str, Any] = {}
    mla = "q_lora_rank" in config_options
    if mla:
        options = dict(config_options)
    if "num_moe_experts" in config_options:
        # Experts balanced by nothing but the router.
        options = {
            **config_options,
            "moe_router_load_balancing_type": "none",
            "moe_aux_loss_coeff": 0.0,
        }
    if recompute not in ("none", "full"):
        # Megatron-Core's selective recomputation of the modules named.
        options |= {
            "recompute_granularity": "selective",
            "recompute_modules": recompute.split("+"),
        }
    elif recompute == "full":
        options |= {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    config = (MLATransformerConfig if mla else TransformerConfig)(
        num_layers=L,
        hidden_size=H,
        num_attention_heads=A,
        num_query_groups=A if mla else G,
        kv_channels=D,
        ffn_hidden_size=F,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        bias_activation_fusion=True,
        attention_softmax_in_fp32=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        expert_model_parallel_size=ep,
        **options,
    )
    torch.manual_seed(0)
    model = GPTModel(
        config,
        _layer_spec(config_options),
        vocab_size=V,
        max_sequence_length=S,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    ).bfloat16()
    model.train()
    # The same tokens on every rank: tensor-parallel ranks share their micro-batch.
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))
    inputs = {
        "input_ids": ids,
        "position_ids": torch.arange(S).expand(B, S),
        "attention_mask": torch.ones(1, 1, S, S, dtype=torch.bool).triu(1),
        "labels": ids,
    }
    optimizer, step = master_weight_adamw(model, lr=1e-4)
    measured = profile(
        model,
        inputs,
        loss_fn=lambda losses: losses.float().mean(),
        optimizer=optimizer,
        optimizer_step=step,
    )
    spec = ModelSpec(
        **{
            "hidden_size": H,
            "num_layers": L,
            "num_heads": A,
            "num_kv_heads": G,
            "ffn_size": F,
            "vocab_size": V,
            "implementation": "fused",
            **spec_options,
        }
    )
    estimate = estimate_memory(
        spec,
        seq_len=S,
        micro_batch=B,
        tp=tp,
        sequence_parallel=sp,
        ep=ep,
        dp=dist.get_world_size() // tp,
        recompute=recompute,
        attention="eager",
        fused_swiglu=True,
    )
    return measured, estimate


def local_spec_extra(
    recompute: str, model_name: str = "dense", *, tp: int = 1, sp: bool = False
) -> dict[str, int]:
    """What the local spec's modules keep beyond the fused ones the estimate assumes, on
    one rank of a ``tp``-way tensor-parallel layout (sequence parallel when ``sp``)."""
    # The norms see the rank's part of the sequence under sequence parallelism.
    norm_tokens = TOKENS // tp if sp else TOKENS
    # torch.nn.RMSNorm keeps an fp32 copy of its input, fp32 1/rms and the fp32
    # normalized input (8h + 4 per token); Transformer Engine's keeps the input and
    # 1/rms (e h + 4).
    per_norm = norm_tokens * (8 - E) * H
    mask = S * S  # the causal mask (bool), one for all layers
    options = MODELS[model_name][0]
    mla = "q_lora_rank" in options
    if recompute == "full":
        # Only the final norm runs outside a checkpoint; the checkpoints keep the fp32
        # rotary frequencies (one tensor for all layers; MLA builds them in the layer).
        rotary = 0 if mla else S * D * 4
        return {"norm": per_norm, "rotary": rotary, "mask": mask}
    modules = set(recompute.split("+")) - {"none"}
    up_recomputed = mla and "mla_up_proj" in modules
    layer_norms = _layer_norms_extra(modules, moe="num_moe_experts" in options, mla=mla)
    extra = {
        "norm": per_norm + L * norm_tokens * layer_norms,
        # cos and sin, cast to bf16 for queries and for keys, in every layer (MLA's over
        # its rotary dimensions); with its up-projections recomputed, the checkpoint's
        # fp32 frequencies in every layer instead.
        "rotary": L * (S * DR * 4 if up_recomputed else 4 * S * (DR if mla else D) * E),
        "mask": mask,
    }
    if mla:
        extra["mla_paths"] = L * norm_tokens * _mla_paths_extra(up_recomputed, sp=sp)
    if "core_attn" in modules:
        # An int32 scalar per checkpoint of the attention core (what the checkpoints keep
        # is in the estimate: the fused QKV output the core's values keep alive; the other
        # modules' checkpoints keep their inputs, also in the estimate).
        extra["checkpoint"] = L * 4
    return extra


def _mla_paths_extra(up_recomputed: bool, *, sp: bool) -> int:
    """What the local spec's norms of MLA's two low-rank paths in one layer keep beyond
    Transformer Engine's, fused into the up-projections, per token they see.

    The local norms keep more (``8 w + 4`` against ``e w + 4``). With the up-projections
    recomputed, Transformer Engine's norms go into the checkpoint, which keeps their inputs;
    the local ones stay outside and keep all their tensors, and the checkpoint their
    output: for the query ``8 w + 4`` more, for the keys and values also their normalized
    copy, as Transformer Engine's input is a view of the down-projection's output that the
    rotary key part keeps alive in both. Under sequence parallelism MLA gathers the rotary
    key part into a tensor of its own: the local checkpoint no longer keeps the
    down-projection's output, Transformer Engine's still does (through its input).
    """
    if not up_recomputed:
        return (8 - E) * (QL + KVL)
    down_output = E * (KVL + DR) if sp else 0
    return (8 * QL + 4) + (8 * KVL + 4 + E * KVL) - down_output


def _layer_norms_extra(modules: set[str], *, moe: bool, mla: bool) -> int:
    """What the local spec's two norms of one layer keep beyond Transformer Engine's, per
    token they see.

    The local spec runs every norm as a module of its own; Transformer Engine fuses the
    input norm into the QKV projection (not with MLA, whose first projections take the
    norm's output) and, in a dense layer, the pre-MLP norm into the first MLP projection.
    Where both run a norm alone, or both recompute it, the local one keeps more
    (``8h + 4`` against ``e h + 4``) or the same; where only the local spec recomputes it
    (``layernorm``), it keeps its input instead of Transformer Engine's input, statistic
    and output (the next projection's input): ``e h + 4`` less. A dense MLP recomputed
    (``mlp``) takes Transformer Engine's fused norm into its checkpoint, not the local one.
    """
    extra = 0
    for pre_mlp in (False, True):
        fused_in_te = (pre_mlp and not moe) or (not pre_mlp and not mla)
        in_te_mlp_checkpoint = pre_mlp and not moe and "mlp" in modules
        if "layernorm" in modules:
            if in_te_mlp_checkpoint or not fused_in_te:
                continue  # both keep the norm's input only
            extra -= E * H + 4
        elif in_te_mlp_checkpoint:
            extra += 8 * H + 4  # the whole local norm
        else:
            extra += (8 - E) * H
    return extra
