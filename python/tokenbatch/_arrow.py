"""The Arrow side of packing token lists, shared by :mod:`tokenbatch.hf` and
:mod:`tokenbatch.ray`: which columns of a schema are packed, and the types of the packed
table, so that a Ray task given an empty block writes the schema a full one gets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokenbatch.errors import InvalidTypeError, InvalidValueError

if TYPE_CHECKING:
    import pyarrow as pa

INT32_MAX = 2**31 - 1
#: Tokens assembled together; a group's offsets must fit the output's list offsets.
CHUNK_TOKENS = 1 << 24


def packed_columns(schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
    """The list columns of ``schema`` to pack: ``columns``, checked, or every column
    (which must then all be lists)."""
    import pyarrow as pa

    def is_list(name: str) -> bool:
        kind = schema.field(name).type
        return bool(
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        )

    if columns is None:
        names = list(schema.names)
        if not names:
            raise InvalidValueError("the dataset has no columns")
        not_lists = [name for name in names if not is_list(name)]
        if not_lists:
            lists = [name for name in names if is_list(name)]
            described = ", ".join(f"{n!r} ({schema.field(n).type})" for n in not_lists)
            if not lists:
                raise InvalidTypeError(
                    f"no column holds token lists (columns: {described}); tokenize first"
                )
            raise InvalidTypeError(
                f"columns {described} are not lists and cannot be packed with the list "
                f"columns {lists}; pass columns={lists} to pack those and leave the others out"
            )
        return names
    if isinstance(columns, str):
        raise InvalidTypeError("columns must be a sequence of column names, not a string")
    names = list(columns)
    if not names:
        raise InvalidValueError("columns is empty: name at least one list column to pack")
    unknown = [name for name in names if name not in schema.names]
    if unknown:
        raise InvalidValueError(f"unknown columns {unknown}; the table has {schema.names}")
    if len(set(names)) != len(names):
        raise InvalidValueError(f"columns lists a column twice: {names}")
    for name in names:
        if not is_list(name):
            raise InvalidTypeError(
                f"column {name!r} is {schema.field(name).type}, not a list of tokens"
            )
    return names


def is_large(input_type: Any, max_tokens: int, chunk_tokens: int = CHUNK_TOKENS) -> bool:
    """Whether a packed column of ``input_type`` needs 64-bit list offsets: large input,
    or a group of rows whose tokens may pass 2^31."""
    import pyarrow as pa

    return bool(pa.types.is_large_list(input_type) or chunk_tokens + max_tokens > INT32_MAX)


def list_type(input_type: Any, large: bool) -> Any:
    """The packed column's type: a list of the input's values, large when ``large``."""
    import pyarrow as pa

    value_field = input_type.value_field
    return pa.large_list(value_field) if large else pa.list_(value_field)


def length_type(max_tokens: int) -> Any:
    """The value type of ``seq_lengths``: 32-bit unless a row may hold more tokens."""
    import pyarrow as pa

    return pa.int32() if max_tokens <= INT32_MAX else pa.int64()


def packed_schema(
    schema: pa.Schema,
    columns: Sequence[str],
    max_tokens: int,
    position_ids: bool,
    chunk_tokens: int = CHUNK_TOKENS,
) -> pa.Schema:
    """The schema of the table :func:`tokenbatch.hf.pack_table` makes from a table of
    ``schema``."""
    import pyarrow as pa

    fields = []
    for name in columns:
        kind = schema.field(name).type
        large = is_large(kind, max_tokens, chunk_tokens)
        fields.append(pa.field(name, list_type(kind, large)))
    fields.append(pa.field("seq_lengths", pa.list_(length_type(max_tokens))))
    if position_ids:
        fields.append(pa.field("position_ids", pa.list_(pa.int64())))
    return pa.schema(fields)
