"""Type stubs of the compiled extension ``tokenbatch._core`` (checked by mypy.stubtest).

Private API: use the typed wrappers of the ``tokenbatch`` package instead.
"""

import numpy as np
import numpy.typing as npt

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
