"""Estimates against real Hugging Face training steps: a GPU's peak memory, or on CPU the
bytes saved for backward.

    python benches/gpu/memory_check.py            # CUDA: torch.cuda.max_memory_allocated
    python benches/gpu/memory_check.py --device cpu --size tiny   # what a CPU can check

Each family (Llama, Qwen2, Mistral, Mixtral, DeepSeek-V3) is built from a config with
``transformers``, in bf16, with fp32 master weights and AdamW moments
(:func:`tokenbatch.memory.master_weight_adamw`), without recomputation, with selective
recomputation of the attention core (:func:`selective_attention`) and with full
recomputation (``activation_checkpointing_enable``). One step runs first so that the optimizer state
exists; the second step is measured. On CUDA the figure is the peak allocated during that
step against the estimate's ``total`` (weights, gradients, optimizer state and
activations, all at their largest at once, so an upper bound: gradients grow while
activations are freed). On CPU, where no allocator reports a peak, the weights, gradients
and optimizer state must match exactly and the bytes saved for backward
(:func:`tokenbatch.profile`) are compared with ``saved_activations``. Runs in well under
five minutes on one GPU; ``--size tiny`` takes seconds on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import transformers
from torch.utils.checkpoint import checkpoint
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from tokenbatch import ModelSpec, estimate_memory, profile
from tokenbatch.memory import master_weight_adamw

GIB = 1024**3

# Sizes: "tiny" for CPU tests (seconds), "gpu" for a measurement that a GPU's allocator
# overheads do not dominate (a few GB per model).
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "common": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
        "vocab_size": 256,
        "ffn": 352,
        "expert_ffn": 96,
        "batch": 2,
        "seq_len": 64,
    },
    "gpu": {
        "common": {"hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16},
        "vocab_size": 32_000,
        "ffn": 5632,
        "expert_ffn": 1408,
        "batch": 1,
        "seq_len": 4096,
    },
}

FAMILIES = ("llama", "qwen2", "mistral", "mixtral", "deepseek_v3")
RECOMPUTE = ("none", "selective", "full")


def config(family: str, attention: str, size: str = "tiny") -> transformers.PretrainedConfig:
    """A ``transformers`` config of ``family`` at ``size`` (``"tiny"`` or ``"gpu"``)."""
    s = _SIZES[size]
    common: dict[str, Any] = {**s["common"], "vocab_size": s["vocab_size"], "use_cache": False}
    heads = common["num_attention_heads"]
    if family == "deepseek_v3":
        head = common["hidden_size"] // heads
        # PyTorch's CPU flash kernel needs equal query and value head sizes (otherwise SDPA
        # falls back to its math kernel, which keeps fp32 copies); eager attention gets the
        # real model's unequal sizes.
        rope = head // 4
        nope = head - rope if attention == "sdpa" else head
        return transformers.DeepseekV3Config(
            intermediate_size=2 * s["ffn"],
            moe_intermediate_size=s["expert_ffn"] // 2,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            q_lora_rank=common["hidden_size"] * 3 // 8,
            kv_lora_rank=common["hidden_size"] // 4,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=head,
            num_key_value_heads=heads,
            **common,
        )
    dense: dict[str, Callable[..., transformers.PretrainedConfig]] = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }
    if family in dense:
        return dense[family](intermediate_size=s["ffn"], num_key_value_heads=heads // 2, **common)
    if family == "mixtral":
        return transformers.MixtralConfig(
            intermediate_size=s["expert_ffn"],
            num_key_value_heads=heads // 2,
            num_local_experts=4,
            num_experts_per_tok=2,
            **common,
        )
    raise ValueError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")


def selective_attention(attention: str) -> str:
    """Register an attention function that recomputes ``attention``'s core (``"sdpa"`` or
    ``"eager"``) in backward, and return its name for ``config._attn_implementation``.

    Selective recomputation as Megatron-LM does it (Korthikanti et al. 2022): the layer
    keeps its activations but not the attention core's (scores, softmax, log-sum-exp,
    output); the core keeps only its inputs q, k and v and runs again during backward.
    ``transformers`` has no such mode, so its own attention function runs under a
    non-reentrant :func:`torch.utils.checkpoint.checkpoint`. The mask is not a checkpoint
    input (the model's forward holds it anyway).
    """
    name = f"selective_{attention}"

    def forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> Any:
        # Eager attention is a function of each model's own modeling file.
        core = (
            sys.modules[type(module).__module__].eager_attention_forward
            if attention == "eager"
            else ALL_ATTENTION_FUNCTIONS[attention]
        )
        return checkpoint(
            lambda q, k, v: core(module, q, k, v, mask, **kwargs),
            query,
            key,
            value,
            use_reentrant=False,
        )

    transformers.AttentionInterface.register(name, forward)
    transformers.AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[attention])
    return name


@dataclasses.dataclass(frozen=True)
class Check:
    """One model and setting: what the estimate says and what was measured (bytes)."""

    family: str
    dtype: str
    attention: str
    recompute: str
    #: Weights, gradients and optimizer state: estimated, and measured.
    model_states: tuple[int, int, int]
    measured_model_states: tuple[int, int, int]
    estimate_total: int
    saved_activations: int
    measured_saved: int
    peak_allocated: int | None
    seconds: float

    @property
    def activation_error(self) -> float:
        """Estimated over measured saved activations, minus one."""
        return self.saved_activations / self.measured_saved - 1


def measure(
    family: str,
    *,
    recompute: str = "none",
    dtype: str = "bf16",
    attention: str = "sdpa",
    size: str = "tiny",
    device: str = "cpu",
) -> Check:
    """A training step of ``family`` measured against the estimate (on CUDA the second
    step, so that the optimizer state exists before the peak is taken). ``recompute`` is
    one of :data:`RECOMPUTE`: ``"selective"`` runs the attention of
    :func:`selective_attention`, ``"full"`` checkpoints every layer."""
    started = time.perf_counter()
    cfg = config(family, attention, size)
    cfg._attn_implementation = (
        selective_attention(attention) if recompute == "selective" else attention
    )
    torch.manual_seed(0)
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=torch_dtype)
    model.train()
    if recompute == "full":
        model.activation_checkpointing_enable()
    if dtype == "fp32":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = None
        options: dict[str, Any] = {"param_dtype": "fp32"}
    else:
        optimizer, step = master_weight_adamw(model, lr=1e-4)
        options = {}
    batch, seq_len = _SIZES[size]["batch"], _SIZES[size]["seq_len"]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=generator).to(device)
    inputs = {"input_ids": ids, "labels": ids}
    measured = None
    for _ in range(2 if device.startswith("cuda") else 1):
        measured = profile(
            model,
            inputs,
            loss_fn=lambda output: output.loss,
            optimizer=optimizer,
            optimizer_step=step,
        )
    if measured is None:
        raise RuntimeError("no step ran")
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    estimate = estimate_memory(
        spec,
        seq_len=seq_len,
        micro_batch=batch,
        recompute=recompute,
        attention="eager" if attention == "eager" else "flash",
        **options,
    )
    return Check(
        family=family,
        dtype=dtype,
        attention=attention,
        recompute=recompute,
        model_states=(estimate.params, estimate.grads, estimate.optimizer),
        measured_model_states=(measured.params, measured.grads, measured.optimizer),
        estimate_total=estimate.total,
        saved_activations=estimate.saved_activations,
        measured_saved=measured.activations,
        peak_allocated=measured.peak_allocated,
        seconds=time.perf_counter() - started,
    )


def table(checks: Sequence[Check]) -> str:
    """The figures as a Markdown table."""
    rows = [
        "| model | recompute | model states (GiB) | saved activations: estimate / measured "
        "| estimate total (GiB) | peak allocated (GiB) | peak / estimate | seconds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        peak = "" if c.peak_allocated is None else f"{c.peak_allocated / GIB:.3f}"
        ratio = "" if c.peak_allocated is None else f"{c.peak_allocated / c.estimate_total:.3f}"
        rows.append(
            f"| {c.family} | {c.recompute} | {sum(c.model_states) / GIB:.3f} "
            f"| {c.saved_activations / GIB:.3f} / {c.measured_saved / GIB:.3f} "
            f"({c.activation_error:+.1%}) | {c.estimate_total / GIB:.3f} | {peak} | {ratio} "
            f"| {c.seconds:.1f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every family without, with selective and with full recomputation and print
    the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(_SIZES), default=None)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args(argv)
    size = args.size or ("gpu" if args.device.startswith("cuda") else "tiny")
    checks = []
    for family in args.families:
        for recompute in RECOMPUTE:
            check = measure(family, recompute=recompute, size=size, device=args.device)
            checks.append(check)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"# {device}, transformers {transformers.__version__}, torch {torch.__version__}")
    print(table(checks))
    exact = all(c.model_states == c.measured_model_states for c in checks)
    print(f"model states exact: {exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
