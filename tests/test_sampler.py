"""TokenBudgetBatchSampler and the epoch deals under it: equal steps, exactly-once use,
balance, exact resume, and clear errors on bad input."""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tokenbatch import (
    InvalidTypeError,
    InvalidValueError,
    OversizeError,
    batch_padded,
    pack,
    reference,
)
from tokenbatch.datasets import example_lengths
from tokenbatch.distribute import DEAL_FORMAT, EpochDeal, _permutation, deal_epoch, mix_seed
from tokenbatch.torch import SegmentDataset, TokenBudgetBatchSampler


def rank_batches(lengths: Any, max_tokens: int, num_replicas: int, **options: Any) -> list[Any]:
    """Batches of every rank, each rank's sampler built independently (as on real ranks)."""
    epoch = options.pop("epoch", 0)
    result = []
    for rank in range(num_replicas):
        sampler = TokenBudgetBatchSampler(
            lengths, max_tokens, num_replicas=num_replicas, rank=rank, **options
        )
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        result.append(batches)
    return result


def batch_cost(batch: list[int], lengths: list[int], mode: str) -> int:
    sizes = [lengths[i] for i in batch]
    return len(sizes) * max(sizes) if mode == "padded" else sum(sizes)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=120),
    max_tokens=st.integers(40, 100),
    num_replicas=st.integers(1, 6),
    mode=st.sampled_from(["packed", "padded"]),
    algorithm=st.sampled_from(["bfd", "ffd", "next_fit", "first_fit_shuffled"]),
    balance=st.sampled_from(["attention", "tokens", None]),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 5),
)
def test_every_sequence_once_and_equal_steps(
    lengths: list[int],
    max_tokens: int,
    num_replicas: int,
    mode: str,
    algorithm: str,
    balance: str | None,
    shuffle: bool,
    seed: int,
    epoch: int,
) -> None:
    options = {
        "mode": mode,
        "algorithm": algorithm,
        "balance": balance,
        "shuffle": shuffle,
        "seed": seed,
        "epoch": epoch,
    }
    packings = [
        batch_padded(lengths, max_tokens)
        if mode == "padded"
        else pack(
            lengths,
            max_tokens,
            algorithm=algorithm,  # type: ignore[arg-type]
            seed=mix_seed(seed, e) if algorithm == "first_fit_shuffled" and shuffle else seed,
        )
        for e in (0, epoch)
    ]
    if any(len(lengths) < -(-len(p) // num_replicas) * num_replicas for p in packings):
        # Fewer sequences than an equal number of non-empty bins per rank needs.
        with pytest.raises(InvalidValueError, match="drop_last=True"):
            rank_batches(lengths, max_tokens, num_replicas, **options)
        return
    per_rank = rank_batches(lengths, max_tokens, num_replicas, **options)
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, f"ranks got different numbers of steps: {steps}"
    used = [i for batches in per_rank for batch in batches for i in batch]
    assert sorted(used) == list(range(len(lengths)))
    for batches in per_rank:
        for batch in batches:
            assert batch, "empty batch"
            assert batch_cost(batch, lengths, mode) <= max_tokens
            assert all(type(i) is int for i in batch)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=100),
    num_replicas=st.integers(2, 8),
    seed=st.integers(0, 1000),
)
def test_drop_last_reports_what_it_leaves_out(
    lengths: list[int], num_replicas: int, seed: int
) -> None:
    sampler = TokenBudgetBatchSampler(
        lengths, 60, num_replicas=num_replicas, rank=0, drop_last=True, seed=seed
    )
    per_rank = rank_batches(lengths, 60, num_replicas, drop_last=True, seed=seed)
    used = [i for batches in per_rank for batch in batches for i in batch]
    assert len(used) == len(set(used))
    stats = sampler.stats()
    n_bins = len(pack(lengths, 60))
    assert stats["dropped_bins"] == n_bins % num_replicas
    assert stats["dropped_seqs"] == len(lengths) - len(used)
    assert stats["drop_last_tokens"] == sum(lengths) - sum(lengths[i] for i in used)
    assert stats["split_bins"] == 0


