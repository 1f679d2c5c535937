"""Batch-size schedules, token arithmetic and learning rates keyed to tokens.

State the batch in tokens and let everything else follow: sequences per step, gradient
accumulation, optimizer steps for a token budget (:mod:`~tokenbatch.schedule.tokens`),
batch-size ramps during training (Megatron-LM's ``--rampup-batch-size``, DeepSeek-V3's and
GPT-3's linear ramps, Llama 3's doublings, Megatron-LM's ``--step-batch-size-schedule``:
:mod:`~tokenbatch.schedule.batch`) and learning-rate schedules defined in tokens
(:mod:`~tokenbatch.schedule.lr`). The per-step arithmetic runs in the Rust core;
:mod:`tokenbatch.megatron` reads and writes Megatron-LM's launcher arguments.
"""

from __future__ import annotations

from tokenbatch.schedule.batch import (
    PRESETS,
    BatchSchedule,
    LinearRamp,
    MegatronRampup,
    MegatronStepSchedule,
    Piecewise,
    deepseek_v3_ramp,
    gpt3_ramp,
    group_into_steps,
    llama3_405b_schedule,
    steps_for_tokens,
)
from tokenbatch.schedule.lr import (
    BatchScaledLR,
    ConstantLR,
    CosineLR,
    LRSchedule,
    WarmupStableDecayLR,
    rescale_lr,
)
from tokenbatch.schedule.tokens import (
    grad_accum_steps,
    sequences_per_step,
    tokens_for_steps,
    tokens_per_step,
)

__all__ = [
    "PRESETS",
    "BatchScaledLR",
    "BatchSchedule",
    "ConstantLR",
    "CosineLR",
    "LRSchedule",
    "LinearRamp",
    "MegatronRampup",
    "MegatronStepSchedule",
    "Piecewise",
    "WarmupStableDecayLR",
    "deepseek_v3_ramp",
    "gpt3_ramp",
    "grad_accum_steps",
    "group_into_steps",
    "llama3_405b_schedule",
    "rescale_lr",
    "sequences_per_step",
    "steps_for_tokens",
    "tokens_for_steps",
    "tokens_per_step",
]
