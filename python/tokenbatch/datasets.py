"""Built-in length distributions for examples, benchmarks and the CLI.

Each mimics a corpus engineers actually pack (shapes, not data): all are seeded and
return int64 arrays of lengths in ``[1, max_length]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt

from tokenbatch._convert import as_int, as_seed
from tokenbatch.errors import InvalidValueError

__all__ = ["EXAMPLE_DISTRIBUTIONS", "example_lengths"]

ExampleName = Literal["lognormal", "chat", "documents", "uniform"]
_Generator = Callable[[np.random.Generator, int, int], npt.NDArray[np.float64]]


def _lognormal(rng: np.random.Generator, n: int, max_length: int) -> npt.NDArray[np.float64]:
    # Pretraining-style web text: median ~ e^6.5 = 665 tokens, long right tail.
    return rng.lognormal(mean=6.5, sigma=1.0, size=n)


def _chat(rng: np.random.Generator, n: int, max_length: int) -> npt.NDArray[np.float64]:
    # SFT chat mix: many short exchanges (~150 tokens) and a mode of long ones (~1,500).
    short = rng.lognormal(mean=5.0, sigma=0.6, size=n)
    long = rng.lognormal(mean=7.3, sigma=0.5, size=n)
    return np.where(rng.random(n) < 0.7, short, long)


def _documents(rng: np.random.Generator, n: int, max_length: int) -> npt.NDArray[np.float64]:
    # Heavy-tailed documents (books, code files): Pareto tail, alpha = 1.2, min 64 tokens.
    return 64.0 * (1.0 + rng.pareto(1.2, size=n))


def _uniform(rng: np.random.Generator, n: int, max_length: int) -> npt.NDArray[np.float64]:
    return rng.uniform(1, max_length + 1, size=n)


EXAMPLE_DISTRIBUTIONS: dict[str, _Generator] = {
    "lognormal": _lognormal,
    "chat": _chat,
    "documents": _documents,
    "uniform": _uniform,
}


def example_lengths(
    name: ExampleName | str = "lognormal",
    n: int = 100_000,
    *,
    max_length: int = 8192,
    seed: int = 0,
) -> npt.NDArray[np.int64]:
    """``n`` sequence lengths drawn from a named distribution, clipped to ``[1, max_length]``.

    Names: ``"lognormal"`` (web text), ``"chat"`` (bimodal SFT conversations),
    ``"documents"`` (heavy-tailed, many at ``max_length`` after clipping), ``"uniform"``.
    """
    if name not in EXAMPLE_DISTRIBUTIONS:
        raise InvalidValueError(
            f"unknown example distribution {name!r}; expected one of "
            + ", ".join(repr(key) for key in EXAMPLE_DISTRIBUTIONS)
        )
    count = as_int(n, "n", minimum=0)
    longest = as_int(max_length, "max_length", minimum=1)
    rng = np.random.default_rng(as_seed(seed))
    raw = EXAMPLE_DISTRIBUTIONS[name](rng, count, longest)
    return np.clip(np.rint(raw), 1, longest).astype(np.int64)
