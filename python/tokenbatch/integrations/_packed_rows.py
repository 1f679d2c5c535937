"""What a Hugging Face model needs besides a packed row's tensors."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

#: The first torch release under which transformers keeps the documents of a packed row
#: apart (a causal mask per document, read from ``position_ids``) in sdpa and eager
#: attention; flash attention reads ``cu_seq_lens_*`` and keeps them apart on any torch.
DOCUMENTS_KEPT_APART_FROM = (2, 6)


def release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string such as ``"2.5.1+cu121"``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]))


def without_cache(model: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with ``use_cache=False`` for a model whose config has a cache setting.

    Hugging Face models keep attention inside each document of a packed row (read from
    its ``position_ids``) only when they build no key/value cache; with the default
    ``use_cache=True`` the documents of a row attend to each other under sdpa and eager
    attention, in training as in evaluation.
    """
    if getattr(getattr(model, "config", None), "use_cache", None) is None:
        return dict(inputs)
    return {**inputs, "use_cache": False}


def warn_if_documents_mix(module: Any, torch_version: str | None = None) -> None:
    """Warn if ``module`` holds a Hugging Face model whose packed rows mix their documents.

    With torch older than 2.6 (``torch_version``, default the installed one), sdpa and eager
    attention in transformers let every token of a packed row attend to the documents
    before it, so losses are silently those of the concatenated row.
    """
    version = torch_version or torch.__version__
    installed = release(version)
    if installed is None or installed >= DOCUMENTS_KEPT_APART_FROM:
        return
    for part in module.modules():
        attention = getattr(getattr(part, "config", None), "_attn_implementation", None)
        if attention in ("sdpa", "eager"):
            warnings.warn(
                f"{type(part).__name__} uses {attention} attention, which with torch "
                f"{version} (before 2.6) lets the documents of "
                "a packed row attend to each other; use torch 2.6 or newer, or "
                "attn_implementation='flash_attention_2' with the collator's cu_seq_lens_*",
                UserWarning,
                stacklevel=2,
            )
            return
