"""Packing a tokenized Hugging Face dataset: tokenbatch.hf.pack_dataset against TRL's
pack_dataset(strategy="bfd") on the same data.

Full run (numbers in benches/RESULTS.md):
    TOKENBATCH_BENCH_FULL=1 pytest benches/bench_hf.py --benchmark-enable
"""

from __future__ import annotations

import functools
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import sizes

from tokenbatch.hf import pack_dataset

MAX_TOKENS = 1024
SIZES = sizes([100_000, 1_000_000], [10_000])


@functools.cache
def tokenized(n: int) -> datasets.Dataset:
    """``n`` rows of ``input_ids`` with SFT-like lengths (median 90, long tail to 1,024)."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(4.5, 0.8, n)), 1, MAX_TOKENS).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 32_000, int(offsets[-1]), dtype=np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    return datasets.Dataset(datasets.table.InMemoryTable(table))


def efficiency(packed: datasets.Dataset) -> float:
    lengths = pc.list_value_length(packed.with_format("arrow")[:]["input_ids"])
    return float(pc.sum(lengths).as_py()) / (packed.num_rows * MAX_TOKENS)


def record(benchmark: Any, packed: datasets.Dataset, n: int, name: str) -> None:
    benchmark.extra_info.update(
        n=n, packer=name, rows=packed.num_rows, efficiency=round(efficiency(packed), 6)
    )


@pytest.mark.parametrize("n", SIZES)
def test_tokenbatch_pack_dataset(benchmark: Any, n: int) -> None:
    dataset = tokenized(n)
    benchmark.group = f"pack_dataset n={n:,}"
    packed = benchmark.pedantic(pack_dataset, args=(dataset, MAX_TOKENS), rounds=3, iterations=1)
    record(benchmark, packed, n, "tokenbatch")
    assert packed.num_rows < n
    assert efficiency(packed) > 0.99


@pytest.mark.parametrize("n", SIZES)
def test_trl_pack_dataset(benchmark: Any, n: int) -> None:
    from trl import pack_dataset as trl_pack_dataset

    dataset = tokenized(n)
    benchmark.group = f"pack_dataset n={n:,}"
    packed = benchmark.pedantic(
        trl_pack_dataset,
        args=(dataset, MAX_TOKENS),
        kwargs={"strategy": "bfd", "map_kwargs": {"keep_in_memory": True}},
        rounds=1,
        iterations=1,
    )
    record(benchmark, packed, n, "trl bfd")
    ours = pack_dataset(dataset, MAX_TOKENS)
    # Packing globally needs no more rows than TRL's per-map-batch packing.
    assert ours.num_rows <= packed.num_rows