def test_bins_are_split_rather_than_dropped() -> None:
    lengths = [30] * 6 + [10] * 3  # bfd: 3 full bins of two 30s + one bin of three 10s
    sampler = TokenBudgetBatchSampler(lengths, 60, num_replicas=3, rank=0)
    stats = sampler.stats()
    assert len(pack(lengths, 60)) == 4
    assert stats["n_bins"] == 6
    assert stats["split_bins"] == 2
    assert stats["n_steps"] == 2
    assert stats["dropped_seqs"] == 0
    per_rank = rank_batches(lengths, 60, 3)
    assert sorted(i for batches in per_rank for b in batches for i in b) == list(range(9))


def test_too_few_sequences_raise_at_construction_not_in_a_collective() -> None:
    lengths = [100, 100, 100]  # three single-sequence bins, two ranks
    with pytest.raises(InvalidValueError, match=r"num_replicas=2.*drop_last=True"):
        TokenBudgetBatchSampler(lengths, 100, num_replicas=2, rank=0)
    sampler = TokenBudgetBatchSampler(lengths, 100, num_replicas=2, rank=1, drop_last=True)
    assert len(sampler) == 1
    assert sampler.stats()["dropped_seqs"] == 1


def test_fewer_bins_than_ranks_are_split_across_ranks() -> None:
    lengths = [3] * 8  # one bin of 24 tokens, four ranks
    per_rank = rank_batches(lengths, 64, 4)
    assert [len(batches) for batches in per_rank] == [1, 1, 1, 1]
    assert sorted(len(batches[0]) for batches in per_rank) == [2, 2, 2, 2]


def test_set_epoch_changes_order_but_bfd_keeps_compositions() -> None:
    lengths = example_lengths("chat", 3000, max_length=2048, seed=1)
    first = rank_batches(lengths, 4096, 2, epoch=0)
    second = rank_batches(lengths, 4096, 2, epoch=1)
    assert first != second
    compositions = [{frozenset(b) for batches in run for b in batches} for run in (first, second)]
    assert compositions[0] == compositions[1]
    again = rank_batches(lengths, 4096, 2, epoch=0)
    assert again == first


def test_first_fit_shuffled_changes_compositions_between_epochs() -> None:
    lengths = example_lengths("chat", 3000, max_length=2048, seed=1)
    runs = [rank_batches(lengths, 4096, 2, epoch=e, algorithm="first_fit_shuffled") for e in (0, 1)]
    compositions = [{frozenset(b) for batches in run for b in batches} for run in runs]
    assert compositions[0] != compositions[1]


