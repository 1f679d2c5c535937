"""Megatron-LM launcher arguments: parsing and writing ``--step-batch-size-schedule`` and
``--rampup-batch-size``, checked against a direct implementation of Megatron's semantics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenbatch.errors import InvalidTypeError, InvalidValueError, TokenBatchOverflowError
from tokenbatch.megatron import (
    from_step_batch_size_schedule,
    to_rampup_batch_size,
    to_step_batch_size_schedule,
)
from tokenbatch.schedule import (
    BatchSchedule,
    LinearRamp,
    MegatronRampup,
    MegatronStepSchedule,
    Piecewise,
    deepseek_v3_ramp,
    gpt3_ramp,
    group_into_steps,
    llama3_405b_schedule,
)

# ---------------------------------------------------------------------------------------
# Megatron-LM's step schedule, written directly from its documented semantics
# (megatron/core/num_microbatches_calculator.py, StepBatchsizeNumMicroBatchesCalculator):
# entries split on whitespace and commas, "THRESHOLD:BATCH", K/M/B/T suffixes multiply the
# float of the digits and truncate, token thresholds are floor-divided by --seq-length,
# entries are sorted, and the batch is that of the last threshold <= consumed samples.
# ---------------------------------------------------------------------------------------

_SCALE = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def megatron_number(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in _SCALE:
        return int(float(text[:-1]) * _SCALE[text[-1]])
    return int(float(text))


def megatron_parse(text: str, seq_length: int | None) -> list[tuple[int, int]]:
    pairs = []
    for entry in text.strip().replace(",", " ").split():
        left, right = entry.split(":", 1)
        threshold = megatron_number(left)
        if seq_length is not None:
            threshold = threshold // seq_length
        pairs.append((threshold, megatron_number(right)))
    pairs.sort(key=lambda pair: pair[0])
    assert pairs
    assert pairs[0][0] == 0
    assert all(b[0] > a[0] for a, b in itertools.pairwise(pairs))
    assert all(batch > 0 for _, batch in pairs)
    return pairs


def megatron_batch(pairs: list[tuple[int, int]], consumed_samples: int) -> int:
    batch = pairs[0][1]
    for threshold, size in pairs:
        if consumed_samples >= threshold:
            batch = size
        else:
            break
    return batch


def megatron_run(pairs: list[tuple[int, int]], steps: int) -> list[tuple[int, int]]:
    """(consumed samples before the step, batch) for the first ``steps`` optimizer steps."""
    consumed, run = 0, []
    for _ in range(steps):
        batch = megatron_batch(pairs, consumed)
        run.append((consumed, batch))
        consumed += batch
    return run


# ---------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------


def test_megatron_examples_parse_as_megatron_parses() -> None:
    # From Megatron-LM's GPT-3 175B example script and its training config docstring.
    gpt3 = "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"
    schedule = from_step_batch_size_schedule(gpt3, seq_length=2048)
    assert schedule.pieces == megatron_parse(gpt3, 2048)
    assert schedule.pieces[1] == (2.4e9 // 2048, 320)
    assert schedule.seq_len == 2048
    doc = "0:768 250B:1536 500B:3072 750B:6144"
    in_samples = from_step_batch_size_schedule(doc)
    billion = 10**9
    assert in_samples.pieces == [
        (0, 768),
        (250 * billion, 1536),
        (500 * billion, 3072),
        (750 * billion, 6144),
    ]
    assert in_samples.seq_len is None


def test_batch_at_follows_megatron_step_by_step() -> None:
    text = "0:16, 2.4B:320 4.8B:624   7.2B:928 9.6b:1232 12B:1536 15.5B:64"  # decreases at the end
    schedule = from_step_batch_size_schedule(text, seq_length=2048)
    pairs = megatron_parse(text, 2048)
    run = megatron_run(pairs, 30_000)
    consumed = np.array([c for c, _ in run])
    assert schedule.batch_at(consumed).tolist() == [b for _, b in run]
    # The same in tokens, and in the step table (which ends the run within the budget).
    assert schedule.batch_tokens_at(consumed * 2048).tolist() == [b * 2048 for _, b in run]
    total = int(consumed[-1]) * 2048
    table = schedule.table(total, 16 * 2048, 1)
    steps = len(table["batch_sequences"])
    assert table["batch_sequences"].tolist() == [b for _, b in run[:steps]]


@st.composite
def schedule_texts(draw: st.DrawFn) -> tuple[str, int | None]:
    count = draw(st.integers(1, 8))
    seq_length = draw(st.sampled_from([None, 1, 7, 2048, 4096]))
    entries = ["0:" + str(draw(st.integers(1, 4096)))]
    for _ in range(count - 1):
        mantissa = draw(st.integers(1, 99_999))
        spelling = draw(st.sampled_from(["", "K", "M", "B", "T", "k", "b"]))
        if spelling and draw(st.booleans()):
            threshold = f"{mantissa / 100:g}{spelling}"  # decimals, read as floats
        else:
            threshold = f"{mantissa}{spelling}"
        batch = draw(st.integers(1, 100_000))
        entries.append(f"{threshold}:{batch}")
    order = draw(st.permutations(entries))
    separator = draw(st.sampled_from([" ", ",", " , ", "\t"]))
    return separator.join(order), seq_length


@settings(max_examples=300, deadline=None)
@given(schedule_texts())
def test_parse_agrees_with_megatron_or_refuses_what_it_asserts(
    case: tuple[str, int | None],
) -> None:
    text, seq_length = case
    try:
        expected = megatron_parse(text, seq_length)
    except AssertionError:
        with pytest.raises(InvalidValueError):
            from_step_batch_size_schedule(text, seq_length=seq_length)
        return
    schedule = from_step_batch_size_schedule(text, seq_length=seq_length)
    assert schedule.pieces == expected
    run = megatron_run(expected, 300)
    assert schedule.batch_at([c for c, _ in run]).tolist() == [b for _, b in run]
    # Between steps too: every sample count around each threshold.
    around = np.array(
        [t + d for t, _ in expected for d in (-1, 0, 1) if t + d >= 0], dtype=np.int64
    )
    assert schedule.batch_at(around).tolist() == [megatron_batch(expected, int(c)) for c in around]
    # The canonical string reads back to the same schedule, when Megatron's float reading
    # can represent every threshold at which the batch changes (the string keeps only
    # those: a threshold past 2^53 that leaves the batch as it was is not written).
    changes = [t for i, (t, b) in enumerate(expected) if i == 0 or b != expected[i - 1][1]]
    if any(int(float(t)) != t for t in changes):
        with pytest.raises(TokenBatchOverflowError, match="2\\^53"):
            to_step_batch_size_schedule(schedule, thresholds="samples")
        return
    canonical = to_step_batch_size_schedule(schedule, thresholds="samples")
    again = from_step_batch_size_schedule(canonical)
    assert np.array_equal(schedule.batch_at(around), again.batch_at(around))
    assert to_step_batch_size_schedule(again, thresholds="samples") == canonical


def test_parse_errors_name_the_problem() -> None:
    cases = {
        "": "no entry",
        "0:8 100": r"invalid schedule entry '100'",
        "0:8 1X:16": r"cannot read '1X'",
        "0:8 inf:16": r"cannot read 'inf'",
        "0:8 nan:16": r"cannot read 'nan'",
        "5:8": "first threshold must be 0",
        "0:8 -5:16": "first threshold must be 0",
        "0:8 100:16 100:32": "strictly increase",
        "0:8 100:0": "must be positive",
        "0:8 100:-4": "must be positive",
    }
    for text, message in cases.items():
        with pytest.raises(InvalidValueError, match=message):
            from_step_batch_size_schedule(text)
    # Two token thresholds in the same sample collide after conversion, as in Megatron.
    with pytest.raises(InvalidValueError, match=r"strictly increase.*tokens // seq_length=4096"):
        from_step_batch_size_schedule("0:8 4096:16 8191:32", seq_length=4096)
    with pytest.raises(InvalidTypeError):
        from_step_batch_size_schedule(b"0:8")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="seq_length"):
        from_step_batch_size_schedule("0:8", seq_length=0)


def test_megatron_step_schedule_validates_and_feeds_the_sampler_grouping() -> None:
    with pytest.raises(InvalidValueError, match="start at 0 samples"):
        MegatronStepSchedule([(3, 8)])
    with pytest.raises(InvalidTypeError, match="from_samples"):
        MegatronStepSchedule([(0, 8, 1)])  # type: ignore[list-item]
    no_length = MegatronStepSchedule([(0, 8)])
    with pytest.raises(InvalidValueError, match="seq_len"):
        no_length.table(10**6, 1024, 1)
    schedule = MegatronStepSchedule([(0, 4), (40, 8)], seq_len=1024)
    offsets = group_into_steps(np.full(64, 1024), schedule, dp=2)
    # 4 sequences (2 rounds) per step until 40 samples are consumed, then 8 (4 rounds).
    assert np.diff(offsets).tolist() == [2] * 10 + [4] * 3
    assert repr(schedule) == "MegatronStepSchedule([(0, 4), (40, 8)], seq_len=1024)"


# ---------------------------------------------------------------------------------------
# Writing any schedule
# ---------------------------------------------------------------------------------------

SCHEDULES: dict[str, BatchSchedule] = {
    "megatron ramp": MegatronRampup(32, 32, 1000, 1024, seq_len=2048),
    "gpt3": gpt3_ramp(),
    "deepseek-v3 on a grid": deepseek_v3_ramp(multiple_of=64),
    "llama3-405b in sequences": Piecewise(
        [(0, 1024), (252_000_000, 2048), (2_870_000_000_000, 4096)], unit="sequences", seq_len=4096
    ),
    "ramp by steps": LinearRamp(2**20, 2**23, 10**10, seq_len=4096, by="steps", multiple_of=4096),
    "decreasing pieces": Piecewise(
        [(0, 2**22), (10**9 + 1, 2**21), (3 * 10**9, 2**23)], seq_len=4096, allow_decrease=True
    ),
}


def _samples_to_check(schedule: BatchSchedule, seq_len: int) -> np.ndarray:
    """Every sample count of the first ramp region, plus random ones up to far past it."""
    rng = np.random.default_rng(0)
    return np.concatenate(
        [np.arange(200_000), rng.integers(0, 2 * 10**13 // seq_len, 200_000)]
    ).astype(np.int64)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_written_schedules_make_megatron_follow_every_sample(name: str) -> None:
    schedule = SCHEDULES[name]
    seq_len = schedule.seq_len
    assert seq_len is not None
    text = to_step_batch_size_schedule(schedule)
    pairs = megatron_parse(text, seq_len)  # Megatron reads it with --seq-length
    samples = _samples_to_check(schedule, seq_len)
    expected = schedule.batch_tokens_at(samples * seq_len) // seq_len
    parsed = from_step_batch_size_schedule(text, seq_length=seq_len)
    assert np.array_equal(parsed.batch_at(samples), expected)
    # Step by step through Megatron's own loop, until the schedule has settled.
    run = megatron_run(pairs, 3000)
    consumed = np.array([c for c, _ in run])
    assert [b for _, b in run] == (schedule.batch_tokens_at(consumed * seq_len) // seq_len).tolist()
    # In samples, the same changes.
    in_samples = to_step_batch_size_schedule(schedule, thresholds="samples")
    assert megatron_parse(in_samples, None) == pairs


@st.composite
def small_schedules(draw: st.DrawFn) -> BatchSchedule:
    """Ramps and pieces whose every sample count can be checked (at most ~60k samples)."""
    seq_len = draw(st.sampled_from([1, 3, 128, 2048]))
    kind = draw(st.sampled_from(["linear", "megatron", "pieces"]))
    if kind == "megatron":
        start, increment = draw(st.integers(1, 300)), draw(st.integers(1, 40))
        return MegatronRampup(
            start,
            increment,
            draw(st.integers(1, 50_000)),
            start + increment * draw(st.integers(0, 300)),
            seq_len=seq_len,
        )
    if kind == "pieces":
        count = draw(st.integers(1, 6))
        starts = sorted(draw(st.sets(st.integers(1, 50_000 * seq_len), min_size=count - 1)))
        batches = draw(st.lists(st.integers(1, 5000), min_size=len(starts) + 1))
        pieces = list(zip([0, *starts], batches, strict=False))
        return Piecewise(pieces, unit="sequences", seq_len=seq_len, allow_decrease=True)
    multiple = draw(st.sampled_from([1, 2, 16]))
    start = multiple * draw(st.integers(1, 200))
    return LinearRamp(
        start,
        start + multiple * draw(st.integers(0, 300)),
        draw(st.integers(1, 50_000 * seq_len)),
        unit="sequences",
        seq_len=seq_len,
        by=draw(st.sampled_from(["tokens", "steps"])),
        multiple_of=multiple,
    )


@settings(max_examples=150, deadline=None)
@given(small_schedules(), st.sampled_from(["tokens", "samples"]))
def test_any_schedule_written_and_read_back_agrees_at_every_sample(
    schedule: BatchSchedule, thresholds: str
) -> None:
    seq_len = schedule.seq_len
    assert seq_len is not None
    text = to_step_batch_size_schedule(schedule, thresholds=thresholds)  # type: ignore[arg-type]
    pairs = megatron_parse(text, seq_len if thresholds == "tokens" else None)
    samples = np.arange(pairs[-1][0] + 3 + 50_000 // seq_len + 60_000)
    expected = schedule.batch_tokens_at(samples * seq_len) // seq_len
    read = from_step_batch_size_schedule(
        text, seq_length=seq_len if thresholds == "tokens" else None
    )
    assert np.array_equal(read.batch_at(samples), expected)
    assert read.pieces == pairs
    # Canonical: no entry repeats the batch before it.
    assert all(a[1] != b[1] for a, b in itertools.pairwise(pairs))


def test_token_thresholds_round_up_to_whole_samples() -> None:
    # Piecewise switches at 250e9 tokens; a Megatron run only sees whole samples, the first
    # at or after it is 61,035,157 samples, which the export writes out exactly.
    pieces = Piecewise([(0, 768), (250 * 10**9, 1536)], unit="sequences", seq_len=4096)
    assert to_step_batch_size_schedule(pieces) == "0:768 250000003072:1536"
    exact = Piecewise([(0, 768), (250 * 2**30, 1536)], unit="sequences", seq_len=4096)
    assert to_step_batch_size_schedule(exact, thresholds="samples") == "0:768 65536K:1536"
    round_numbers = MegatronStepSchedule([(0, 768), (10**9, 1536), (2 * 10**12, 3072)])
    written = to_step_batch_size_schedule(round_numbers, thresholds="samples")
    assert written == "0:768 1B:1536 2T:3072"


def test_write_errors() -> None:
    tokens_only = LinearRamp(2**20, 2**22, 10**9)
    with pytest.raises(InvalidValueError, match="token thresholds need seq_len"):
        to_step_batch_size_schedule(tokens_only)
    with pytest.raises(InvalidValueError, match="not a whole number of sequences"):
        to_step_batch_size_schedule(tokens_only, seq_len=3000)
    on_grid = LinearRamp(2**20, 2**22, 10**9, multiple_of=2048)
    assert to_step_batch_size_schedule(on_grid, seq_len=2048).startswith("0:512 ")
    with pytest.raises(InvalidValueError, match="differs from the schedule's seq_len=2048"):
        to_step_batch_size_schedule(gpt3_ramp(), seq_len=4096)
    with pytest.raises(InvalidValueError, match="thresholds must be"):
        to_step_batch_size_schedule(gpt3_ramp(), thresholds="steps")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        to_step_batch_size_schedule("0:8")  # type: ignore[arg-type]
    # A Megatron ramp without seq_len can still be written in samples.
    ramp = MegatronRampup(32, 32, 1000, 1024)
    assert to_step_batch_size_schedule(ramp, thresholds="samples").startswith("0:32 33:64 ")


# ---------------------------------------------------------------------------------------
# The legacy --rampup-batch-size triple
# ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 512),
    increment=st.integers(1, 64),
    increments=st.integers(1, 200),
    ramp_samples=st.integers(1, 200_000),
)
def test_megatron_ramps_write_back_to_an_equivalent_triple(
    start: int, increment: int, increments: int, ramp_samples: int
) -> None:
    ramp = MegatronRampup(start, increment, ramp_samples, start + increment * increments)
    triple = to_rampup_batch_size(ramp)
    samples = np.arange(ramp_samples + 3)
    assert np.array_equal(triple.batch_at(samples), ramp.batch_at(samples))
    assert triple.global_batch == ramp.global_batch


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 64),
    increments=st.integers(1, 64),
    multiple=st.sampled_from([1, 2, 8]),
    ramp_sequences=st.integers(1, 50_000),
    seq_len=st.sampled_from([1, 128, 2048]),
)
def test_linear_ramps_in_sequences_become_exact_triples_or_say_why_not(
    start: int, increments: int, multiple: int, ramp_sequences: int, seq_len: int
) -> None:
    ramp = LinearRamp(
        start * multiple,
        (start + increments) * multiple,
        ramp_sequences * seq_len,
        unit="sequences",
        seq_len=seq_len,
        multiple_of=multiple,
    )
    samples = np.arange(ramp_sequences + 3)
    expected = ramp.batch_tokens_at(samples * seq_len) // seq_len
    natural = MegatronRampup(start * multiple, multiple, ramp_sequences, ramp.end)
    if not np.array_equal(natural.batch_at(samples), expected):
        # Megatron's float division moves a change by one sample for some ramps (e.g. 1 to
        # 8 over 1,947 samples: 1947 / (1947 / 7) < 7); then no triple may be exact.
        try:
            triple = to_rampup_batch_size(ramp)
        except InvalidValueError:
            return
    else:
        triple = to_rampup_batch_size(ramp)
    assert np.array_equal(triple.batch_at(samples), expected)
    assert triple.start == start * multiple
    assert triple.launcher_args().endswith(f" --seq-length {seq_len}")


def test_float_division_is_megatrons() -> None:
    ramp = LinearRamp(1, 8, 1947, unit="sequences", seq_len=1)
    with pytest.raises(InvalidValueError, match="no ramp_samples matches"):
        to_rampup_batch_size(ramp)
    # Megatron's own ramp holds 7 at sample 1947, one sample longer than the exact ramp.
    assert MegatronRampup(1, 1, 1947, 8).batch_at([1946, 1947, 1948]).tolist() == [7, 7, 8]
    assert ramp.batch_at([1946, 1947]).tolist() == [7, 8]
    gpt3 = to_rampup_batch_size(gpt3_ramp())
    assert gpt3.launcher_args() == (
        "--rampup-batch-size 16 16 1953125 --global-batch-size 1536 --seq-length 2048"
    )


def test_rampup_refuses_what_it_cannot_express() -> None:
    with pytest.raises(InvalidValueError, match="constant"):
        to_rampup_batch_size(Piecewise([(0, 2048)], unit="sequences", seq_len=4096))
    with pytest.raises(InvalidValueError, match="not linear in samples"):
        to_rampup_batch_size(llama3_405b_schedule(), seq_len=4096)
    with pytest.raises(InvalidValueError, match="not linear in samples"):
        to_rampup_batch_size(SCHEDULES["ramp by steps"])
    with pytest.raises(InvalidValueError, match="decreases"):
        to_rampup_batch_size(SCHEDULES["decreasing pieces"])
    # DeepSeek-V3 ramps over 469B tokens, not a whole number of 4,096-token samples: the
    # changes fall where no integer ramp_samples puts Megatron's.
    with pytest.raises(InvalidValueError, match="no ramp_samples matches"):
        to_rampup_batch_size(deepseek_v3_ramp())
    assert MegatronRampup(8, 8, 100, 64).launcher_args() == (
        "--rampup-batch-size 8 8 100 --global-batch-size 64"
    )
