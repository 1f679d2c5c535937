"""``tokenbatch memory`` and ``tokenbatch plan``: per-GPU memory of a layout, ranked layouts."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from tokenbatch import _core
from tokenbatch.cli.output import atomic_output
from tokenbatch.cli.table import format_table
from tokenbatch.cli.units import (
    BYTES_HELP,
    COUNT_HELP,
    GPU_MEMORY_MINIMUM,
    byte_size,
    count,
    non_negative_real,
    output_file,
    positive_real,
)
from tokenbatch.errors import InvalidValueError
from tokenbatch.memory.estimate import MemoryEstimate, estimate_memory
from tokenbatch.memory.hardware import HARDWARE
from tokenbatch.memory.planner import _DEFAULT_RECOMPUTE, plan_layouts
from tokenbatch.memory.recompute import RECOMPUTE_MODULES
from tokenbatch.memory.results import GIB
from tokenbatch.memory.spec import PRESETS, ModelSpec


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a path to a Hugging Face config.json",
    )
    parser.add_argument(
        "--seq-len", type=count(), default=4096, help="tokens per sequence (default 4096)"
    )
    parser.add_argument("--activation-model", choices=["modern", "korthikanti"], default="modern")
    parser.add_argument("--optimizer", default="adamw", help="adamw, adam, lion, muon, sgd")
    parser.add_argument("--param-dtype", default="bf16", help="bf16, fp16 or fp32")
    parser.add_argument(
        "--optimizer-dtype", default="fp32", help="optimizer states: fp32 (default) or bf16"
    )
    parser.add_argument("--fp32-grad-accum", action="store_true", help="extra fp32 grad buffer")
    parser.add_argument(
        "--mtp-layers",
        type=count(minimum=0),
        help="multi-token-prediction layers (default: the model's)",
    )
    parser.add_argument(
        "--implementation",
        choices=["hf", "fused"],
        default="hf",
        help="whose kernels run the model: Hugging Face modules (default) or fused "
        "Megatron/Transformer Engine ones; decides what is saved for backward",
    )
    parser.add_argument(
        "--moe-dispatcher",
        choices=["alltoall", "allgather"],
        default="alltoall",
        help="Megatron-Core's token dispatcher, with --implementation fused: alltoall "
        "(default) or allgather",
    )
    parser.add_argument(
        "--loss",
        choices=["standard", "fused"],
        default="standard",
        help="fused (chunked) cross-entropy keeps no fp32 logits",
    )
    parser.add_argument("--fp8", action="store_true", help="FP8 matmuls (weights, activations)")
    parser.add_argument(
        "--cp-comm",
        choices=["p2p", "all_gather", "a2a"],
        default="p2p",
        help="how context-parallel ranks exchange keys and values (default p2p ring)",
    )
    parser.add_argument(
        "--optimizer-offload",
        type=non_negative_real,
        default=0.0,
        help="fraction of the optimizer states kept in CPU memory (0 to 1)",
    )
    parser.add_argument(
        "--moe-capacity-factor",
        type=positive_real,
        help="tokens an expert takes, as a multiple of its even share (default: dropless)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers: Any) -> None:
    memory: argparse.ArgumentParser = subparsers.add_parser(
        "memory",
        help="per-GPU memory of a model and parallel layout",
        description="Estimate per-GPU memory (weights, gradients, optimizer, activations). "
        f"{COUNT_HELP} {BYTES_HELP}",
    )
    _add_model(memory)
    memory.add_argument("--micro-batch", type=count(), default=1, help="sequences per micro-batch")
    for name in ("dp", "tp", "pp", "cp", "ep", "vpp"):
        memory.add_argument(f"--{name}", type=count(), default=1, help=f"{name} degree (default 1)")
    memory.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    memory.add_argument("--sequence-parallel", action="store_true")
    memory.add_argument(
        "--recompute",
        type=_recompute_mode,
        default="none",
        metavar="MODE",
        help="none (default); selective: the attention core and, with --implementation "
        "fused, the MLP activations; full; or Megatron-Core's recompute_modules joined with "
        f"'+' ({', '.join(RECOMPUTE_MODULES)}; core_attn alone is Megatron-Core's default "
        "selective, the same as selective with hf)",
    )
    memory.add_argument(
        "--pipeline-split",
        choices=[name for name, _ in _core.memory_option_choices("pipeline_split")],
        default="even",
        help="how layers split over the --pp stages: even (default), auto (first and last "
        "stages take fewer when pp does not divide the layers), or the embedding and/or the "
        "loss counted as a layer (Megatron-LM's --account-for-*-in-pipeline-split)",
    )
    for end in ("first", "last"):
        memory.add_argument(
            f"--{end}-stage-layers",
            type=count(),
            metavar="N",
            help=f"layers of the {end} pipeline stage, the other stages splitting the rest "
            f"evenly (Megatron-LM's --decoder-{end}-pipeline-num-layers; with "
            "--pipeline-split even)",
        )
    memory.add_argument(
        "--gpu-memory",
        type=byte_size(minimum=GPU_MEMORY_MINIMUM),
        help="GPU memory to compare with, e.g. 80GB or 141GB",
    )
    memory.add_argument(
        "--plot", type=output_file(), help="write a stacked-bar chart (needs matplotlib)"
    )
    memory.set_defaults(handler=run_memory)

    planner: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="rank the parallel layouts that fit a cluster",
        description="Enumerate DP/TP/PP/CP/EP, ZeRO, recomputation and micro-batch layouts "
        f"that fit and rank them by estimated step time. {COUNT_HELP} {BYTES_HELP}",
    )
    _add_model(planner)
    planner.add_argument("--gpus", type=count(), required=True, help="number of GPUs")
    planner.add_argument(
        "--hardware",
        choices=sorted(HARDWARE),
        default="h100",
        help="the GPU and its links, for the step-time model (default h100)",
    )
    add_gpu_memory(planner, default=None, what="the hardware's")
    planner.add_argument(
        "--global-batch-tokens",
        type=count(),
        default="4Mi",
        help="tokens per optimizer step, rounded to whole sequences (default 4Mi = 4,194,304)",
    )
    planner.add_argument(
        "--gpus-per-node", type=count(), help="GPUs per node (default: the hardware's)"
    )
    planner.add_argument(
        "--peak-tflops",
        type=positive_real,
        help="dense bf16 TFLOP/s per GPU (default: the hardware's)",
    )
    planner.add_argument(
        "--overlap-ep-comm",
        action="store_true",
        help="expert all-to-all hidden behind compute (as DualPipe does)",
    )
    planner.add_argument(
        "--deduplicated-dispatch",
        action="store_true",
        help="node-limited routing: a token crosses the network once per node",
    )
    planner.add_argument(
        "--recompute",
        type=_recompute_modes,
        default=list(_DEFAULT_RECOMPUTE),
        metavar="MODE[,MODE...]",
        help="recomputation modes to consider, comma-separated: as --recompute of memory "
        f"(default: {','.join(_DEFAULT_RECOMPUTE)})",
    )
    planner.add_argument("--top", type=count(), default=10, help="layouts to list")
    planner.set_defaults(handler=run_plan)


def _recompute_mode(text: str) -> str:
    """One ``--recompute`` mode, in any case, as the core parses it."""
    mode = text.strip().lower()
    try:
        _core.memory_option_code("recompute", mode)
    except InvalidValueError as error:
        raise argparse.ArgumentTypeError(
            f"unknown recomputation mode {text.strip()!r}: {error}"
        ) from None
    return mode


def _recompute_modes(text: str) -> list[str]:
    """``--recompute`` of ``plan``: comma-separated mode names."""
    return [_recompute_mode(mode) for mode in text.split(",")]


def add_gpu_memory(
    parser: argparse.ArgumentParser, *, default: str | None = "80GB", what: str | None = None
) -> None:
    """``--gpu-memory``, a byte size, as ``plan`` and ``schedule`` read it."""
    parser.add_argument(
        "--gpu-memory",
        type=byte_size(minimum=GPU_MEMORY_MINIMUM),
        default=default,
        help=f"memory per GPU (default {what or default})",
    )


def load_spec(model: str) -> ModelSpec:
    """A preset name, or a path to a config.json (or a directory holding one)."""
    if model.lower() in PRESETS:
        return ModelSpec.preset(model)
    if Path(model).exists():
        try:
            return ModelSpec.from_hf_config(model)
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidValueError(
                f"MODEL {model!r} is not a readable config.json ({exc}); give a preset or "
                "the config.json of a Hugging Face model"
            ) from None
    return ModelSpec.preset(model)  # raises with the list of presets


def _options(args: argparse.Namespace) -> dict[str, Any]:
    if args.optimizer_offload > 1:
        raise InvalidValueError(
            f"--optimizer-offload is a fraction from 0 to 1, got {args.optimizer_offload}"
        )
    return {
        "activation_model": args.activation_model,
        "optimizer": args.optimizer,
        "param_dtype": args.param_dtype,
        "optimizer_dtype": args.optimizer_dtype,
        "fp32_grad_accum": args.fp32_grad_accum,
        "loss": args.loss,
        "fp8": args.fp8,
        "cp_comm": args.cp_comm,
        "optimizer_offload": args.optimizer_offload,
        "moe_capacity_factor": args.moe_capacity_factor,
    }


def _spec(args: argparse.Namespace) -> ModelSpec:
    """The model with the implementation, dispatcher and multi-token-prediction layers
    asked for."""
    spec = load_spec(args.model)
    changes: dict[str, Any] = {}
    if args.implementation != spec.implementation:
        changes["implementation"] = args.implementation
    if args.moe_dispatcher != spec.moe_dispatcher:
        changes["moe_dispatcher"] = args.moe_dispatcher
    if args.mtp_layers is not None and args.mtp_layers != spec.mtp_layers:
        changes["mtp_layers"] = args.mtp_layers
    return spec.replace(**changes) if changes else spec


def run_memory(args: argparse.Namespace) -> int:
    spec = _spec(args)
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
        pipeline_split=args.pipeline_split,
        first_stage_layers=args.first_stage_layers,
        last_stage_layers=args.last_stage_layers,
        **_options(args),
    )
    gpu_memory = args.gpu_memory
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
        with atomic_output(args.plot) as partial:
            plot_estimate(estimate, partial, gpu_memory)
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
    spec = _spec(args)
    hardware = HARDWARE[args.hardware]
    gpu_memory = hardware.memory if args.gpu_memory is None else args.gpu_memory
    sequences = max(1, round(args.global_batch_tokens / args.seq_len))  # --seq-len >= 1
    tokens = sequences * args.seq_len
    layouts = plan_layouts(
        spec,
        num_gpus=args.gpus,
        gpu_memory=gpu_memory,
        seq_len=args.seq_len,
        global_batch_tokens=tokens,
        hardware=hardware,
        gpus_per_node=args.gpus_per_node,
        peak_flops=None if args.peak_tflops is None else args.peak_tflops * 1e12,
        overlap_ep_comm=args.overlap_ep_comm,
        deduplicated_dispatch=args.deduplicated_dispatch,
        recompute=args.recompute,
        top=args.top,
        **_options(args),
    )
    if args.json:
        print(json.dumps([vars(layout) for layout in layouts], indent=2))
        return 0 if layouts else 1
    print(
        f"tokenbatch plan: {spec.name} on {args.gpus} {hardware.name} GPUs x "
        f"{gpu_memory / GIB:.1f} GiB, "
        f"seq_len={args.seq_len:,}, {tokens:,} tokens per step"
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