def test_shuffle_false_is_the_same_every_epoch() -> None:
    lengths = example_lengths("lognormal", 2000, max_length=4096, seed=2)
    runs = [rank_batches(lengths, 8192, 2, epoch=e, shuffle=False) for e in (0, 3)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_attention_balance_beats_plain_order(mode: str) -> None:
    lengths = example_lengths("documents", 20_000, max_length=8192, seed=0)
    stats = {
        balance: TokenBudgetBatchSampler(
            lengths, 8192, mode=mode, num_replicas=8, rank=0, balance=balance
        ).stats()
        for balance in ("attention", "tokens", None)
    }
    assert stats["attention"]["attention_sync_overhead"] < 1.05
    assert stats[None]["attention_sync_overhead"] > 1.3
    assert stats["tokens"]["tokens_sync_overhead"] <= stats[None]["tokens_sync_overhead"]
    for values in stats.values():
        assert values["attention_imbalance_max"] >= values["attention_imbalance_mean"] >= 1.0


def test_flops_balance_evens_out_padded_steps() -> None:
    # Padded batches vary in tokens (count x longest) as well as in attention, so
    # balancing their sum beats balancing either one.
    lengths = example_lengths("chat", 30_000, max_length=8192, seed=1)
    stats = {
        balance: TokenBudgetBatchSampler(
            lengths, 8192, mode="padded", num_replicas=8, balance=balance, hidden_size=1024
        ).stats()
        for balance in ("attention", "tokens", "flops")
    }
    overhead = {balance: values["flops_sync_overhead"] for balance, values in stats.items()}
    assert overhead["flops"] < 1.01
    assert overhead["flops"] < overhead["attention"]
    assert overhead["flops"] < overhead["tokens"]
    assert "flops_sync_overhead" not in TokenBudgetBatchSampler(lengths, 8192).stats()
    with pytest.raises(InvalidValueError, match="hidden_size"):
        TokenBudgetBatchSampler(lengths, 8192, balance="flops")
    with pytest.raises(InvalidValueError, match="hidden_size"):
        deal_epoch(pack(lengths, 8192), 2).step_costs("flops")


def test_flops_cost_is_tokens_plus_attention_over_12h() -> None:
    lengths = example_lengths("documents", 400, max_length=4096, seed=2)
    plan = deal_epoch(pack(lengths, 4096), 3, balance="flops", hidden_size=256)
    costs = plan.step_costs("flops")
    for rank in range(3):
        for step, batch in enumerate(plan.batches(rank)):
            spans = [int(lengths[i]) for i in batch]
            expected = sum(spans) + sum(n * n for n in spans) / (12 * 256)
            assert costs[step, rank] == pytest.approx(expected)


def test_stats_imbalance_matches_a_direct_computation() -> None:
    lengths = example_lengths("chat", 500, max_length=1024, seed=3)
    sampler = TokenBudgetBatchSampler(lengths, 2048, num_replicas=4, rank=0)
    plan = sampler.plan()
    table = np.zeros((plan.n_steps, 4))
    for rank in range(4):
        for step, batch in enumerate(plan.batches(rank)):
            table[step, rank] = sum(int(lengths[i]) ** 2 for i in batch)
    ratio = table.max(axis=1) / table.mean(axis=1)
    stats = sampler.stats()
    assert stats["attention_imbalance_max"] == pytest.approx(ratio.max())
    assert stats["attention_imbalance_mean"] == pytest.approx(ratio.mean())
    overhead = table.max(axis=1).sum() / table.mean(axis=1).sum()
    assert stats["attention_sync_overhead"] == pytest.approx(overhead)


def test_deal_is_a_pure_function_of_its_inputs() -> None:
    lengths = example_lengths("lognormal", 5000, max_length=4096, seed=4)
    packing = pack(lengths, 8192)
    a = deal_epoch(packing, 8, epoch=2, seed=7)
    b = deal_epoch(packing, 8, epoch=2, seed=7)
    c = deal_epoch(packing, 8, epoch=3, seed=7)
    assert isinstance(a, EpochDeal)
    np.testing.assert_array_equal(a.steps, b.steps)
    assert not np.array_equal(a.steps, c.steps)
    assert sorted(a.steps.ravel().tolist()) == list(range(a.steps.size))


def test_random_streams_match_the_rust_core_generator() -> None:
    # Value of rng::mix_seed(&[5, 9]) in the Rust core, and its reference stream.
    assert mix_seed(5, 9) == 5434140380092166035
    assert mix_seed(0, 0) != mix_seed(0, 1)
    for parts in ([0, 0], [2**64 - 1, 3], [12345, 678]):
        assert mix_seed(*parts) == reference.mix_seed(parts)
    expected = list(range(1000))
    reference.SplitMix64(987654321).shuffle(expected)
    assert _permutation(987654321, 1000).tolist() == expected


# ------------------------------------------------------------------------------ resume


def test_resume_mid_epoch_gives_the_remaining_batches() -> None:
    lengths = example_lengths("chat", 1500, max_length=2048, seed=5)
    for rank in range(3):
        full = TokenBudgetBatchSampler(lengths, 4096, num_replicas=3, rank=rank, seed=11)
        full.set_epoch(2)
        expected = list(full)
        for stop in (0, 1, len(expected) // 2, len(expected)):
            first = TokenBudgetBatchSampler(lengths, 4096, num_replicas=3, rank=0, seed=11)
            first.set_epoch(2)
            iterator = iter(first)
            for _ in range(stop):
                next(iterator)
            state = first.state_dict()  # rank 0's state serves every rank
            assert state["epoch"] == 2
            assert state["step"] == stop
            resumed = TokenBudgetBatchSampler(lengths, 4096, num_replicas=3, rank=rank, seed=11)
            resumed.load_state_dict(state)
            resumed.set_epoch(2)  # the usual loop calls it again: the position is kept
            assert list(resumed) == expected[stop:]
            resumed.set_epoch(3)
            full.set_epoch(3)
            assert list(resumed) == list(full)
            full.set_epoch(2)


def test_resume_with_dataloader_workers_counts_consumed_batches() -> None:
    lengths = example_lengths("chat", 800, max_length=1024, seed=6).tolist()
    dataset = list(range(len(lengths)))

    def loader_for(sampler: TokenBudgetBatchSampler) -> DataLoader[Any]:
        return DataLoader(
            dataset, batch_sampler=sampler, collate_fn=list, num_workers=2, prefetch_factor=2
        )

    sampler = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, rank=1, dataset=dataset)
    expected = list(loader_for(sampler))
    interrupted = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, rank=1)
    iterator = iter(loader_for(interrupted))
    taken = [next(iterator) for _ in range(5)]
    assert taken == expected[:5]
    # Workers fetch ahead, so the sampler has yielded more than the loop has taken.
    assert interrupted.state_dict()["step"] > 5
    state = interrupted.state_dict(consumed_batches=5)
    del iterator
    resumed = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    assert list(loader_for(resumed)) == expected[5:]


