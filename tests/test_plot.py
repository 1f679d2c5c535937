"""tokenbatch.plot: every plot renders to a valid, non-empty image and shows the data."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import tokenbatch as tb
from tokenbatch.cli import main
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.plot import plot_launch_plan, plot_memory, plot_packing, plot_schedule
from tokenbatch.scaling import ThreeTermLaw, launch_plan
from tokenbatch.schedule import CosineLR, deepseek_v3_ramp


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature and header chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"
    return width, height


def ink(path: Path) -> float:
    """Fraction of pixels that are not white: an empty canvas has none."""
    from matplotlib.image import imread

    pixels = imread(path)[..., :3]
    return float(np.mean(np.any(pixels < 0.95, axis=-1)))


def test_packing_plot(tmp_path: Path) -> None:
    packing = tb.pack(tb.datasets.example_lengths("chat", 5_000, max_length=2048), 2048)
    out = tmp_path / "packing.png"
    figure = plot_packing(packing, path=out)
    width, height = png_size(out)
    assert width > 500
    assert height > 200
    assert ink(out) > 0.01
    fill_axes, length_axes = figure.axes
    assert sum(p.get_height() for p in fill_axes.patches) == packing.n_bins
    assert sum(p.get_height() for p in length_axes.patches) == packing.n_segments


def test_memory_plot(tmp_path: Path) -> None:
    spec = tb.ModelSpec.preset("llama-3.1-8b")
    layouts = {
        "tp1": tb.estimate_memory(spec, seq_len=4096, dp=8),
        "tp2 full recompute": tb.estimate_memory(spec, seq_len=4096, dp=4, tp=2, recompute="full"),
    }
    out = tmp_path / "memory.png"
    figure = plot_memory(layouts, gpu_memory=80e9, path=out)
    png_size(out)
    assert ink(out) > 0.01
    (axes,) = figure.axes
    # 5 stacked parts per layout; the stack reaches each layout's total
    tops = {}
    for patch in axes.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    for x, estimate in enumerate(layouts.values()):
        assert tops[x] == pytest.approx(estimate.total / 2**30, rel=1e-6)
    labelled = plot_memory(list(layouts.values()))
    assert labelled.axes[0].get_xticklabels()[0].get_text() == "dp8 mb1"


def test_schedule_plot(tmp_path: Path) -> None:
    ramp = deepseek_v3_ramp()
    out = tmp_path / "schedule.svg"
    figure = plot_schedule(ramp, 600_000_000_000, lr=CosineLR(3e-4, 600_000_000_000), path=out)
    assert out.read_text().lstrip().startswith("<?xml")
    batch_axes, lr_axes = figure.axes
    (line,) = batch_axes.get_lines()
    batches = line.get_ydata()
    assert batches[0] == 3072 * 4096
    assert batches[-1] == 15360 * 4096
    assert np.all(np.diff(batches) >= 0)
    assert len(lr_axes.get_lines()) == 1


def test_launch_plan_plot(tmp_path: Path) -> None:
    law = ThreeTermLaw(E=1.8, A=300.0, alpha=0.33, B=40.0, beta=0.3, C=25.0, gamma=0.4)
    plan = launch_plan(5e8, 10**11, num_gpus=8, seq_len=2048, law=law, peak_lr=1e-3)
    out = tmp_path / "plan.png"
    figure = plot_launch_plan(plan, path=out)
    width, height = png_size(out)
    assert width > 1000
    assert height > 400
    assert ink(out) > 0.01
    ramp_axes, loss_axes, rate_axes = figure.axes
    batch_line, critical_line = ramp_axes.get_lines()[:2]
    assert list(batch_line.get_ydata()[:-1]) == [s.batch_tokens for s in plan.stages]
    along = critical_line.get_xdata()
    np.testing.assert_allclose(critical_line.get_ydata(), plan.law.critical_batch_after(along))
    assert list(rate_axes.get_lines()[0].get_ydata()[:-1]) == [s.learning_rate for s in plan.stages]
    share, chosen = loss_axes.get_lines()[0], loss_axes.get_lines()[-1]
    assert max(share.get_ydata()) == pytest.approx(100, abs=0.01)
    assert chosen.get_xdata()[0] == plan.batch_tokens
    # The band spans the lowest to the highest batch the shipped laws give for this run.
    band = next(p for p in ramp_axes.patches if p.get_label() == "range across the batch laws")
    low, high = plan.batch_spread.low, plan.batch_spread.high
    assert low < high
    extent = band.get_path().get_extents(band.get_patch_transform())
    assert (extent.y0, extent.y1) == pytest.approx((low, high))
    with pytest.raises(InvalidTypeError, match="LaunchPlan"):
        plot_launch_plan(plan.schedule)  # type: ignore[arg-type]


def test_bad_input() -> None:
    with pytest.raises(InvalidTypeError, match=r"tokenbatch\.Packing"):
        plot_packing([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="empty"):
        plot_memory({})
    with pytest.raises(InvalidTypeError, match="not a MemoryEstimate"):
        plot_memory({"a": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidValueError, match="no step"):
        plot_schedule(deepseek_v3_ramp(), 1000)


def test_cli_pack_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.png"
    code = main(
        ["pack", "--example", "chat", "--n", "2000", "--max-tokens", "4096", "--plot", str(out)]
    )
    assert code == 0
    png_size(out)
    assert ink(out) > 0.01
    assert str(out) in capsys.readouterr().err
