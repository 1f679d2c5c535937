"""Type stubs of the compiled extension ``tokenbatch._core`` (checked by mypy.stubtest).

Private API: use the typed wrappers of the ``tokenbatch`` package instead.
"""

from typing import Any, ClassVar, final

import numpy as np
import numpy.typing as npt

# pyo3 lists every name added to the module in __all__; keep this list in step with it.
__all__ = [
    "Schedule",
    "StreamBin",
    "StreamBuffer",
    "__version__",
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

# --- stream --------------------------------------------------------------------------

_Segment = tuple[int, int, int]

@final
class StreamBin:
    """A bin taken from a stream buffer."""

    @property
    def segments(self) -> list[_Segment]: ...
    @property
    def released(self) -> list[int]: ...

@final
class StreamBuffer:
    """The buffer of a stream packer (see ``tokenbatch.StreamPacker``)."""

    STATE_VERSION: ClassVar[int]
    def __new__(
        cls,
        max_tokens: int,
        *,
        buffer_size: int,
        algorithm: str,
        max_seqs: int | None,
        oversize: str,
        shuffle: bool,
        seed: int,
        num_shards: int,
        shard: int,
    ) -> StreamBuffer: ...
    def push(self, position: int, length: int) -> int: ...
    def finish(self) -> None: ...
    def take_bin(self) -> StreamBin | None: ...
    def held_positions(self) -> list[int]: ...
    @property
    def next_position(self) -> int: ...
    @property
    def dropped_seqs(self) -> int: ...
    @property
    def yielded_bins(self) -> int: ...
    def state(self) -> dict[str, Any]: ...
    def restore(
        self,
        *,
        next_position: int,
        round: int,
        yielded_bins: int,
        dropped_seqs: int,
        buffer: list[_Segment],
        pending: list[list[_Segment]],
    ) -> None: ...