def test_consumed_batches_counts_from_the_resumed_iteration() -> None:
    lengths = example_lengths("chat", 600, max_length=1024, seed=7)
    expected = list(TokenBudgetBatchSampler(lengths, 2048))
    sampler = TokenBudgetBatchSampler(lengths, 2048)
    sampler.load_state_dict({**sampler.state_dict(), "step": 3})
    iterator = iter(sampler)
    next(iterator), next(iterator)
    state = sampler.state_dict(consumed_batches=1)
    assert state["step"] == 4
    with pytest.raises(InvalidValueError, match="consumed_batches=3"):
        sampler.state_dict(consumed_batches=3)
    again = TokenBudgetBatchSampler(lengths, 2048)
    again.load_state_dict(state)
    assert list(again) == expected[4:]


def test_deal_rest_holds_the_bins_not_yet_run() -> None:
    lengths = example_lengths("chat", 500, max_length=2048, seed=15)
    plan = deal_epoch(pack(lengths, 4096, oversize="split"), 3, seed=4)

    def segments(offsets: Any, bins: Any, source: Any) -> list[tuple[int, int, int]]:
        return [
            (int(source.indices[j]), int(source.starts[j]), int(source.lengths[j]))
            for b in bins
            for j in range(int(offsets[b]), int(offsets[b + 1]))
        ]

    for step in (0, 1, plan.n_steps // 2, plan.n_steps):
        rest = plan.rest(step)
        bins = plan.steps[step:].reshape(-1)
        assert rest.n_bins == len(bins)
        # The same segments, bin by bin, in step order.
        expected = segments(plan.bin_offsets, bins, plan)
        assert segments(rest.bin_offsets, range(rest.n_bins), rest) == expected
        assert rest.stats()["input_tokens"] == sum(n for _, _, n in expected)
        assert rest.lower_bound <= rest.n_bins
        assert rest.n_seqs == len(lengths)
    with pytest.raises(InvalidValueError, match="beyond"):
        plan.rest(plan.n_steps + 1)


def _run_resized(
    lengths: Any, runs: list[tuple[int, int | None]], **options: Any
) -> tuple[list[list[Any]], TokenBudgetBatchSampler]:
    """Run one epoch as a job restarted on other world sizes: ``runs`` lists each run's
    ``(num_replicas, steps)`` (``None``: to the end). Returns every batch of every rank
    of every run, and the last run's rank-0 sampler."""
    batches: list[list[Any]] = []
    state = None
    last = None
    for replicas, steps in runs:
        samplers = [
            TokenBudgetBatchSampler(lengths, 4096, num_replicas=replicas, rank=r, **options)
            for r in range(replicas)
        ]
        for sampler in samplers:
            sampler.set_epoch(1)
            if state is not None:
                sampler.load_state_dict(state, allow_resize=True)
        assert len({len(sampler) for sampler in samplers}) == 1, "equal steps on every rank"
        for sampler in samplers:
            iterator = iter(sampler)
            take = len(sampler) - sampler.start_step if steps is None else steps
            batches.extend(next(iterator) for _ in range(take))
        state = samplers[0].state_dict()
        last = samplers[0]
    assert last is not None
    return batches, last


@pytest.mark.parametrize(
    ("runs", "history"),
    [
        ([(4, 3), (3, None)], [[4, 3]]),
        ([(2, 0), (5, None)], [[2, 0]]),
        ([(3, 7), (2, 4), (4, None)], [[3, 7], [2, 4]]),
        # A resume on the same size continues the run: 5 + 2 steps on 4 ranks.
        ([(4, 5), (4, 2), (1, None)], [[4, 7]]),
    ],
)
def test_resized_resume_uses_every_sequence_once(
    runs: list[tuple[int, int | None]], history: list[list[int]]
) -> None:
    lengths = example_lengths("chat", 900, max_length=2048, seed=12)
    batches, last = _run_resized(lengths, runs, seed=3)
    used = Counter(i for batch in batches for i in batch)
    assert sorted(used) == list(range(len(lengths)))
    assert set(used.values()) == {1}
    assert all(batch for batch in batches)
    assert last.state_dict()["resized"] == history
    # The next epoch is an ordinary epoch of the new world size.
    replicas = runs[-1][0]
    last.set_epoch(2)
    fresh = TokenBudgetBatchSampler(lengths, 4096, num_replicas=replicas, rank=0, seed=3)
    fresh.set_epoch(2)
    assert list(last) == list(fresh)


def test_resized_resume_is_the_same_on_every_rank_and_needs_consent() -> None:
    lengths = example_lengths("chat", 700, max_length=2048, seed=13)
    first = TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, rank=0, seed=2)
    iterator = iter(first)
    for _ in range(4):
        next(iterator)
    state = first.state_dict()
    with pytest.raises(InvalidValueError, match="allow_resize=True"):
        TokenBudgetBatchSampler(lengths, 4096, num_replicas=2, seed=2).load_state_dict(state)
    plans = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(lengths, 4096, num_replicas=2, rank=rank, seed=2)
        sampler.load_state_dict(state, allow_resize=True)
        assert sampler.start_step == 0
        plans.append(sampler.plan().steps)
    assert np.array_equal(plans[0], plans[1])
    # Other options still have to match.
    with pytest.raises(InvalidValueError, match="seed=2"):
        TokenBudgetBatchSampler(lengths, 4096, num_replicas=2, seed=5).load_state_dict(
            state, allow_resize=True
        )
    with pytest.raises(InvalidValueError, match="resized"):
        TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, seed=2).load_state_dict(
            {**state, "resized": [[4]]}
        )
    with pytest.raises(InvalidValueError, match="does not match the deal"):
        TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, seed=2).load_state_dict(
            {**state, "resized": [[4, 10**6]]}
        )


