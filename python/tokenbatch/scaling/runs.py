"""Published pre-training runs as data: size, tokens, peak learning rate, batch schedule,
optimizer and source; the evidence a launch plan's defaults are checked against."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PUBLISHED_RUNS", "PublishedRun", "nearest_runs"]

_MI = 2**20


@dataclass(frozen=True)
class PublishedRun:
    """One published pre-training run, as its authors reported it."""

    name: str
    year: int
    n_params: float
    """Total parameters, as published."""
    active_params: float | None
    """Parameters activated per token (a mixture of experts), ``None`` for a dense model."""
    tokens: float
    """Pre-training tokens."""
    seq_len: int
    """Sequence length at the end of pre-training (before any long-context stage)."""
    peak_lr: float | None
    """Peak learning rate, ``None`` when not published."""
    batch_tokens: float | None
    """Final global batch in tokens per step, ``None`` when not published."""
    batch_schedule: str
    """The batch over the run, in words."""
    optimizer: str
    source: str
    """Where every number of the row is read."""

    @property
    def mixture_of_experts(self) -> bool:
        """Whether the model is a mixture of experts."""
        return self.active_params is not None

    @property
    def law_params(self) -> float:
        """The parameter count the laws are evaluated at: activated parameters for a mixture
        of experts, all of them otherwise (embeddings included, as published)."""
        return self.n_params if self.active_params is None else self.active_params


_ADAMW_LLAMA = "AdamW (beta1 0.9, beta2 0.95, eps 1e-5, weight decay 0.1), cosine to 10%"
_LLAMA2 = "Touvron et al., Llama 2, arXiv:2307.09288, Table 1 and section 2.2"
_LLAMA3 = "Grattafiori et al., The Llama 3 Herd of Models, arXiv:2407.21783, Table 3"
_GPT3 = (
    "Brown et al., Language Models are Few-Shot Learners, arXiv:2005.14165, Table 2.1; "
    "300B tokens for every model, the batch ramped up over the first 4-12B tokens"
)
_OLMO2 = "github.com/allenai/OLMo configs/official-1124/OLMo2-{size}-stage1.yaml; {tokens} "
_DEEPSEEK_MOE = "AdamW (beta1 0.9, beta2 0.95, weight decay 0.1), warmup then two steps of 0.316"

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        name="DeepSeek LLM 7B",
        year=2024,
        n_params=7e9,
        active_params=None,
        tokens=2e12,
        seq_len=4096,
        peak_lr=4.2e-4,
        batch_tokens=2304 * 4096,
        batch_schedule="2,304 sequences of 4,096",
        optimizer="AdamW, multi-step learning rate (31.6% at 1.6T tokens, 10% at 1.8T)",
        source="github.com/deepseek-ai/DeepSeek-LLM README, section 4; Bi et al., arXiv:2401.02954",
    ),
    PublishedRun(
        name="DeepSeek LLM 67B",
        year=2024,
        n_params=67e9,
        active_params=None,
        tokens=2e12,
        seq_len=4096,
        peak_lr=3.2e-4,
        batch_tokens=4608 * 4096,
        batch_schedule="4,608 sequences of 4,096",
        optimizer="AdamW, multi-step learning rate (31.6% at 1.6T tokens, 10% at 1.8T)",
        source="github.com/deepseek-ai/DeepSeek-LLM README, section 4; Bi et al., arXiv:2401.02954",
    ),
    *(
        PublishedRun(
            name=f"LLaMA {size}",
            year=2023,
            n_params=params,
            active_params=None,
            tokens=tokens,
            seq_len=2048,
            peak_lr=rate,
            batch_tokens=4 * _MI,
            batch_schedule="4M tokens",
            optimizer=_ADAMW_LLAMA,
            source=f"{_LLAMA2} (the LLaMA rows); parameter counts from Touvron et al., "
            "LLaMA, arXiv:2302.13971, Table 2",
        )
        for size, params, tokens, rate in (
            ("7B", 6.7e9, 1.0e12, 3e-4),
            ("13B", 13.0e9, 1.0e12, 3e-4),
            ("33B", 32.5e9, 1.4e12, 1.5e-4),
            ("65B", 65.2e9, 1.4e12, 1.5e-4),
        )
    ),
    *(
        PublishedRun(
            name=f"Llama 2 {size}",
            year=2023,
            n_params=params,
            active_params=None,
            tokens=2.0e12,
            seq_len=4096,
            peak_lr=rate,
            batch_tokens=4 * _MI,
            batch_schedule="4M tokens",
            optimizer=_ADAMW_LLAMA + ", 2,000 warmup steps",
            source=_LLAMA2,
        )
        for size, params, rate in (
            ("7B", 7e9, 3e-4),
            ("13B", 13e9, 3e-4),
            ("34B", 34e9, 1.5e-4),
            ("70B", 70e9, 1.5e-4),
        )
    ),
    *(
        PublishedRun(
            name=f"Llama 3 {size}",
            year=2024,
            n_params=params,
            active_params=None,
            tokens=15e12,
            seq_len=8192,
            peak_lr=rate,
            batch_tokens=None,
            batch_schedule="not published",
            optimizer="AdamW, cosine",
            source=f"{_LLAMA3} (peak learning rate); about 15T tokens (section 3.1); the "
            "paper gives the batch schedule of the 405B model only",
        )
        for size, params, rate in (("8B", 8.03e9, 3e-4), ("70B", 70.6e9, 1.5e-4))
    ),
    PublishedRun(
        name="Llama 3 405B",
        year=2024,
        n_params=405e9,
        active_params=None,
        tokens=15.6e12,
        seq_len=8192,
        peak_lr=8e-5,
        batch_tokens=16 * _MI,
        batch_schedule="4M tokens of 4,096-token sequences, 8M of 8,192 after 252M tokens, "
        "16M after 2.87T",
        optimizer="AdamW, 8,000 warmup steps, cosine to 8e-7",
        source=f"{_LLAMA3} and section 3.4.1",
    ),
    PublishedRun(
        name="OLMo 2 7B",
        year=2024,
        n_params=7.3e9,
        active_params=None,
        tokens=4e12,
        seq_len=4096,
        peak_lr=3e-4,
        batch_tokens=1024 * 4096,
        batch_schedule="1,024 sequences of 4,096",
        optimizer="AdamW (beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1), cosine, "
        "8.4B warmup tokens",
        source=_OLMO2.format(size="7B", tokens="4T tokens in stage 1")
        + "(OLMo et al., 2 OLMo 2 Furious, arXiv:2501.00656)",
    ),
    PublishedRun(
        name="OLMo 2 13B",
        year=2024,
        n_params=13.7e9,
        active_params=None,
        tokens=5e12,
        seq_len=4096,
        peak_lr=3e-4,
        batch_tokens=2048 * 4096,
        batch_schedule="2,048 sequences of 4,096",
        optimizer="AdamW (beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1), cosine, "
        "8.4B warmup tokens",
        source=_OLMO2.format(size="13B", tokens="5T tokens in stage 1")
        + "(arXiv:2501.00656); the learning rate is the config file's",
    ),
    PublishedRun(
        name="OLMo 2 32B",
        year=2025,
        n_params=32.2e9,
        active_params=None,
        tokens=6e12,
        seq_len=4096,
        peak_lr=6e-4,
        batch_tokens=2048 * 4096,
        batch_schedule="2,048 sequences of 4,096",
        optimizer="AdamW (beta1 0.9, beta2 0.95, weight decay 0.1), cosine, 2,000 warmup steps",
        source="github.com/allenai/OLMo-core src/scripts/official/OLMo2/"
        "OLMo-2-0325-32B-train.py and its README (6T tokens in stage 1)",
    ),
    *(
        PublishedRun(
            name=f"GPT-3 {size}",
            year=2020,
            n_params=params,
            active_params=None,
            tokens=300e9,
            seq_len=2048,
            peak_lr=rate,
            batch_tokens=sequences * 2048,
            batch_schedule=f"{label} tokens, ramped up from 32K",
            optimizer="Adam (beta1 0.9, beta2 0.95, eps 1e-8), cosine to 10%",
            source=_GPT3,
        )
        for size, params, rate, sequences, label in (
            ("6.7B", 6.7e9, 1.2e-4, 1024, "2M"),
            ("13B", 13.0e9, 1.0e-4, 1024, "2M"),
            ("175B", 175.0e9, 0.6e-4, 1536, "3.2M"),
        )
    ),
    PublishedRun(
        name="Chinchilla 70B",
        year=2022,
        n_params=70e9,
        active_params=None,
        tokens=1.4e12,
        seq_len=2048,
        peak_lr=1e-4,
        batch_tokens=3e6,
        batch_schedule="1.5M tokens, doubled to 3M midway",
        optimizer="AdamW",
        source="Hoffmann et al., Training Compute-Optimal Large Language Models, "
        "arXiv:2203.15556, Table 4",
    ),
    PublishedRun(
        name="Gopher 280B",
        year=2021,
        n_params=280e9,
        active_params=None,
        tokens=300e9,
        seq_len=2048,
        peak_lr=4e-5,
        batch_tokens=6e6,
        batch_schedule="3M tokens, doubled to 6M midway",
        optimizer="Adam",
        source="Hoffmann et al., arXiv:2203.15556, Table 4 (Rae et al., arXiv:2112.11446)",
    ),
    PublishedRun(
        name="DeepSeek-V2",
        year=2024,
        n_params=236e9,
        active_params=21e9,
        tokens=8.1e12,
        seq_len=4096,
        peak_lr=2.4e-4,
        batch_tokens=9216 * 4096,
        batch_schedule="2,304 to 9,216 sequences of 4,096 over the first 225B tokens",
        optimizer=_DEEPSEEK_MOE + " (at 60% and 90% of the tokens)",
        source="DeepSeek-AI, DeepSeek-V2, arXiv:2405.04434, section 3.1.2",
    ),
    PublishedRun(
        name="DeepSeek-V2-Lite",
        year=2024,
        n_params=15.7e9,
        active_params=2.4e9,
        tokens=5.7e12,
        seq_len=4096,
        peak_lr=4.2e-4,
        batch_tokens=4608 * 4096,
        batch_schedule="4,608 sequences of 4,096, constant",
        optimizer=_DEEPSEEK_MOE + " (at 80% and 90% of the tokens)",
        source="huggingface.co/deepseek-ai/DeepSeek-V2-Lite model card, section 6 "
        "(arXiv:2405.04434)",
    ),
    PublishedRun(
        name="DeepSeek-V3",
        year=2024,
        n_params=671e9,
        active_params=37e9,
        tokens=14.8e12,
        seq_len=4096,
        peak_lr=2.2e-4,
        batch_tokens=15360 * 4096,
        batch_schedule="3,072 to 15,360 sequences of 4,096 over the first 469B tokens",
        optimizer="AdamW (beta1 0.9, beta2 0.95, weight decay 0.1), constant to 10T tokens, "
        "then cosine",
        source="DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437, section 4.2",
    ),
    PublishedRun(
        name="DeepSeekMoE 16B",
        year=2024,
        n_params=16.4e9,
        active_params=2.8e9,
        tokens=2e12,
        seq_len=4096,
        peak_lr=4.2e-4,
        batch_tokens=18e6,
        batch_schedule="4.5K sequences of 4K (18M tokens)",
        optimizer=_DEEPSEEK_MOE + " (at 80% and 90% of the steps)",
        source="Dai et al., DeepSeekMoE, arXiv:2401.06066, section 5",
    ),
)
"""Published runs, dense and mixture-of-experts, each with its source."""


def nearest_runs(
    n_params: float,
    tokens: float,
    *,
    mixture_of_experts: bool,
    quantity: str,
    count: int = 4,
    runs: Sequence[PublishedRun] = PUBLISHED_RUNS,
) -> list[PublishedRun]:
    """The ``count`` runs of the same kind that report ``quantity`` (``"batch"`` or
    ``"lr"``), nearest to ``(n_params, tokens)`` in log parameters and log tokens.

    Ties break by the table's order.
    """
    attribute = "batch_tokens" if quantity == "batch" else "peak_lr"
    same = [
        run
        for run in runs
        if run.mixture_of_experts == mixture_of_experts and getattr(run, attribute) is not None
    ]

    def distance(run: PublishedRun) -> float:
        return math.hypot(math.log(run.law_params / n_params), math.log(run.tokens / tokens))

    return sorted(same, key=distance)[:count]
