"""Type stubs of the compiled extension ``tokenbatch._core`` (checked by mypy.stubtest).

Private API: use the typed wrappers of the ``tokenbatch`` package instead.
"""

from typing import final

import numpy as np
import numpy.typing as npt

# pyo3 lists every name added to the module in __all__; keep this list in step with it.
__all__ = [
    "Schedule",
    "__version__",
    "_panic_for_test",
    "batch_padded",
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

# --- test hook (not API) -------------------------------------------------------------

def _panic_for_test(location: str) -> None: ...
