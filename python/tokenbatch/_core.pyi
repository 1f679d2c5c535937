"""Type stubs of the compiled extension ``tokenbatch._core`` (checked by mypy.stubtest).

Private API: use the typed wrappers of the ``tokenbatch`` package instead.
"""

from typing import final

import numpy as np
import numpy.typing as npt

# pyo3 lists every name added to the module in __all__; keep this list in step with it.
__all__ = [
    "ContextParallelShard",
    "Schedule",
    "__version__",
    "batch_padded",
    "cp_rank_major_order",
    "cp_shard",
    "gather_segments",
    "get_num_threads",
    "memory_fields",
    "memory_grid",
    "memory_param_counts",
    "pack",
    "set_num_threads",
]

__version__: str

_I64 = npt.NDArray[np.int64]
_Lengths = npt.NDArray[np.int64] | npt.NDArray[np.int32]
_RawPacking = tuple[_I64, _I64, _I64, _I64, _I64, dict[str, int]]

def pack(
    lengths: _Lengths,
    max_tokens: int,
    *,
    algorithm: str,
    max_seqs: int | None,
    pad_to_multiple_of: int,
    oversize: str,
    seed: int,
) -> _RawPacking: ...
def batch_padded(
    lengths: _Lengths,
    max_tokens: int,
    *,
    max_seqs: int | None,
    pad_to_multiple_of: int,
    oversize: str,
) -> _RawPacking: ...

# --- gather ---

_Words = (
    npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32] | npt.NDArray[np.uint64]
)

def gather_segments(values: _Words, starts: _I64, lengths: _I64) -> _Words: ...

# --- context parallelism ---

@final
class ContextParallelShard:
    """The part of a packed row that one context-parallel rank processes.

    ``indices``: positions in the padded row of this rank's tokens, in its order (for each
    document, chunk ``cp_rank`` then chunk ``2 * cp_size - 1 - cp_rank``);
    ``cu_seqlens``: cumulative real tokens of each document on this rank;
    ``cu_seqlens_padded``: cumulative tokens of each document on this rank
    (``cu_seqlens_padded // cp_size`` of the whole row). Read-only int64 arrays.
    """

    @property
    def indices(self) -> _I64:
        """Positions in the padded row of this rank's tokens, in the rank's order."""
    @property
    def cu_seqlens(self) -> _I64:
        """Cumulative count of each document's real (not padding) tokens on this rank."""
    @property
    def cu_seqlens_padded(self) -> _I64:
        """Cumulative count of each document's tokens on this rank, padding included."""

def cp_shard(
    cu_seqlens: _I64, cu_seqlens_padded: _I64, cp_size: int, cp_rank: int
) -> ContextParallelShard: ...
def cp_rank_major_order(cu_seqlens_padded: _I64, cp_size: int) -> _I64: ...

# --- schedule ---

@final
class Schedule:
    """A validated batch-size schedule (see ``tokenbatch.schedule``)."""

    @staticmethod
    def megatron(
        start: int,
        increment: int,
        ramp_samples: int,
        global_batch: int,
        seq_len: int | None,
    ) -> Schedule: ...
    @staticmethod
    def linear(
        start: int,
        end: int,
        ramp_tokens: int,
        *,
        unit: str,
        seq_len: int | None,
        by: str,
        multiple_of: int,
    ) -> Schedule: ...
    @staticmethod
    def piecewise(
        from_tokens: _I64,
        batches: _I64,
        *,
        unit: str,
        seq_len: int | None,
        allow_decrease: bool,
    ) -> Schedule: ...
    @staticmethod
    def megatron_steps(from_samples: _I64, batches: _I64, seq_len: int | None) -> Schedule: ...
    def batch_at(self, consumed: _I64) -> _I64: ...
    def table(
        self, total_tokens: int, micro_batch_tokens: int, dp: int
    ) -> tuple[_I64, _I64, _I64, _I64]: ...
    def group_into_steps(self, micro_batch_tokens: _I64, dp: int, consumed_tokens: int) -> _I64: ...
    def megatron_train_iters(self, train_samples: int) -> int | None: ...

# memory

def memory_param_counts(spec: dict[str, object]) -> tuple[float, float]: ...
def memory_grid(
    spec: dict[str, object],
    shape: list[int],
    inputs: list[tuple[npt.NDArray[np.float64], list[int]]],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]: ...
def memory_fields() -> tuple[list[str], list[str], list[str]]: ...

# --- threads -------------------------------------------------------------------------

def set_num_threads(threads: int | None) -> None: ...
def get_num_threads() -> int: ...
