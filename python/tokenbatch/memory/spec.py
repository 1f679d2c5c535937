"""Model descriptions: :class:`ModelSpec`, built-in presets and Hugging Face configs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from tokenbatch import _core
from tokenbatch.errors import InvalidTypeError, InvalidValueError

__all__ = ["PRESETS", "FfnType", "Implementation", "ModelSpec", "MoeDispatcher", "NormType"]

FfnType = Literal["swiglu", "gelu"]
NormType = Literal["rmsnorm", "layernorm"]
Implementation = Literal["hf", "fused"]
MoeDispatcher = Literal["alltoall", "allgather"]


class ModelSpec(_core.ModelSpec):
    """Shape of a decoder-only transformer, enough to count its parameters and activations.

    Dense models need the first five fields; ``num_kv_heads`` defaults to ``num_heads``
    (multi-head attention) and ``head_dim`` to ``hidden_size // num_heads``. A mixture of
    experts sets ``num_experts`` (routed experts per MoE layer), ``top_k``,
    ``num_shared_experts``, ``moe_ffn_size`` (inner size of one expert) and
    ``first_dense_layers`` (leading layers with a dense MLP of ``ffn_size``). Multi-head
    latent attention (DeepSeek-V2/V3) sets ``kv_lora_rank`` > 0 and the head dimensions.
    ``router_bias`` marks sigmoid routing with a per-expert correction bias (DeepSeek-V3);
    the bias is a buffer, not a parameter. ``router_groups`` and ``router_group_top_k``
    describe group-limited routing (DeepSeek-V3: experts in 8 groups, a token's experts
    from at most 4), which bounds the nodes a token is dispatched to. ``mtp_layers``
    multi-token-prediction modules (DeepSeek-V3 trains one; Hugging Face's model leaves it
    out, so the preset and :meth:`from_hf_config` have 0) each add a projection of the two
    normed inputs (``2h x h``), three norms and a layer like the last one, on the last
    pipeline stage.

    ``implementation`` says whose kernels run the model, which decides what is saved for
    backward: ``"hf"`` (default) for Hugging Face ``transformers``' PyTorch modules (RMSNorm
    keeps an fp32 copy of its input, DeepSeek-V3's router runs in fp32, grouped-GEMM
    experts; selective recomputation reruns only the attention core, as a checkpointed
    attention function does), ``"fused"`` for fused kernels as in Megatron-Core with
    Transformer Engine (norms keep only their input and fp32 statistics;
    ``recompute="selective"`` also rebuilds the MLP activation, ``"core_attn"`` is
    Megatron-Core's default, which does not; its other modules as Transformer Engine's
    layer runs them, which fuses a dense layer's norms into the next projections).
    docs/memory.md lists each tensor. ``moe_dispatcher`` is Megatron-Core's token
    dispatcher for fused kernels (its ``--moe-token-dispatcher-type``): ``"alltoall"``
    (default) or ``"allgather"`` (Megatron-Core's own default), which under sequence
    parallelism keeps its sort index and routing map for every token of the
    tensor-parallel group rather than for the rank's part of the sequence.

    The spec is built and validated once, in the Rust core, and is frozen: equal specs
    compare and hash equal, pickle, and :meth:`replace` makes a changed copy. Use
    :meth:`preset` for well-known models and :meth:`from_hf_config` for a ``config.json``.
    A field of the wrong type raises :class:`~tokenbatch.errors.InvalidTypeError`, and a
    value out of range, an unknown option name (the choices listed) or a shape that does
    not hold together :class:`~tokenbatch.errors.InvalidValueError`, naming the field.
    """

    __slots__ = ()

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """A well-known model by name; see :data:`PRESETS` for the list."""
        try:
            return PRESETS[name.lower()]
        except KeyError:
            known = ", ".join(sorted(PRESETS))
            raise InvalidValueError(f"unknown preset {name!r}; known presets: {known}") from None

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a dict, a file, or a directory holding one).

        Supported ``model_type`` values: ``llama``, ``mistral``, ``mixtral``, ``qwen2`` and
        ``deepseek_v3``.
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise InvalidValueError(f"config: no such file {str(path)!r}")
            try:
                config = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise InvalidValueError(f"config: {path} is not valid JSON ({exc})") from exc
            name = path.parent.name or "custom"
        else:
            name = str(config.get("_name_or_path") or "custom")
        if not isinstance(config, Mapping):
            raise InvalidTypeError("config must be a mapping, a path or a directory")
        return _from_hf(config, name)


def _require(config: Mapping[str, Any], key: str) -> Any:
    if key not in config or config[key] is None:
        raise InvalidValueError(f"config: missing {key!r}")
    return config[key]


def _from_hf(config: Mapping[str, Any], name: str) -> ModelSpec:
    model_type = config.get("model_type")
    supported = ("llama", "mistral", "mixtral", "qwen2", "deepseek_v3")
    if model_type not in supported:
        raise InvalidValueError(
            f"config: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(supported)})"
        )
    heads = _require(config, "num_attention_heads")
    act = str(config.get("hidden_act", "silu"))
    fields: dict[str, Any] = {
        "name": name,
        "hidden_size": _require(config, "hidden_size"),
        "num_layers": _require(config, "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim"),
        "ffn_size": _require(config, "intermediate_size"),
        "vocab_size": _require(config, "vocab_size"),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "ffn_type": "swiglu" if act in ("silu", "swish", "swiglu") else "gelu",
        "qkv_bias": model_type == "qwen2" or bool(config.get("attention_bias", False)),
    }
    if model_type == "mixtral":
        fields["num_experts"] = _require(config, "num_local_experts")
        fields["top_k"] = _require(config, "num_experts_per_tok")
        fields["moe_ffn_size"] = fields["ffn_size"]
    if model_type == "deepseek_v3":
        fields["num_kv_heads"] = heads
        fields["head_dim"] = None
        fields["num_experts"] = _require(config, "n_routed_experts")
        fields["top_k"] = _require(config, "num_experts_per_tok")
        fields["num_shared_experts"] = config.get("n_shared_experts") or 0
        fields["moe_ffn_size"] = _require(config, "moe_intermediate_size")
        fields["first_dense_layers"] = config.get("first_k_dense_replace") or 0
        fields["router_bias"] = config.get("topk_method", "noaux_tc") == "noaux_tc"
        fields["router_groups"] = config.get("n_group") or 0
        fields["router_group_top_k"] = config.get("topk_group") or 0
        fields["q_lora_rank"] = config.get("q_lora_rank") or 0
        fields["kv_lora_rank"] = _require(config, "kv_lora_rank")
        fields["qk_nope_head_dim"] = _require(config, "qk_nope_head_dim")
        fields["qk_rope_head_dim"] = _require(config, "qk_rope_head_dim")
        fields["v_head_dim"] = _require(config, "v_head_dim")
        if fields["hidden_size"] % heads != 0:
            fields["head_dim"] = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
    return ModelSpec(**fields)


def _llama(
    name: str, h: int, layers: int, heads: int, kv: int, ffn: int, **extra: Any
) -> ModelSpec:
    fields: dict[str, Any] = {"vocab_size": 128_256, **extra}
    return ModelSpec(
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_size=ffn,
        name=name,
        **fields,
    )


#: Built-in model shapes, from the models' published ``config.json`` (GPT-3: Brown et al.
#: 2020, table 2.1). Names are lower case.
PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _llama("llama-3.2-1b", 2048, 16, 32, 8, 8192, tied_embeddings=True),
        _llama("llama-3.2-3b", 3072, 28, 24, 8, 8192, tied_embeddings=True),
        _llama("llama-3.1-8b", 4096, 32, 32, 8, 14336),
        _llama("llama-3.1-70b", 8192, 80, 64, 8, 28672),
        _llama("llama-3.1-405b", 16384, 126, 128, 8, 53248),
        _llama("mistral-7b", 4096, 32, 32, 8, 14336, vocab_size=32_000),
        _llama(
            "mixtral-8x7b",
            4096,
            32,
            32,
            8,
            14336,
            vocab_size=32_000,
            num_experts=8,
            top_k=2,
            moe_ffn_size=14336,
        ),
        _llama(
            "mixtral-8x22b",
            6144,
            56,
            48,
            8,
            16384,
            vocab_size=32_768,
            num_experts=8,
            top_k=2,
            moe_ffn_size=16384,
        ),
        _llama("qwen2.5-7b", 3584, 28, 28, 4, 18944, vocab_size=152_064, qkv_bias=True),
        _llama("qwen2.5-72b", 8192, 80, 64, 8, 29568, vocab_size=152_064, qkv_bias=True),
        _llama(
            "deepseek-v3",
            7168,
            61,
            128,
            128,
            18432,
            vocab_size=129_280,
            num_experts=256,
            top_k=8,
            num_shared_experts=1,
            moe_ffn_size=2048,
            first_dense_layers=3,
            router_bias=True,
            router_groups=8,
            router_group_top_k=4,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
        ModelSpec(
            name="gpt3-175b",
            hidden_size=12288,
            num_layers=96,
            num_heads=96,
            ffn_size=49152,
            vocab_size=50_257,
            ffn_type="gelu",
            norm="layernorm",
            tied_embeddings=True,
            linear_bias=True,
            learned_positions=2048,
        ),
    )
}