def test_resized_resume_with_a_schedule_counts_the_tokens_already_used() -> None:
    from tokenbatch.schedule import LinearRamp

    lengths = example_lengths("chat", 800, max_length=2048, seed=14)
    ramp = LinearRamp(8192, 65536, 400_000, unit="tokens")
    first = TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, rank=0, schedule=ramp)
    iterator = iter(first)
    taken = [next(iterator) for _ in range(6)]
    assert taken
    state = first.state_dict()
    used = int(first.plan().step_costs("tokens")[:6].sum())  # packed: no padding
    resumed = TokenBudgetBatchSampler(lengths, 4096, num_replicas=2, rank=0, schedule=ramp)
    resumed.load_state_dict(state, allow_resize=True)
    plan = resumed.plan()
    tokens = plan.step_costs("tokens").reshape(-1).astype(np.int64)
    expected = ramp.group_into_steps(tokens, 2, consumed_tokens=used)
    assert np.array_equal(resumed.step_offsets(), expected)
    with pytest.raises(InvalidValueError, match="drop_last=False"):
        TokenBudgetBatchSampler(
            lengths, 4096, num_replicas=2, schedule=ramp, drop_last=True
        ).load_state_dict(
            TokenBudgetBatchSampler(
                lengths, 4096, num_replicas=4, schedule=ramp, drop_last=True
            ).state_dict(),
            allow_resize=True,
        )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(40, 400),
    first=st.integers(1, 6),
    second=st.integers(1, 6),
    fraction=st.floats(0, 1),
    split=st.booleans(),
)
def test_resized_resume_property(
    n: int, first: int, second: int, fraction: float, split: bool
) -> None:
    lengths = example_lengths("lognormal", n, max_length=4096, seed=n)
    options: dict[str, Any] = {"seed": n, "oversize": "split" if split else "error"}
    whole = TokenBudgetBatchSampler(lengths, 4096, num_replicas=first, **options)
    steps = int(fraction * len(whole))
    try:
        batches, _ = _run_resized(lengths, [(first, steps), (second, None)], **options)
    except InvalidValueError as error:
        refused = str(error)
    else:
        refused = ""
    if refused:
        # Too few sequences left to give every new rank a batch: refused, never uneven.
        assert "cannot be finished on" in refused
        assert "cannot give each of" in refused
        return
    if split:
        tokens: Counter[int] = Counter()
        for batch in batches:
            for index, _start, length in batch:
                tokens[index] += length
        assert tokens == Counter({i: int(x) for i, x in enumerate(lengths) if x})
    else:
        used = Counter(i for batch in batches for i in batch)
        assert used == Counter(range(n))


