"""tokenbatch: token-based batch sizing for LLM training.

Packing of variable-length sequences into token budgets, PyTorch samplers and collators
for distributed training, memory planning and batch-size schedules, over a Rust core.
"""

from __future__ import annotations

from tokenbatch._core import __version__
from tokenbatch.errors import (
    InvalidTypeError,
    InvalidValueError,
    OversizeError,
    TokenBatchError,
    TokenBatchOverflowError,
)
from tokenbatch.packing import Packing, batch_padded, pack

__all__ = [
    "InvalidTypeError",
    "InvalidValueError",
    "OversizeError",
    "Packing",
    "TokenBatchError",
    "TokenBatchOverflowError",
    "__version__",
    "batch_padded",
    "pack",
]
