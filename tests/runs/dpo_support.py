"""Shared pieces of the DPO runs and tests: synthetic preference pairs, and DPO computed
the classic way, on padded pairs, as the reference the packed rows must equal.

The padded reference is written out here, independently of tokenbatch's
``sequence_logps`` and ``dpo_loss``: a right-padded batch of every pair's prompt +
chosen and prompt + rejected, an attention mask, log-softmax, and the completion tokens'
log-probabilities summed per sequence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from run_support import VOCAB

N_PAIRS = 120
MAX_TOKENS = 256
BETA = 0.1


def pairs(n: int = N_PAIRS, seed: int = 0) -> list[dict[str, Any]]:
    """Pair items as TRL's DPOTrainer tokenizes them (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``), with a ``pair_id``."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        prompt, chosen, rejected = (
            rng.integers(3, VOCAB, int(size)).tolist()
            for size in (rng.integers(0, 25), rng.integers(1, 40), rng.integers(1, 40))
        )
        items.append(
            {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected, "pair_id": i}
        )
    return items


def sequence_items(pair: dict[str, Any]) -> list[dict[str, Any]]:
    """The two sequence items of a pair item (the form a packing with groups serves)."""
    prompt = pair["prompt_ids"]
    return [
        {
            "input_ids": prompt + pair[f"{role}_ids"],
            "labels": [-100] * len(prompt) + pair[f"{role}_ids"],
            "pair_id": pair["pair_id"],
            "role": role,
        }
        for role in ("chosen", "rejected")
    ]


def padded_logps(model: Any, items: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probabilities of every pair's chosen and rejected sequence,
    from one right-padded batch."""
    rows = [p["prompt_ids"] + p[f"{role}_ids"] for role in ("chosen", "rejected") for p in items]
    prompts = [len(p["prompt_ids"]) for p in items] * 2
    width = max(len(row) for row in rows)
    input_ids = torch.zeros((len(rows), width), dtype=torch.int64)
    attention = torch.zeros((len(rows), width), dtype=torch.int64)
    completion = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        # A completion token is predicted from the token before it; the first token of a
        # sequence is never predicted.
        completion[i, max(prompt, 1) : len(row)] = True
    logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits
    token_logps = torch.nn.functional.log_softmax(logits[:, :-1], dim=-1)
    token_logps = token_logps.gather(2, input_ids[:, 1:, None])[:, :, 0]
    summed = (token_logps * completion[:, 1:]).sum(dim=1)
    return summed[: len(items)], summed[len(items) :]


def padded_dpo_loss(
    policy: Any, reference: Any, items: list[dict[str, Any]], beta: float = BETA
) -> torch.Tensor:
    """The mean DPO sigmoid loss of ``items``, on padded pairs."""
    chosen, rejected = padded_logps(policy, items)
    with torch.no_grad():
        ref_chosen, ref_rejected = padded_logps(reference, items)
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)
    return -torch.nn.functional.logsigmoid(beta * margin).mean()
