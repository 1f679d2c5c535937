"""Estimates against what PyTorch really holds in a training step of small plain models.

The modules here are written the way fused-kernel code bases run them (a norm that keeps
only its input and fp32 statistics, selective recomputation of the attention core and of
the MLP activation), so they check the ``implementation="fused"`` side of the model; the
Hugging Face side is checked on ``transformers`` itself in test_memory_transformers.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.checkpoint import checkpoint

from tokenbatch import ModelSpec, estimate_memory, profile
from tokenbatch.memory import master_weight_adamw


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm that saves only its input and the fp32 reciprocal RMS, as fused kernels do."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_weight = (g * xhat).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
        dxhat = g * weight.float()
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormFunction.apply(x, self.weight, 1e-5)
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _swiglu(gate: torch.Tensor, up: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    hidden = functional.silu(gate) * up
    return hidden if probs is None else hidden * probs


def _rebuild(*saved: Any) -> tuple[list[Any], torch.Tensor]:
    """``_swiglu`` of saved inputs, run again with gradients: the inputs and its output."""
    inputs = [x if x is None else x.detach().requires_grad_() for x in saved]
    with torch.enable_grad():
        return inputs, _swiglu(*inputs)


def _input_grads(inputs: list[Any], hidden: torch.Tensor, grad: torch.Tensor) -> tuple[Any, ...]:
    grads = iter(torch.autograd.grad(hidden, [x for x in inputs if x is not None], grad))
    return tuple(None if x is None else next(grads) for x in inputs)


class _Rebuilt(torch.autograd.Function):
    """``_swiglu`` that keeps only its inputs, as one fused kernel does."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, probs: Any) -> torch.Tensor:
        ctx.save_for_backward(gate, up, probs)
        return _swiglu(gate, up, probs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        inputs, hidden = _rebuild(*ctx.saved_tensors)
        return _input_grads(inputs, hidden, grad)


class _SwiGLUDown(torch.autograd.Function):
    """``down(_swiglu(gate, up, probs))`` keeping only ``gate``, ``up`` and ``probs``: the
    activation is rebuilt in backward, as selective recomputation of the MLP activation
    does (Megatron-Core frees the recomputed output the second projection would keep)."""

    @staticmethod
    def forward(
        ctx: Any, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, probs: Any
    ) -> Any:
        ctx.save_for_backward(gate, up, weight, probs)
        return functional.linear(_swiglu(gate, up, probs), weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        gate, up, weight, probs = ctx.saved_tensors
        inputs, hidden = _rebuild(gate, up, probs)
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ hidden.detach().reshape(
            -1, hidden.shape[-1]
        )
        grad_gate, grad_up, grad_probs = _input_grads(inputs, hidden, grad @ weight)
        return grad_gate, grad_up, grad_weight, grad_probs


class SwiGLU(nn.Module):
    """A SwiGLU MLP. With ``probs`` (an expert's routing weights) they are applied inside
    the activation, which keeps them and not the expert's output, as Megatron-Core's
    weighted SwiGLU does; the weighted activation is one function that keeps only its
    inputs (a fused kernel's)."""

    def __init__(self, h: int, f: int, selective: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.selective = selective

    def forward(self, x: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = self.gate(x), self.up(x)
        if self.selective:
            out: torch.Tensor = _SwiGLUDown.apply(gate, up, self.down.weight, probs)
            return out
        hidden = _swiglu(gate, up, None) if probs is None else _Rebuilt.apply(gate, up, probs)
        out = self.down(hidden)
        return out


class MoE(nn.Module):
    """Mixtral-style top-k routing over SwiGLU experts weighted inside their activation,
    combined with a scatter-add that keeps only the indices (as Megatron-Core's
    unpermute does)."""

    def __init__(self, h: int, f: int, experts: int, top_k: int, selective: bool) -> None:
        super().__init__()
        self.router = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(h, f, selective) for _ in range(experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = functional.softmax(self.router(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == index)
            y = expert(x[token], weights[token, slot, None])
            out = out.index_put((token,), y, accumulate=True)
        return out.reshape(shape)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, selective: bool) -> None:
        super().__init__()
        self.selective = selective
        h, d = spec.hidden_size, spec.head_size
        self.heads, self.kv_heads, self.d = spec.num_heads, spec.kv_heads, d
        self.norm1 = RMSNorm(h)
        self.q = nn.Linear(h, spec.num_heads * d, bias=False)
        self.k = nn.Linear(h, spec.kv_heads * d, bias=False)
        self.v = nn.Linear(h, spec.kv_heads * d, bias=False)
        self.o = nn.Linear(spec.num_heads * d, h, bias=False)
        self.norm2 = RMSNorm(h)
        self.mlp: nn.Module = (
            MoE(h, spec.moe_ffn_size, spec.num_experts, spec.top_k, selective)
            if spec.is_moe
            else SwiGLU(h, spec.ffn_size, selective)
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(y).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.v(y).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.selective:
            # Selective recomputation of the attention core: only its inputs are kept.
            attn = checkpoint(_attention, q, k, v, use_reentrant=False)
        else:
            attn = _attention(q, k, v)
        x = x + self.o(attn.transpose(1, 2).reshape(b, s, -1))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class Llama(nn.Module):
    def __init__(self, spec: ModelSpec, seq_len: int, selective: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.blocks = nn.ModuleList(Block(spec, selective) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size)
        self.head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        angles = torch.outer(torch.arange(seq_len), torch.rand(spec.head_size // 2))
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1))
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        cos, sin = self.cos[: ids.shape[1]], self.sin[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x)).float()
        return functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


DENSE = ModelSpec(
    hidden_size=256,
    num_layers=3,
    num_heads=8,
    num_kv_heads=2,
    ffn_size=704,
    vocab_size=512,
    implementation="fused",
)
MOE = ModelSpec(
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    ffn_size=352,
    vocab_size=256,
    num_experts=4,
    top_k=2,
    moe_ffn_size=256,
    implementation="fused",
)


def _batch(spec: ModelSpec, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (b, s), generator=generator)
    return ids, torch.roll(ids, -1, dims=1)


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("spec", [DENSE, MOE], ids=["dense", "moe"])
def test_mixed_precision_step_matches_the_estimate(spec: ModelSpec, recompute: str) -> None:
    torch.manual_seed(0)
    b, s = 2, 128
    model = Llama(spec, s, selective=recompute == "selective").to(torch.bfloat16)
    optimizer, step = master_weight_adamw(model, lr=1e-3)
    measured = profile(model, _batch(spec, b, s), optimizer=optimizer, optimizer_step=step)
    # The experts' weighted activation is one function keeping only its inputs, as with
    # `fused_swiglu`; the dense MLP is plain autograd.
    estimate = estimate_memory(
        spec, seq_len=s, micro_batch=b, recompute=recompute, fused_swiglu=spec.is_moe
    )
    n = spec.num_params()
    assert measured.params == estimate.params == 2 * n
    assert measured.grads == estimate.grads == 2 * n
    assert measured.optimizer == estimate.optimizer == 12 * n
    assert measured.peak_allocated is None
    assert math.isclose(estimate.activations, measured.activations, rel_tol=0.05), (
        estimate.activation_parts,
        measured.activations,
    )


def test_fp32_adamw_matches_exactly_and_activations_scale_with_tokens() -> None:
    torch.manual_seed(0)
    spec = DENSE
    model = Llama(spec, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options: dict[str, Any] = {"param_dtype": "fp32", "master_weights": False}
    n = spec.num_params()
    for b, s in [(1, 128), (2, 256)]:
        measured = profile(model, _batch(spec, b, s), optimizer=optimizer)
        estimate = estimate_memory(spec, seq_len=s, micro_batch=b, **options)
        assert measured.params == estimate.params == 4 * n
        assert measured.grads == estimate.grads == 4 * n
        assert measured.optimizer == estimate.optimizer == 8 * n
        assert math.isclose(estimate.activations, measured.activations, rel_tol=0.05)


def test_profile_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="model"):
        profile("not a module", torch.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scalar"):
        profile(nn.Linear(2, 2), torch.zeros(3, 2))
