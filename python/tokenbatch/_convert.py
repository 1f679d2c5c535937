"""Input conversion shared by the public wrappers: one place that turns user input into
what the Rust core reads, with tokenbatch errors for everything it cannot read."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenbatch.errors import (
    InvalidTypeError,
    InvalidValueError,
    TokenBatchError,
    TokenBatchOverflowError,
)

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min

IntArray = npt.NDArray[np.int64] | npt.NDArray[np.int32]


def as_lengths(values: Any, name: str = "lengths") -> IntArray:
    """Return ``values`` as a contiguous 1-D int32 or int64 array.

    int32 and int64 arrays that are already C-contiguous pass through without a copy;
    any other integer dtype, a strided view or a Python list is converted once to int64.
    Floats (even whole-valued ones), booleans, strings and objects are refused, as are
    arrays that are not one-dimensional.
    """
    if isinstance(values, np.ndarray):
        array = values
    else:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise InvalidTypeError(
                f"{name} must be a list or 1-D numpy array of integers, got {type(values).__name__}"
            )
        if len(values) == 0:
            return np.empty(0, dtype=np.int64)
        try:
            array = np.asarray(values)
        except (ValueError, TypeError) as exc:  # ragged nested lists, odd objects
            raise InvalidTypeError(f"{name} could not be read as an integer array: {exc}") from exc
        if array.dtype == object:
            raise _object_array_error(values, name)
    if array.ndim != 1:
        raise InvalidTypeError(
            f"{name} must be one-dimensional, got an array of shape {array.shape}"
        )
    kind = array.dtype.kind
    if kind not in "iu":
        raise InvalidTypeError(
            f"{name} must hold integers, got dtype {array.dtype}"
            + (" (convert whole-valued floats with .astype(np.int64))" if kind == "f" else "")
        )
    if array.dtype in (np.int64, np.int32) and array.flags.c_contiguous:
        return array
    if array.dtype == np.uint64 and array.size and int(array.max()) > _INT64_MAX:
        position = int(np.argmax(array > _INT64_MAX))
        raise TokenBatchOverflowError(
            f"{name}[{position}] = {int(array[position])} does not fit in a signed 64-bit integer"
        )
    return np.ascontiguousarray(array, dtype=np.int64)


def _object_array_error(values: Any, name: str) -> TokenBatchError:
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int):
            return InvalidTypeError(
                f"{name}[{position}] = {value!r} is not an integer ({type(value).__name__})"
            )
        if not _INT64_MIN <= value <= _INT64_MAX:
            return TokenBatchOverflowError(
                f"{name}[{position}] = {value} does not fit in a signed 64-bit integer"
            )
    return InvalidTypeError(f"{name} could not be read as an integer array")


def as_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """Return a user-facing count as a Python int in the signed 64-bit range.

    Integers (not bools) are taken as they are, and so are floats that hold a whole
    number, because papers and configs write token counts that way (``469e9``); a
    fractional, NaN or infinite float is refused with its value (``InvalidTypeError``, as
    any other non-integer). Arrays of lengths go
    through :func:`as_lengths`, which keeps refusing floats.
    """
    result = as_whole(value, name)
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise TokenBatchOverflowError(f"{name}={result} does not fit in a signed 64-bit integer")
    if minimum is not None and result < minimum:
        raise InvalidValueError(f"{name} must be at least {minimum}, got {result}")
    return result


def as_seed(value: Any) -> int:
    """Seeds are integers in ``[0, 2**64)``."""
    seed = as_int_unbounded(value, "seed")
    if not 0 <= seed < 2**64:
        raise InvalidValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed


def as_whole(value: Any, name: str) -> int:
    """Return an integer, or a float holding a whole number, as a Python int of any size."""
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or not float(value).is_integer():
            raise InvalidTypeError(
                f"{name} must be an integer, got {float(value)!r} (not a whole number)"
            )
        return int(value)
    return as_int_unbounded(value, name)


def as_int_unbounded(value: Any, name: str) -> int:
    """Return ``value`` as a Python int of any size (not bool, not float)."""
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidTypeError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__})"
        ) from None


def as_bool(value: object, name: str) -> bool:
    """Return ``value`` if it is a bool (Python's or numpy's); integers are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def as_str(value: object, name: str) -> str:
    """Return ``value`` if it is a string; the core, which parses the names it accepts,
    refuses an unknown one."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, got {value!r}")
    return value


def as_choice(value: object, name: str, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of the ``allowed`` strings (for choices made in
    Python; names the core parses go through :func:`as_str`)."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, got {value!r}")
    if value not in allowed:
        options = ", ".join(repr(option) for option in allowed)
        raise InvalidValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def replicas_and_rank(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Data-parallel world size and rank: as given, else from the initialized default
    ``torch.distributed`` group (torch is imported only then), else ``(1, 0)``."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
    replicas = as_int(num_replicas, "num_replicas", minimum=1)
    position = as_int(rank, "rank", minimum=0)
    if position >= replicas:
        raise InvalidValueError(
            f"rank must be in [0, num_replicas - 1] = [0, {replicas - 1}], got rank={position}"
        )
    return replicas, position


def check_same_config(saved: Mapping[str, Any], current: Mapping[str, Any], owner: str) -> None:
    """Refuse a saved state whose options differ from ``current``, naming every difference
    (``owner`` names the object in the message, e.g. ``"sampler"``)."""
    differences = [
        f"{key}={saved.get(key)!r} (this {owner}: {value!r})"
        for key, value in current.items()
        if saved.get(key) != value
    ]
    if differences:
        raise InvalidValueError(
            f"state was saved by a {owner} with other options: " + ", ".join(differences)
        )


def check_state_format(saved: object, expected: str, owner: str) -> None:
    """Refuse a saved state of another kind, or of this kind (``"kind/version"``) in another
    format version, saying which (``owner`` names the object, e.g. ``"StreamPacker"``)."""
    if saved == expected:
        return
    kind = expected.rpartition("/")[0]
    if isinstance(saved, str) and saved.startswith(kind + "/"):
        raise InvalidValueError(
            f"this {owner} state has format {saved!r}; this version of tokenbatch reads "
            f"{expected!r} only: a state of another format version would not continue the "
            "same way. Start again, or resume with the tokenbatch version that saved it"
        )
    raise InvalidValueError(f"state is not a {owner} state (format={saved!r})")


def as_group_ids(values: Any) -> npt.NDArray[np.int64] | None:
    """Return group ids (one per sequence) as a contiguous int64 array, or ``None``.

    A C-contiguous int64 array passes through without a copy; the core checks the count.
    """
    if values is None:
        return None
    array = as_lengths(values, "groups")
    return np.ascontiguousarray(array, dtype=np.int64)


def as_cost_matrix(values: Any) -> npt.NDArray[np.int64]:
    """Return ``values`` as a C-contiguous 2-D int64 array (one row per sequence).

    A C-contiguous int64 array passes through without a copy; other integer dtypes and
    lists of rows are converted once. Floats, booleans and other shapes are refused.
    """
    try:
        array = values if isinstance(values, np.ndarray) else np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged rows
        raise InvalidTypeError(f"costs could not be read as an integer matrix: {exc}") from exc
    if array.ndim != 2:
        raise InvalidTypeError(
            f"costs must be two-dimensional (one row per sequence, one column per budget), "
            f"got an array of shape {array.shape}"
        )
    if array.dtype.kind not in "iu":
        raise InvalidTypeError(f"costs must hold integers, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > _INT64_MAX:
        raise TokenBatchOverflowError("costs hold a value that does not fit in int64")
    return np.ascontiguousarray(array, dtype=np.int64)