def test_state_dict_from_another_dataset_or_config_is_refused() -> None:
    lengths = example_lengths("chat", 400, max_length=1024, seed=8)
    state = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, rank=0).state_dict()
    with pytest.raises(InvalidValueError, match="num_replicas=2"):
        TokenBudgetBatchSampler(lengths, 2048, num_replicas=4, rank=0).load_state_dict(state)
    with pytest.raises(InvalidValueError, match="seed=0"):
        TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, seed=1).load_state_dict(state)
    with pytest.raises(InvalidValueError, match="400 sequences"):
        TokenBudgetBatchSampler(lengths[:-1], 2048, num_replicas=2).load_state_dict(state)
    changed = lengths.copy()
    changed[17] += 1
    with pytest.raises(InvalidValueError, match="fingerprint"):
        TokenBudgetBatchSampler(changed, 2048, num_replicas=2).load_state_dict(state)
    sampler = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2)
    with pytest.raises(InvalidValueError, match="beyond"):
        sampler.load_state_dict({**state, "step": len(sampler) + 1})
    with pytest.raises(InvalidValueError, match="not a TokenBudgetBatchSampler state"):
        sampler.load_state_dict({"epoch": 0})
    with pytest.raises(InvalidTypeError):
        sampler.load_state_dict([1, 2])  # type: ignore[arg-type]


def test_state_of_another_deal_format_is_refused_with_a_message_that_says_so() -> None:
    lengths = example_lengths("chat", 400, max_length=1024, seed=8)
    sampler = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2)
    state = sampler.state_dict()
    assert state["deal_format"] == DEAL_FORMAT
    with pytest.raises(InvalidValueError, match=r"deal format 1 .* deals with format 2"):
        sampler.load_state_dict({**state, "deal_format": 1})
    # A state of another sampler state format is refused, naming both formats.
    old = {**state, "format": "tokenbatch.TokenBudgetBatchSampler/1"}
    with pytest.raises(
        InvalidValueError, match=r"format 'tokenbatch.TokenBudgetBatchSampler/1'.* reads .*/3"
    ):
        sampler.load_state_dict(old)


