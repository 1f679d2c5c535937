"""The row collator that the pair and vision-language collators build their rows with."""

from __future__ import annotations

from tokenbatch.errors import InvalidTypeError
from tokenbatch.torch.collate import PackedCollator


def row_collator(collator: PackedCollator | None) -> PackedCollator:
    """``collator``, or a default :class:`PackedCollator`; anything else is refused."""
    if collator is None:
        return PackedCollator()
    if not isinstance(collator, PackedCollator):
        raise InvalidTypeError(f"collator must be a PackedCollator, got {type(collator).__name__}")
    return collator
