"""The private hook of ``datasets`` (checked on 4.4 to 5.x).

``Dataset._fingerprint`` identifies a dataset's content for the cache of its transforms;
datasets has no public accessor for it. :func:`tokenbatch.hf.pack_dataset` derives the
packed dataset's fingerprint from it, as datasets' own transforms do, rather than let
``Dataset`` hash every token of the result.
"""

from __future__ import annotations

from typing import Any

from tokenbatch.integrations._compat import Hook


def _dataset() -> object:
    import datasets

    return datasets.Dataset.from_dict({"input_ids": [[1]]})


FINGERPRINT = Hook(
    "datasets",
    "datasets:Dataset",
    "_fingerprint",
    "derive the packed dataset's cache fingerprint from its input's",
    probe=_dataset,
)
HOOKS = (FINGERPRINT,)


def fingerprint(dataset: Any) -> str:
    """The cache fingerprint of a ``datasets.Dataset``."""
    return str(FINGERPRINT.get(dataset))
