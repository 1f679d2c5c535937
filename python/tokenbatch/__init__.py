"""tokenbatch: token-based batch sizing for LLM training.

Packing of variable-length sequences into token budgets, PyTorch samplers and collators
for distributed training, memory planning and batch-size schedules, over a Rust core.
"""

from __future__ import annotations

from tokenbatch import datasets, scaling, schedule
from tokenbatch._core import __version__, get_num_threads, set_num_threads
from tokenbatch.errors import (
    InternalError,
    InvalidTypeError,
    InvalidValueError,
    OversizeError,
    TokenBatchError,
    TokenBatchOverflowError,
)
from tokenbatch.memory import (
    MemoryEstimate,
    MemoryGrid,
    ModelSpec,
    PlannedLayout,
    ProfileResult,
    estimate_memory,
    estimate_memory_grid,
    max_micro_batch_tokens,
    plan_layouts,
    profile,
)
from tokenbatch.packing import Packing, batch_padded, pack, pack_costs
from tokenbatch.stream import StreamPacker

__all__ = [
    "InternalError",
    "InvalidTypeError",
    "InvalidValueError",
    "MemoryEstimate",
    "MemoryGrid",
    "ModelSpec",
    "OversizeError",
    "Packing",
    "PlannedLayout",
    "ProfileResult",
    "StreamPacker",
    "TokenBatchError",
    "TokenBatchOverflowError",
    "__version__",
    "batch_padded",
    "datasets",
    "estimate_memory",
    "estimate_memory_grid",
    "get_num_threads",
    "max_micro_batch_tokens",
    "pack",
    "pack_costs",
    "plan_layouts",
    "profile",
    "scaling",
    "schedule",
    "set_num_threads",
]
