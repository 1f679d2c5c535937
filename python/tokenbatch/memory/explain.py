"""The text of :meth:`MemoryEstimate.explanation`: each line's bytes with its formula."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenbatch.memory.results import MemoryEstimate

__all__ = ["explain"]

GIB = 1024**3


def _gib(value: float) -> str:
    return f"{value / GIB:10.3f}"


def _bytes(value: float) -> str:
    return f"{value:g}"


def explain(est: MemoryEstimate) -> str:
    o = est.options
    n = est.inputs
    spec = est.spec
    param_b = n["param_bytes"]
    grad_b = n["grad_bytes"]
    accum = n["grad_buffer_bytes"]
    master = n["master_bytes"]
    states = n["optimizer_state_bytes"]
    zero = int(o["zero"])
    group = int(o["dp"]) * int(o["cp"])
    layout = ", ".join(
        f"{k}={o[k]}" for k in ("seq_len", "micro_batch", "dp", "tp", "pp", "cp", "ep", "vpp")
    )
    lines = [
        f"{spec.name}: {spec.num_params():,} parameters ({spec.num_active_params():,} active)",
        f"layout: {layout}, zero={zero}, sequence_parallel={o['sequence_parallel']}, "
        f"recompute={o['recompute']}",
        f"per GPU, busiest pipeline stage = {est.stage} (of {o['pp']}), holding {est.layers} "
        f"of {spec.num_layers} layers (pipeline_split={o['pipeline_split']!r}"
        + (f", first_stage_layers={o['first_stage_layers']}" if o["first_stage_layers"] else "")
        + (f", last_stage_layers={o['last_stage_layers']}" if o["last_stage_layers"] else "")
        + ")",
        "",
        f"{'component':<16}{'GiB':>10}  how",
        f"{'params':<16}{_gib(est.params)}  {_bytes(param_b)} B/param ({o['param_dtype']})"
        + (f", sharded over dp*cp={group} (ZeRO-3)" if zero >= 3 else ""),
        f"{'grads':<16}{_gib(est.grads)}  {_bytes(grad_b)}"
        f"{f' + {_bytes(accum)} (fp32 accumulation)' if accum else ''} B/param"
        + (f", sharded over dp*cp={group} (ZeRO-2)" if zero >= 2 else ""),
        f"{'optimizer':<16}{_gib(est.optimizer)}  "
        f"{_bytes(master)} (master weights) + {_bytes(states)} "
        f"({o['optimizer']} states in {o['optimizer_dtype']}) B/param"
        + (f", sharded over dp*cp={group} (ZeRO-1)" if zero >= 1 else "")
        + (
            f", {_gib(est.cpu_optimizer).strip()} GiB more offloaded to CPU"
            if est.cpu_optimizer
            else ""
        ),
        f"{'activations':<16}{_gib(est.activations)}  {o['activation_model']} model"
        f" ({spec.implementation} kernels"
        + (
            f", {spec.moe_dispatcher} dispatcher"
            if spec.is_moe and spec.implementation == "fused"
            else ""
        )
        + f"), {_bytes(n['activation_bytes'])} B/element"
        + (", FP8 linear inputs" if n["fp8"] else "")
        + f", {o['micro_batch']} x {o['seq_len']} tokens / cp per micro-batch",
    ]
    how = {
        "attention": "qkv input, q/k/v, output, softmax stats (or s x s probabilities)",
        "mlp": "MLP/MoE input and inner activations",
        "norm": "norm inputs and fp32 statistics (residual stream)",
        "embedding": "token ids / embedding dropout mask, per micro-batch in flight",
        "logits": "final norm, head input, logits (or log-sum-exp) for the loss",
        "checkpoints": "layer inputs kept by full recomputation",
        "working": "one layer recomputed during backward",
        "comm": "EP all-to-all / CP key-value buffers of one layer",
        "mtp": "multi-token-prediction modules",
    }
    for part, value in est.activation_parts.items():
        if value:
            lines.append(f"  {part:<14}{_gib(value)}  {how[part]}")
    if est.overhead:
        lines.append(f"{'overhead':<16}{_gib(est.overhead)}  overhead_bytes")
    lines.append(f"{'total':<16}{_gib(est.total)}")
    lines += [
        "",
        "sources: model states 2+2+12 B/param and ZeRO divisions: Rajbhandari et al. 2020;",
        "activations: Korthikanti et al. 2022 (korthikanti) or the saved tensors of a modern",
        "block (modern); pipeline in-flight micro-batches: Narayanan et al. 2021.",
    ]
    return "\n".join(lines)
