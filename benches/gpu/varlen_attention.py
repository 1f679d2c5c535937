"""Varlen attention on a packed row whose documents are padded for context parallelism.

    python benches/gpu/varlen_attention.py                  # CUDA if present, else CPU
    python benches/gpu/varlen_attention.py --device cpu --max-tokens 2048

A typical row of ``--max-tokens`` tokens is packed from web-text-like document lengths
with ``tokenbatch.pack(..., pad_to_multiple_of=2 * cp)`` and collated with
``PackedCollator(pad_each_to_multiple_of=2 * cp)``. Causal attention over the row is then
computed by every implementation available here, all from ``cu_seqlens_padded``:

* ``per_document``: scaled_dot_product_attention over each document's real tokens alone,
  the reference;
* ``padded_documents``: the same over each padded document (padding included);
* ``block_diagonal``: one scaled_dot_product_attention call with a dense block-diagonal
  causal mask;
* ``flash_attn_varlen``: ``flash_attn_varlen_func`` (CUDA, if flash-attn is installed);
* ``torch_varlen``: ``torch.nn.attention.varlen.varlen_attn`` (CUDA, recent PyTorch).

For each it prints the largest difference from the reference on the real tokens and the
median time of a forward and of a forward plus backward pass. Runs in well under five
minutes on one GPU; the CPU run (SDPA paths only) is what the test suite executes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

import tokenbatch as tb
from tokenbatch.datasets import example_lengths
from tokenbatch.torch import PackedCollator

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def packed_layout(max_tokens: int, multiple: int, seed: int) -> tuple[list[int], list[int]]:
    """``cu_seqlens`` and ``cu_seqlens_padded`` of a typical bin of a packing: the first
    one holding the median number of documents."""
    lengths = example_lengths("lognormal", 4000, max_length=max_tokens // 2, seed=seed)
    packing = tb.pack(lengths, max_tokens, pad_to_multiple_of=multiple)
    counts = np.diff(packing.bin_offsets)
    typical = int(np.flatnonzero(counts == np.sort(counts)[(len(counts) - 1) // 2])[0])
    segments = slice(packing.bin_offsets[typical], packing.bin_offsets[typical + 1])
    items = [[0] * int(n) for n in packing.lengths[segments]]
    batch = PackedCollator(pad_each_to_multiple_of=multiple)(items)
    return batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()


def implementations(
    cu: list[int], cu_padded: list[int], device: torch.device
) -> dict[str, Attention | str]:
    """Each implementation over ``[tokens, heads, dim]`` tensors, or why it cannot run."""
    spans = [(cu_padded[d], cu[d + 1] - cu[d], cu_padded[d + 1]) for d in range(len(cu) - 1)]
    max_padded = max(end - start for start, _, end in spans)
    cu_padded_t = torch.tensor(cu_padded, dtype=torch.int32, device=device)

    def heads_first(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    def per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(q)
        for start, n, _ in spans:
            part = [heads_first(x[start : start + n]) for x in (q, k, v)]
            out[start : start + n] = heads_first(sdpa(*part, is_causal=True))
        return out

    def padded_documents(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        parts = [
            heads_first(sdpa(*(heads_first(x[start:end]) for x in (q, k, v)), is_causal=True))
            for start, _, end in spans
        ]
        return torch.cat(parts)

    document = torch.repeat_interleave(
        torch.arange(len(spans), device=device), torch.diff(cu_padded_t.long())
    )
    mask = (document[:, None] == document[None, :]).tril()

    def block_diagonal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return heads_first(sdpa(*(heads_first(x) for x in (q, k, v)), attn_mask=mask))

    found: dict[str, Attention | str] = {
        "per_document": per_document,
        "padded_documents": padded_documents,
        "block_diagonal": block_diagonal,
    }
    if device.type != "cuda":
        found["flash_attn_varlen"] = found["torch_varlen"] = "needs CUDA"
        return found
    try:
        from flash_attn import flash_attn_varlen_func

        def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            args = (cu_padded_t, cu_padded_t, max_padded, max_padded)
            return flash_attn_varlen_func(q, k, v, *args, causal=True)  # type: ignore[no-any-return]

        found["flash_attn_varlen"] = flash
    except ImportError as exc:
        found["flash_attn_varlen"] = f"not installed ({exc.name})"
    try:
        from torch.nn.attention.varlen import varlen_attn

        def torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            args = (cu_padded_t, cu_padded_t, max_padded, max_padded)
            return varlen_attn(q, k, v, *args, window_size=(-1, 0))  # type: ignore[no-any-return]

        found["torch_varlen"] = torch_varlen
    except ImportError:
        found["torch_varlen"] = f"not in torch {torch.__version__}"
    return found


def median_ms(step: Callable[[], Any], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def run(
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_tokens: int,
    cp_size: int,
    heads: int,
    head_dim: int,
    repeats: int,
    seed: int,
) -> list[dict[str, Any]]:
    """One record per implementation: error on real tokens against per_document, times."""
    cu, cu_padded = packed_layout(max_tokens, 2 * cp_size, seed)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shape = (cu_padded[-1], heads, head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(3))
    real = torch.cat(
        [torch.arange(cu_padded[d], cu_padded[d] + cu[d + 1] - cu[d]) for d in range(len(cu) - 1)]
    )
    found = implementations(cu, cu_padded, device)
    reference_fn = found["per_document"]
    assert callable(reference_fn)
    reference = reference_fn(q, k, v).float()[real]
    records: list[dict[str, Any]] = []
    for name, attention in found.items():
        record: dict[str, Any] = {"name": name, "tokens": cu_padded[-1], "documents": len(cu) - 1}
        if isinstance(attention, str):
            records.append({**record, "skipped": attention})
            continue
        out = attention(q, k, v)
        record["max_error"] = float((out.float()[real] - reference).abs().max())
        record["forward_ms"] = median_ms(lambda f=attention: f(q, k, v), device, repeats)
        grads = [x.detach().requires_grad_() for x in (q, k, v)]

        def forward_backward(f: Attention = attention, x: Sequence[torch.Tensor] = grads) -> None:
            f(*x).float().square().mean().backward()

        record["forward_backward_ms"] = median_ms(forward_backward, device, repeats)
        records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--cp", type=int, default=4, help="documents padded to 2 * cp")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    records = run(
        device=device,
        dtype=getattr(torch, dtype_name),
        max_tokens=args.max_tokens,
        cp_size=args.cp,
        heads=args.heads,
        head_dim=args.head_dim,
        repeats=args.repeats,
        seed=args.seed,
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    first = records[0]
    print(
        f"{name}, torch {torch.__version__}, {dtype_name}: {first['tokens']} tokens, "
        f"{first['documents']} documents padded to multiples of {2 * args.cp}, "
        f"{args.heads} heads x {args.head_dim}"
    )
    print(f"{'implementation':<18} {'max error':>10} {'forward ms':>11} {'fwd+bwd ms':>11}")
    for record in records:
        if "skipped" in record:
            print(f"{record['name']:<18} skipped: {record['skipped']}")
        else:
            print(
                f"{record['name']:<18} {record['max_error']:>10.2e} "
                f"{record['forward_ms']:>11.2f} {record['forward_backward_ms']:>11.2f}"
            )
    return records


if __name__ == "__main__":
    main()