def test_a_refused_state_leaves_the_sampler_as_it_was() -> None:
    lengths = example_lengths("chat", 900, max_length=2048, seed=12)
    sampler = TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, rank=1, seed=3)
    sampler.set_epoch(2)
    sampler.load_state_dict({**sampler.state_dict(), "step": 3})
    state = sampler.state_dict()
    bad_states = [
        {**state, "epoch": 5, "step": 10**6},  # beyond the steps of epoch 5
        {**state, "epoch": 5, "resized": [[4, 10**6]]},  # a history that does not fit
        {**state, "epoch": 5, "resized": [[4]]},  # malformed
    ]
    for bad in bad_states:
        with pytest.raises(InvalidValueError):
            sampler.load_state_dict(bad)
        assert (sampler.epoch, sampler.start_step) == (2, 3)
        assert sampler.state_dict() == state
    reference = TokenBudgetBatchSampler(lengths, 4096, num_replicas=4, rank=1, seed=3)
    reference.set_epoch(2)
    assert list(sampler) == list(reference)[3:]


def test_sampler_copies_and_pickles_without_its_cached_plans() -> None:
    import copy
    import pickle

    lengths = example_lengths("chat", 500, max_length=1024, seed=9)
    sampler = TokenBudgetBatchSampler(lengths, 2048, num_replicas=2, rank=1, seed=4)
    sampler.set_epoch(3)
    for clone in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert clone.epoch == 3
        assert list(clone) == list(sampler)
    with pytest.raises(AttributeError, match="fixed at construction"):
        sampler.max_tokens = 1  # type: ignore[misc]


# --------------------------------------------------------------------------- bad input


