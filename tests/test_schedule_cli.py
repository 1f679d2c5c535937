"""``tokenbatch schedule`` on the command line."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from tokenbatch.cli import main
from tokenbatch.cli.schedule_command import plot_schedule
from tokenbatch.errors import InvalidValueError
from tokenbatch.memory import ModelSpec
from tokenbatch.scaling import ExtrapolationWarning, launch_plan
from tokenbatch.schedule import MegatronRampup, WarmupStableDecayLR, deepseek_v3_ramp


def test_preset_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "--preset", "deepseek-v3", "--dp", "64", "--multiple-of", "64"])
    out = capsys.readouterr().out
    assert code == 0
    assert "preset deepseek-v3" in out
    table = deepseek_v3_ramp(multiple_of=64).table(14_800_000_000_000, 4096, 64)
    assert f"{len(table['batch_tokens']):,}" in out
    assert "15,360" in out
    assert "3,072" in out


def test_megatron_json_matches_train_iters(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedule", "--megatron", "32", "32", "1000", "1024", "--seq-len", "2048"]
    code = main([*args, "--total-tokens", str(100_000 * 2048), "--dp", "8", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["steps"] == MegatronRampup(32, 32, 1000, 1024).train_iters(100_000)
    assert summary["first_batch_tokens"] == 32 * 2048
    assert summary["final_batch_tokens"] == 1024 * 2048


def test_every_step_with_lr_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_csv = tmp_path / "table.csv"
    out_npz = tmp_path / "table.npz"
    base = ["schedule", "--linear", "8Ki", "32Ki", "100Ki", "--micro-batch-tokens", "4Ki"]
    base += ["--total-tokens", "1Mi", "--lr", "1e-3", "--lr-schedule", "wsd", "--steps"]
    assert main([*base, "--output", str(out_csv)]) == 0
    printed = capsys.readouterr().out
    rows = np.loadtxt(out_csv, delimiter=",", skiprows=1)
    assert rows.shape[1] == 5
    assert rows[:, 1].sum() == rows[-1, 3]  # batch_tokens add up to the consumed tokens
    assert np.all(rows[:, 1] % 4096 == 0)  # rounded to whole micro-batches by default
    assert printed.count("\n") > rows.shape[0]  # every step printed
    assert main([*base, "--output", str(out_npz)]) == 0
    with np.load(out_npz) as data:
        assert set(data.files) >= {"batch_tokens", "consumed_tokens", "lr"}
        expected = WarmupStableDecayLR(1e-3, 2**20).lr_at(data["consumed_tokens"])
        np.testing.assert_allclose(data["lr"], expected)


def test_recommend_prints_a_launch_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedule", "--recommend", "llama-3.1-8b", "--total-tokens", "1T", "--gpus", "64"]
    args += ["--seq-len", "8192", "--lr", "3e-4", "--plot", str(tmp_path / "plan.png")]
    code = main([*args, "--output", str(tmp_path / "steps.npz")])
    captured = capsys.readouterr()
    assert code == 0
    assert "Launch plan: llama-3.1-8b" in captured.out
    assert "--step-batch-size-schedule" in captured.out
    assert "warning" not in captured.err  # the extrapolations are in the plan's notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        plan = launch_plan(
            ModelSpec.preset("llama-3.1-8b"),
            10**12,
            num_gpus=64,
            seq_len=8192,
            gpu_memory=80e9,
            peak_lr=3e-4,
        )
    assert plan.explanation() in captured.out
    with np.load(tmp_path / "steps.npz") as data:
        assert len(data["batch_tokens"]) == plan.steps
        assert data["lr"][-1] < 3e-4  # cosine decay of the final stage's rate
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    # A parameter count, as JSON.
    code = main(
        ["schedule", "--recommend", "7B", "--total-tokens", "2T", "--gpus", "128", "--json"]
    )
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["dp"] == 128
    assert summary["layout"] is None
    assert sum(stage["steps"] for stage in summary["stages"]) == summary["steps"]


def test_recommend_shows_the_spread_and_says_each_warning_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["schedule", "--recommend", "llama-3.1-8b", "--total-tokens", "15T", "--gpus", "512"]
    assert main([*args, "--seq-len", "8192"]) == 0
    captured = capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        plan = launch_plan(
            ModelSpec.preset("llama-3.1-8b"),
            15 * 10**12,
            num_gpus=512,
            seq_len=8192,
            gpu_memory=80e9,
        )
    assert captured.out.strip() == plan.explanation()
    assert captured.err == ""
    for spread in (plan.batch_spread, plan.lr_spread):
        for item in spread.estimates:
            assert item.name in captured.out
    assert captured.out.count("range across laws:") == 2
    assert plan.notes
    for note in plan.notes:
        assert captured.out.count(note) == 1
    assert "extrapolated" in "".join(plan.notes)
    assert plan.peak_lr < 6e-4  # not Step Law's 1.8e-3
    # Laws chosen, or the numbers given, on the command line.
    extra = ["--seq-len", "8192", "--gpus", "64", "--json"]
    count = ["schedule", "--recommend", "8B", "--total-tokens", "15T"]
    assert main([*count, *extra, "--batch-law", "deepseek", "--lr-law", "porian"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["laws"]["batch"]["chosen"], data["laws"]["lr"]["chosen"]) == ("deepseek", "porian")
    assert main([*count, *extra, "--batch-tokens", "16Mi", "--lr", "3e-4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batch_tokens"] == 16 * 2**20
    assert data["peak_lr"] == 3e-4
    assert data["laws"]["batch"]["reason"] == "given"


def test_recommend_with_step_law_prints_law_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedule", "--recommend", "7B", "--law", "step"]
    code = main([*args, "--total-tokens", "2T", "--dp", "128"])
    captured = capsys.readouterr()
    assert code == 0
    assert "Step Law" in captured.out
    assert "ramp: LinearRamp" in captured.out
    assert "outside the range the law was fitted on" in captured.err


def test_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "--preset", "deepseek-v3", "--dp", "64"])
    assert code == 2
    assert "multiple_of=64 sequences" in capsys.readouterr().err
    assert main(["schedule", "--linear", "8Ki", "16Ki", "100Ki"]) == 2
    assert "--total-tokens is required" in capsys.readouterr().err
    assert main(["schedule", "--recommend", "1B"]) == 2
    assert "needs --total-tokens" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    table = deepseek_v3_ramp().table(10**12, 4096, 1)
    with pytest.raises(InvalidValueError, match=r"tokenbatch\[plot\]"):
        plot_schedule(table, None, tmp_path / "plot.png")


class _FakeAxis:
    def __init__(self, calls: list[tuple[str, object]]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> object:
        def record(*args: object, **kwargs: object) -> _FakeAxis:
            self.calls.append((name, args))
            return self

        return record


def test_plot_draws_batch_and_lr_against_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, object]] = []
    axis = _FakeAxis(calls)
    pyplot = types.SimpleNamespace(
        subplots=lambda **_: (axis, axis), close=lambda figure: calls.append(("close", ()))
    )
    matplotlib = types.SimpleNamespace(use=lambda backend: calls.append(("use", (backend,))))
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    table = deepseek_v3_ramp().table(10**12, 4096, 1)
    lr = WarmupStableDecayLR(1e-3, 10**12).lr_at(table["consumed_tokens"])
    plot_schedule(table, lr, tmp_path / "plot.png", title="ramp")
    names = [name for name, _ in calls]
    assert ("use", ("Agg",)) in calls
    step_args = next(args for name, args in calls if name == "step")
    np.testing.assert_array_equal(step_args[0], table["consumed_tokens"])  # type: ignore[index]
    np.testing.assert_array_equal(step_args[1], table["batch_tokens"])  # type: ignore[index]
    assert "twinx" in names  # a second axis for the learning rate
    assert ("savefig", (tmp_path / "plot.png",)) in calls
    assert names[-1] == "close"
