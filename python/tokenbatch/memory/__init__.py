"""Memory estimation and parallel-layout planning for LLM training."""

from __future__ import annotations

from tokenbatch.memory.estimate import (
    DTYPE_BYTES,
    OPTIMIZER_STATES,
    MemoryEstimate,
    MemoryGrid,
    estimate_memory,
    estimate_memory_grid,
    estimate_memory_stages,
    max_micro_batch_tokens,
)
from tokenbatch.memory.hardware import HARDWARE, Hardware
from tokenbatch.memory.planner import PlannedLayout, plan_layouts
from tokenbatch.memory.profiling import ProfileResult, master_weight_adamw, profile
from tokenbatch.memory.recompute import RECOMPUTE_MODES, RECOMPUTE_MODULES
from tokenbatch.memory.spec import PRESETS, ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "HARDWARE",
    "OPTIMIZER_STATES",
    "PRESETS",
    "RECOMPUTE_MODES",
    "RECOMPUTE_MODULES",
    "Hardware",
    "MemoryEstimate",
    "MemoryGrid",
    "ModelSpec",
    "PlannedLayout",
    "ProfileResult",
    "estimate_memory",
    "estimate_memory_grid",
    "estimate_memory_stages",
    "master_weight_adamw",
    "max_micro_batch_tokens",
    "plan_layouts",
    "profile",
]
