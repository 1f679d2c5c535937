"""The CPU part of benches/gpu/varlen_attention.py: every attention path that runs here
agrees with per-document attention on a packed row with padded documents."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benches" / "gpu" / "varlen_attention.py"


def test_cpu_paths_agree_and_gpu_kernels_say_why_they_are_skipped() -> None:
    script = load_script(SCRIPT, "varlen_attention")
    printed = io.StringIO()
    argv = ["--device", "cpu", "--max-tokens", "1024", "--cp", "2", "--heads", "2",
            "--head-dim", "16", "--repeats", "1"]  # fmt: skip
    with contextlib.redirect_stdout(printed):
        records = script.main(argv)
    by_name = {record["name"]: record for record in records}
    assert set(by_name) == {
        "per_document", "padded_documents", "block_diagonal", "flash_attn_varlen", "torch_varlen"
    }  # fmt: skip
    for name in ("per_document", "padded_documents", "block_diagonal"):
        assert by_name[name]["max_error"] < 1e-5, by_name[name]
        assert by_name[name]["forward_ms"] > 0
        assert by_name[name]["forward_backward_ms"] > 0
    assert by_name["flash_attn_varlen"]["skipped"] == "needs CUDA"
    first = records[0]
    assert first["tokens"] <= 1024
    assert first["documents"] >= 2  # padding between documents is exercised
    output = printed.getvalue()
    assert "documents padded to multiples of 4" in output
    assert "block_diagonal" in output


def test_layout_comes_from_the_packer_and_collator() -> None:
    script = load_script(SCRIPT, "varlen_attention")
    cu, cu_padded = script.packed_layout(2048, 8, seed=1)
    assert cu_padded[-1] <= 2048
    padded, real = np.diff(cu_padded), np.diff(cu)
    assert (padded % 8 == 0).all()
    assert ((padded - real >= 0) & (padded - real < 8)).all()