def test_bad_arguments_raise_clear_errors() -> None:
    lengths = [5, 6, 7]
    with pytest.raises(InvalidValueError, match="rank must be in"):
        TokenBudgetBatchSampler(lengths, 16, num_replicas=2, rank=2)
    with pytest.raises(InvalidValueError, match="rank must be at least 0"):
        TokenBudgetBatchSampler(lengths, 16, num_replicas=2, rank=-1)
    with pytest.raises(InvalidValueError, match="3 entries but the dataset has 4"):
        TokenBudgetBatchSampler(lengths, 16, dataset=[0, 1, 2, 3])
    with pytest.raises(OversizeError, match="sequence 2 has 7 tokens"):
        TokenBudgetBatchSampler(lengths, 6)
    with pytest.raises(InvalidValueError, match="mode must be one of"):
        TokenBudgetBatchSampler(lengths, 16, mode="packd")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="algorithm"):
        TokenBudgetBatchSampler(lengths, 16, mode="padded", algorithm="best")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="balance"):
        TokenBudgetBatchSampler(lengths, 16, balance="flops")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="shuffle must be a bool"):
        TokenBudgetBatchSampler(lengths, 16, shuffle="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="lengths must hold integers"):
        TokenBudgetBatchSampler([1.5, 2.0], 16)
    with pytest.raises(InvalidValueError, match="max_tokens must be at least 1"):
        TokenBudgetBatchSampler(lengths, 0)


def test_empty_dataset_has_no_steps() -> None:
    sampler = TokenBudgetBatchSampler([], 16, num_replicas=4, rank=3)
    assert len(sampler) == 0
    assert list(sampler) == []
    assert sampler.stats()["n_steps"] == 0


def test_lengths_are_copied_so_later_changes_cannot_desynchronize_ranks() -> None:
    lengths = np.array([5, 6, 7, 8], dtype=np.int64)
    sampler = TokenBudgetBatchSampler(lengths, 16, shuffle=False)
    before = list(sampler)
    lengths[:] = 16
    assert list(sampler) == before


def test_defaults_follow_the_initialized_process_group() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        sampler = TokenBudgetBatchSampler([3, 4, 5], 8)
        assert (sampler.num_replicas, sampler.rank) == (1, 0)
    finally:
        dist.destroy_process_group()
    alone = TokenBudgetBatchSampler([3, 4, 5], 8, num_replicas=3)
    assert (alone.num_replicas, alone.rank) == (3, 0)


# ------------------------------------------------------------------ split and truncate


def test_split_sequences_are_served_whole_across_ranks() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=60)
    dataset = [
        {"input_ids": np.arange(n) + 1000 * i, "labels": -np.arange(n)}
        for i, n in enumerate(lengths.tolist())
    ]
    wrapped = SegmentDataset(dataset)
    pieces: dict[int, list[tuple[int, np.ndarray]]] = {}
    for rank in range(3):
        sampler = TokenBudgetBatchSampler(
            lengths, 128, oversize="split", num_replicas=3, rank=rank, dataset=wrapped
        )
        assert sampler.yields_segments
        loader = DataLoader(wrapped, batch_sampler=sampler, collate_fn=list)
        for batch in loader:
            assert sum(len(item["input_ids"]) for item in batch) <= 128
            for item in batch:
                assert len(item["labels"]) == len(item["input_ids"])
                index = int(item["input_ids"][0]) // 1000
                pieces.setdefault(index, []).append((int(item["input_ids"][0]), item["input_ids"]))
    assert sorted(pieces) == list(range(60))
    for index, parts in pieces.items():
        joined = np.concatenate([tokens for _, tokens in sorted(parts, key=lambda p: p[0])])
        np.testing.assert_array_equal(joined, np.arange(lengths[index]) + 1000 * index)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=12),
    num_replicas=st.integers(2, 8),
)
def test_split_mode_cuts_sequences_when_bins_cannot_be_cut(
    lengths: list[int], num_replicas: int
) -> None:
    # Budget 64: sequences above 32 tokens sit alone in their bins, so often only cutting
    # a sequence can give every rank the same number of batches.
    tokens: dict[int, list[int]] = {}
    n_steps = set()
    # Unless there are fewer tokens than bins needed, cutting sequences always succeeds.
    if sum(lengths) < num_replicas * ((len(pack(lengths, 64)) - 1) // num_replicas + 1):
        with pytest.raises(InvalidValueError, match="drop_last=True"):
            rank_batches(lengths, 64, num_replicas, oversize="split")
        return
    for batches in rank_batches(lengths, 64, num_replicas, oversize="split"):
        n_steps.add(len(batches))
        for batch in batches:
            assert 0 < sum(length for _, _, length in batch) <= 64
            for index, start, length in batch:
                tokens.setdefault(index, []).extend(range(start, start + length))
    assert len(n_steps) == 1
    assert sorted(tokens) == list(range(len(lengths)))
    for index, covered in tokens.items():
        assert sorted(covered) == list(range(lengths[index]))


def test_split_mode_reports_cut_sequences() -> None:
    sampler = TokenBudgetBatchSampler([64, 64, 64], 64, oversize="split", num_replicas=2)
    stats = sampler.stats()
    assert stats["split_seqs"] == 1
    assert stats["n_steps"] == 2
    with pytest.raises(InvalidValueError, match="drop_last=True"):
        TokenBudgetBatchSampler([64, 64, 64], 64, num_replicas=2)


def test_truncate_yields_the_first_tokens() -> None:
    sampler = TokenBudgetBatchSampler([10, 3], 8, oversize="truncate", shuffle=False)
    segments = sorted(segment for batch in sampler for segment in batch)
    assert segments == [(0, 0, 8), (1, 0, 3)]
    item = SegmentDataset([list(range(10)), [7, 7, 7]])[(0, 0, 8)]
    assert item == list(range(8))


def test_segment_dataset_detects_lengths_that_do_not_match() -> None:
    wrapped = SegmentDataset([{"input_ids": [1, 2, 3], "id": "a"}])
    assert wrapped[0] == {"input_ids": [1, 2, 3], "id": "a"}
    assert wrapped[(0, 1, 2)] == {"input_ids": [2, 3], "id": "a"}
    with pytest.raises(InvalidValueError, match="item 0 has 3 input_ids tokens"):
        wrapped[(0, 2, 5)]
    with pytest.raises(InvalidTypeError):
        SegmentDataset([], keys="input_ids")


def test_sampler_drives_a_dataloader_with_torch_tensors() -> None:
    lengths = [4, 9, 2, 7, 5, 1]
    dataset = [torch.arange(n) for n in lengths]
    sampler = TokenBudgetBatchSampler(lengths, 10, mode="padded", dataset=dataset)
    seen = Counter[int]()
    for batch in DataLoader(dataset, batch_sampler=sampler, collate_fn=list):
        assert len(batch) * max(len(t) for t in batch) <= 10
        seen.update(len(t) for t in batch)
    assert seen == Counter(lengths)
