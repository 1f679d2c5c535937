"""``tokenbatch memory`` and ``tokenbatch plan``: per-GPU memory of a layout, ranked layouts."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from tokenbatch.cli.table import format_table
from tokenbatch.errors import InvalidValueError
from tokenbatch.memory.estimate import GIB, MemoryEstimate, estimate_memory
from tokenbatch.memory.planner import plan
from tokenbatch.memory.spec import PRESETS, ModelSpec

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_size(text: str, *, binary_bytes: bool = False) -> float:
    """``"80GiB"``, ``"80GB"``, ``"4M"``, ``"1e9"`` -> a number (``GiB`` powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise InvalidValueError(f"cannot read {text!r} as a size (e.g. 80GiB, 4M, 1e9)")
    value, unit = float(match.group(1)), (match.group(2) or "").lower()
    prefix = unit[:1] if unit[:1] != "b" else ""
    if "i" in unit or (binary_bytes and unit.endswith("b") and prefix):
        scale = 1024.0 ** ("kmgtp".index(prefix) + 1) if prefix else 1.0
    else:
        scale = _UNITS[prefix]
    return value * scale


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a path to a Hugging Face config.json",
    )
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--activation-model", choices=["modern", "korthikanti"], default="modern")
    parser.add_argument("--optimizer", default="adamw", help="adamw, adam, lion, muon, sgd")
    parser.add_argument("--param-dtype", default="bf16", help="bf16, fp16 or fp32")
    parser.add_argument("--fp32-grad-accum", action="store_true", help="extra fp32 grad buffer")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers: Any) -> None:
    memory: argparse.ArgumentParser = subparsers.add_parser(
        "memory",
        help="per-GPU memory of a model and parallel layout",
        description="Estimate per-GPU memory (weights, gradients, optimizer, activations).",
    )
    _add_model(memory)
    memory.add_argument("--micro-batch", type=int, default=1)
    for name in ("dp", "tp", "pp", "cp", "ep", "vpp"):
        memory.add_argument(f"--{name}", type=int, default=1)
    memory.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    memory.add_argument("--sequence-parallel", action="store_true")
    memory.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    memory.add_argument("--gpu-memory", help="GPU memory to compare with, e.g. 80GB or 141GB")
    memory.add_argument("--plot", type=Path, help="write a stacked-bar chart (needs matplotlib)")
    memory.set_defaults(handler=run_memory)

    planner: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="rank the parallel layouts that fit a cluster",
        description="Enumerate DP/TP/PP/CP/EP, ZeRO, recomputation and micro-batch layouts "
        "that fit and rank them by estimated step time.",
    )
    _add_model(planner)
    planner.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    planner.add_argument("--gpu-memory", default="80GB", help="memory per GPU (default 80GB)")
    planner.add_argument(
        "--global-batch-tokens",
        default="4Mi",
        help="tokens per optimizer step, rounded to whole sequences (default 4Mi = 4,194,304)",
    )
    planner.add_argument("--gpus-per-node", type=int, default=8)
    planner.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s")
    planner.add_argument("--top", type=int, default=10)
    planner.set_defaults(handler=run_plan)


def load_spec(model: str) -> ModelSpec:
    """A preset name, or a path to a config.json (or a directory holding one)."""
    if model.lower() in PRESETS:
        return ModelSpec.preset(model)
    if Path(model).exists():
        return ModelSpec.from_hf_config(model)
    return ModelSpec.preset(model)  # raises with the list of presets


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "activation_model": args.activation_model,
        "optimizer": args.optimizer,
        "param_dtype": args.param_dtype,
        "fp32_grad_accum": args.fp32_grad_accum,
    }


def run_memory(args: argparse.Namespace) -> int:
    spec = load_spec(args.model)
    estimate = estimate_memory(
        spec,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        ep=args.ep,
        vpp=args.vpp,
        zero=args.zero,
        sequence_parallel=args.sequence_parallel,
        recompute=args.recompute,
        **_options(args),
    )
    gpu_memory = None if args.gpu_memory is None else parse_size(args.gpu_memory)
    if args.json:
        result: dict[str, Any] = {"model": spec.name, **estimate.to_dict()}
        if gpu_memory is not None:
            result["fits"] = estimate.fits(gpu_memory)
        print(json.dumps(result, indent=2))
    else:
        print(estimate.explanation())
        if gpu_memory is not None:
            verdict = "fits" if estimate.fits(gpu_memory) else "does NOT fit"
            print(f"\n{verdict} in {gpu_memory / GIB:.1f} GiB")
    if args.plot is not None:
        plot_estimate(estimate, args.plot, gpu_memory)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def plot_estimate(estimate: MemoryEstimate, path: Path, gpu_memory: float | None) -> None:
    """A stacked bar of the breakdown (matplotlib, the ``plot`` extra)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise InvalidValueError("--plot needs matplotlib: pip install 'tokenbatch[plot]'") from exc
    parts = {
        "params": estimate.params,
        "grads": estimate.grads,
        "optimizer": estimate.optimizer,
        **{f"act: {k}": v for k, v in estimate.activation_parts.items() if v},
    }
    figure, axis = plt.subplots(figsize=(4, 6))
    bottom = 0.0
    for label, value in parts.items():
        axis.bar([estimate.spec.name], [value / GIB], bottom=bottom, label=label)
        bottom += value / GIB
    if gpu_memory is not None:
        axis.axhline(gpu_memory / GIB, color="black", linestyle="--", label="GPU memory")
    axis.set_ylabel("GiB per GPU")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def run_plan(args: argparse.Namespace) -> int:
    spec = load_spec(args.model)
    gpu_memory = parse_size(args.gpu_memory)
    tokens = parse_size(args.global_batch_tokens)
    sequences = max(1, round(tokens / args.seq_len))
    if args.seq_len <= 0:
        raise InvalidValueError(f"--seq-len must be positive, got {args.seq_len}")
    tokens = float(sequences * args.seq_len)
    layouts = plan(
        spec,
        num_gpus=args.gpus,
        gpu_memory=gpu_memory,
        seq_len=args.seq_len,
        global_batch_tokens=int(tokens),
        gpus_per_node=args.gpus_per_node,
        peak_flops=args.peak_tflops * 1e12,
        top=args.top,
        **_options(args),
    )
    if args.json:
        print(json.dumps([vars(layout) for layout in layouts], indent=2))
        return 0 if layouts else 1
    print(
        f"tokenbatch plan: {spec.name} on {args.gpus} GPUs x {gpu_memory / GIB:.1f} GiB, "
        f"seq_len={args.seq_len:,}, {int(tokens):,} tokens per step"
    )
    if not layouts:
        print("no layout fits")
        return 1
    header = ["rank", "dp", "tp", "pp", "cp", "ep", "zero", "recompute", "mbs", "accum"]
    header += ["GiB/GPU", "step s", "MFU", "tokens/s"]
    rows = [
        [
            str(i + 1),
            *(str(v) for v in (x.dp, x.tp, x.pp, x.cp, x.ep, x.zero, x.recompute)),
            str(x.micro_batch),
            str(x.grad_accum_steps),
            f"{x.memory / GIB:.1f}",
            f"{x.step_time:.2f}",
            f"{x.mfu:.1%}",
            f"{x.tokens_per_second:,.0f}",
        ]
        for i, x in enumerate(layouts)
    ]
    print(format_table(header, rows))
    print("assumptions: see help(tokenbatch.memory.planner); memory fits within 90% of the GPU")
    return 0
