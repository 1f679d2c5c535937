"""Memory estimates: exact parameter counts, published figures, grids, planner, CLI."""

from __future__ import annotations

import copy
import io
import json
import math
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenbatch
from tokenbatch import (
    InvalidTypeError,
    InvalidValueError,
    ModelSpec,
    TokenBatchOverflowError,
    estimate_memory,
    estimate_memory_grid,
    max_micro_batch_tokens,
    plan_layouts,
)
from tokenbatch.cli import main
from tokenbatch.memory import RECOMPUTE_MODES, RECOMPUTE_MODULES, estimate_memory_stages
from tokenbatch.memory.recompute import recompute_name

GIB = 1024**3
LLAMA_8B = ModelSpec.preset("llama-3.1-8b")


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("llama-3.1-8b", 8_030_261_248, 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496, 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800, 405_853_388_800),
        ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
        ("qwen2.5-7b", 7_615_616_512, 7_615_616_512),
        ("deepseek-v3", 671_026_404_352, 37_552_282_624),
        ("gpt3-175b", 174_604_259_328, 174_604_259_328),
    ],
)
def test_preset_parameter_counts_are_exact(name: str, total: int, active: int) -> None:
    spec = ModelSpec.preset(name)
    assert spec.num_params() == total
    assert spec.num_active_params() == active


LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def test_from_hf_config_reads_dicts_files_and_directories(tmp_path: Path) -> None:
    assert ModelSpec.from_hf_config(LLAMA_CONFIG).num_params() == 8_030_261_248
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    assert ModelSpec.from_hf_config(tmp_path).num_params() == 8_030_261_248
    assert ModelSpec.from_hf_config(tmp_path / "config.json").name == tmp_path.name
    mixtral = {**LLAMA_CONFIG, "model_type": "mixtral", "vocab_size": 32000}
    mixtral |= {"num_local_experts": 8, "num_experts_per_tok": 2}
    assert ModelSpec.from_hf_config(mixtral).num_active_params() == 12_879_925_248
    qwen = {
        **LLAMA_CONFIG,
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
    }
    assert ModelSpec.from_hf_config(qwen).num_params() == 7_615_616_512
    deepseek = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "topk_method": "noaux_tc",
    }
    assert ModelSpec.from_hf_config(deepseek).num_params() == 671_026_404_352
    with pytest.raises(InvalidValueError, match="model_type"):
        ModelSpec.from_hf_config({**LLAMA_CONFIG, "model_type": "bert"})
    incomplete = {k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"}
    with pytest.raises(InvalidValueError, match="intermediate_size"):
        ModelSpec.from_hf_config(incomplete)
    with pytest.raises(InvalidValueError, match="no such file"):
        ModelSpec.from_hf_config(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("recompute", "gib"), [("none", 9.2539), ("selective", 4.2539), ("full", 0.2539)]
)
def test_playbook_activation_memory(recompute: str, gib: float) -> None:
    estimate = estimate_memory(
        LLAMA_8B, seq_len=1024, recompute=recompute, activation_model="korthikanti"
    )
    assert estimate.activations / GIB == pytest.approx(gib, abs=5e-5)


def test_bytes_per_parameter_table_and_zero_divisions() -> None:
    n = LLAMA_8B.num_params()
    base = estimate_memory(LLAMA_8B, seq_len=1024)
    assert (base.params, base.grads, base.optimizer) == (2 * n, 2 * n, 12 * n)
    assert estimate_memory(LLAMA_8B, seq_len=1024, fp32_grad_accum=True).model_states == 20 * n
    assert estimate_memory(LLAMA_8B, seq_len=1024, param_dtype="fp32").model_states == 16 * n
    d = 8
    z = [estimate_memory(LLAMA_8B, seq_len=1024, dp=d, zero=k) for k in range(4)]
    assert z[1].model_states == 2 * n + 2 * n + 12 * n // d
    assert z[2].model_states == 2 * n + (2 * n) // d + (12 * n) // d
    assert z[3].model_states == 16 * n // d
    assert all(e.activations == base.activations for e in z)


def test_explain_names_every_component() -> None:
    estimate = estimate_memory(LLAMA_8B, seq_len=4096, dp=8, zero=1, recompute="full")
    buffer = io.StringIO()
    estimate.explain(file=buffer)
    text = buffer.getvalue()
    for word in ("params", "grads", "optimizer", "activations", "checkpoints", "ZeRO-1", "total"):
        assert word in text
    assert f"{estimate.total / GIB:.3f}" in text
    assert sum(estimate.activation_parts.values()) == pytest.approx(estimate.activations, abs=8)


def test_explain_takes_numeric_dtypes_and_optimizer_states() -> None:
    # Byte sizes and state counts given as numbers are read as such, and explained as such.
    by_number = estimate_memory(LLAMA_8B, seq_len=4096, param_dtype=2, optimizer=2)
    by_name = estimate_memory(LLAMA_8B, seq_len=4096)
    assert by_number.total == by_name.total
    text = by_number.explanation()
    assert "2 B/param (2)" in text
    assert "4 (master weights) + 8 (2 states in fp32) B/param" in text
    fp32_acts = estimate_memory(LLAMA_8B, seq_len=4096, activation_dtype="fp32").explanation()
    assert "4 B/element" in fp32_acts


def test_plan_communication_follows_activation_dtype() -> None:
    common: dict[str, Any] = {
        "num_gpus": 16,
        "gpu_memory": 80e9,
        "seq_len": 4096,
        "global_batch_tokens": 4096 * 64,
        "top": None,
        "distinct": False,
    }
    spec = ModelSpec.preset("llama-3.1-70b")

    def tp_comm(**options: Any) -> dict[tuple[int, ...], float]:
        return {
            (x.dp, x.tp, x.pp, x.zero, x.micro_batch): x.time_parts["tp_comm"]
            for x in plan_layouts(spec, **common, **options)
            if x.tp > 1 and x.recompute == "full"
        }

    bf16 = tp_comm()
    fp32 = tp_comm(activation_dtype="fp32")
    shared = set(bf16) & set(fp32)
    assert shared
    for key in shared:
        # Twice the bytes; the collectives' latency stays the same.
        assert 1.2 * bf16[key] < fp32[key] < 2 * bf16[key]


def test_grid_broadcasts_and_matches_scalar_estimates() -> None:
    tp = np.array([1, 2, 3, 4])[:, None, None]
    seq = np.array([1024, 4096])[None, :, None]
    recompute = np.array(["none", "selective", "full", "core_attn"])
    grid = estimate_memory_grid(LLAMA_8B, tp=tp, seq_len=seq, recompute=recompute, dp=8, zero=1)
    assert grid.shape == (4, 2, 4)
    assert grid.total.shape == (4, 2, 4)
    assert not grid.valid[2].any()
    assert set(grid.reasons()[2].ravel()) == {"tp must divide num_heads"}
    assert np.isnan(grid.total[2]).all()
    for i in (0, 1, 3):
        for j in range(2):
            for k in range(4):
                one = estimate_memory(
                    LLAMA_8B,
                    seq_len=int(seq[0, j, 0]),
                    tp=int(tp[i, 0, 0]),
                    recompute=str(recompute[k]),
                    dp=8,
                    zero=1,
                )
                assert grid.total[i, j, k] == one.total
                assert grid.activations[i, j, k] == one.activations
    assert grid.fits(80e9).sum() > 0
    # Fields are contiguous views of the table, and to_dict gives every field.
    fields = grid.to_dict()
    assert all(a.flags.c_contiguous and a.shape == grid.shape for a in fields.values())
    assert np.nanmax(fields["stage"]) == 0  # pp = 1: one stage
    assert np.array_equal(fields["total"], grid.total, equal_nan=True)
    with pytest.raises(ValueError, match="read-only"):
        grid.total[0, 0, 0] = 1.0


def test_grid_of_scattered_configurations_reads_any_number_dtype() -> None:
    # A list of configurations (every input one value per cell) gives what each one
    # alone gives, whatever the arrays' dtypes, with names matched in any case.
    rng = np.random.default_rng(1)
    n = 5000
    columns: dict[str, Any] = {
        "seq_len": rng.choice([1024, 4096, 8192], n),
        "tp": rng.choice(np.array([1, 2, 3, 8], dtype=np.uint8), n),
        "pp": rng.choice([1.0, 2.0, 4.0], n),
        "sequence_parallel": rng.integers(0, 2, n).astype(bool),
        "recompute": rng.choice(["none", "FULL", "Selective", "bogus"], n),
        "zero": rng.choice(np.array([0, 1, 3], dtype=np.int32), n),
    }
    grid = estimate_memory_grid(LLAMA_8B, dp=8, **columns)
    assert grid.shape == (n,)
    for i in range(0, n, 97):
        cell = {k: v[i].item() for k, v in columns.items()}
        if cell["recompute"] == "bogus" or cell["tp"] == 3:
            assert not grid.valid[i]
            continue
        one = estimate_memory(LLAMA_8B, dp=8, **cell)
        assert grid.total[i] == one.total
    reasons = set(grid.reasons()[~grid.valid].tolist())
    assert any("recompute" in r for r in reasons)
    assert "tp must divide num_heads" in reasons


def test_recompute_names_megatron_core_modules_alone_or_joined() -> None:
    # Megatron-Core's `recompute_modules`, joined with "+" in any order and case, name
    # the same code alone, in string arrays (matched in the core), and as numbers.
    mixtral = ModelSpec.preset("mixtral-8x7b").replace(implementation="fused")
    sets = ["core_attn+mlp", "MLP+Core_Attn", "mlp+mlp+core_attn", "moe+layernorm", "layernorm"]
    alone = [estimate_memory(mixtral, seq_len=4096, recompute=name) for name in sets]
    assert alone[0].total == alone[1].total == alone[2].total
    codes = [5, 5, 5, 14, 6]
    assert [x.inputs["recompute"] for x in alone] == codes
    assert alone[3].activations < alone[4].activations < alone[0].activations
    for column in (np.array(sets), np.array(sets, dtype=object), np.array(codes)):
        grid = estimate_memory_grid(mixtral, seq_len=4096, recompute=column)
        assert grid.total.tolist() == [x.total for x in alone]
    # Each module's name, every set's canonical name, and back.
    for code in range(130):
        name = recompute_name(code)
        assert estimate_memory(mixtral, seq_len=4096, recompute=name).inputs["recompute"] == code
    assert recompute_name(3) == "core_attn"
    assert recompute_name(2 + 31) == "core_attn+mlp+layernorm+moe+shared_experts"
    assert recompute_name(2 + 32 + 1) == "core_attn+mla_up_proj"
    with pytest.raises(ValueError, match="no recompute mode has code 130"):
        recompute_name(130)
    # Bad names: a clear error alone, an invalid cell in a grid.
    bad = ["mlp+", "+mlp", "mlp++moe", "mlp+full", "moe_acts", "mlp + moe", ""]
    for name in bad:
        with pytest.raises(InvalidValueError, match=r"Megatron-Core modules .* joined with '\+'"):
            estimate_memory(mixtral, seq_len=4096, recompute=name)
    grid = estimate_memory_grid(mixtral, seq_len=4096, recompute=np.array([*bad, "moe"]))
    assert grid.valid.tolist() == [False] * len(bad) + [True]
    assert all("Megatron-Core modules" in reason for reason in grid.reasons()[:-1])
    assert not estimate_memory_grid(mixtral, seq_len=4096, recompute=np.array([130])).valid[0]
    assert list(RECOMPUTE_MODULES) == [
        "core_attn",
        "mlp",
        "layernorm",
        "moe",
        "shared_experts",
        "mla_up_proj",
        "moe_act",
    ]
    assert RECOMPUTE_MODES == {"none": 0, "selective": 1, "full": 2}


_PIECES = [*RECOMPUTE_MODULES, *RECOMPUTE_MODES, "MLP", "Moe_Act", "", " mlp", "\u212aernel"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4))
def test_recompute_sets_match_in_a_column_as_alone(pieces: list[str]) -> None:
    # A string column is parsed string by string in the core, a scalar alone: the same
    # estimate (or the same refusal) for any pieces joined with "+", in any case, with
    # unknown and empty ones.
    name = "+".join(pieces)
    grid = estimate_memory_grid(MIXTRAL, seq_len=4096, recompute=np.array([name, "none"]))
    try:
        alone = estimate_memory(MIXTRAL, seq_len=4096, recompute=name)
    except InvalidValueError:
        assert not grid.valid[0], name
    else:
        assert grid.total[0] == alone.total, name
    assert grid.valid[1]


def test_named_options_in_grids_match_as_python_lowercases_them() -> None:
    # Arrays of names of every named option that the grid reads itself, broadcast along
    # an axis or one per cell, as strings or objects: each cell gives what the scalar
    # call gives, and a name matches as `str.lower()` of it would (the Kelvin sign is a
    # `k`; U+0130 is not an `i`).
    names = {
        "recompute": ["NONE", "full", "Selective", "nope"],
        "attention": ["flash", "EAGER", "Flash", "x"],
        "activation_model": ["modern", "\u212aorthikanti", "MODERN", "korthikant\u0130"],
        "cp_comm": ["p2p", "A2A", "all_gather", "ring"],
        "loss": ["standard", "FUSED", "Standard", "chunked"],
        "pipeline_split": ["even", "AUTO", "Embedding_And_Loss", "odd"],
    }
    for option, values in names.items():
        for as_objects in (False, True):
            column = np.array(values, dtype=object if as_objects else None)
            grid = estimate_memory_grid(
                LLAMA_8B, seq_len=np.array([2048, 8192])[:, None], pp=2, cp=2, **{option: column}
            )
            listed = estimate_memory_grid(
                LLAMA_8B,
                seq_len=np.repeat([2048, 8192], 4),
                pp=2,
                cp=2,
                **{option: np.tile(column, 2)},
            )
            assert grid.shape == (2, 4)
            assert np.array_equal(grid.total.reshape(-1), listed.total, equal_nan=True)
            for i, seq_len in enumerate([2048, 8192]):
                for j, name in enumerate(values):
                    if j == 3:
                        assert not grid.valid[i, j], (option, name)
                        assert option in grid.reasons()[i, j]
                        continue
                    one = estimate_memory(LLAMA_8B, seq_len=seq_len, pp=2, cp=2, **{option: name})
                    assert grid.total[i, j] == one.total, (option, name)
    # Bytes name as their text does, in arrays and alone.
    as_bytes = np.array([b"FULL", b"none", b"bogus"])
    as_text = np.array(["FULL", "none", "bogus"])
    grids = [estimate_memory_grid(LLAMA_8B, seq_len=4096, recompute=r) for r in (as_bytes, as_text)]
    assert grids[0].valid.tolist() == [True, True, False]
    assert np.array_equal(grids[0].total, grids[1].total, equal_nan=True)
    alone = [estimate_memory(LLAMA_8B, seq_len=4096, recompute=r) for r in (b"Full", "full")]
    assert alone[0].inputs == alone[1].inputs
    assert alone[0].total == alone[1].total


def test_grid_marks_each_invalid_cell_with_its_reason() -> None:
    grid = estimate_memory_grid(
        LLAMA_8B,
        seq_len=[4096, 4096, 4096, 4096, 4096, -1, 4096],
        pp=[1, 3, 1, 1, 1, 1, 1],
        zero=[0, 0, 4, 0, 0, 0, 0],
        dp=[1, 1, 1, math.nan, 1, 1, 1],
        recompute=["none", "none", "none", "none", "bogus", "none", "none"],
    )
    assert grid.valid.tolist() == [True, False, False, False, False, False, True]
    reasons = grid.reasons().tolist()
    assert reasons[0] == ""
    assert "pp" in reasons[1]
    assert "zero" in reasons[2]
    assert "dp" in reasons[3]
    assert "recompute" in reasons[4]
    assert "seq_len" in reasons[5]


def test_long_columns_of_any_number_dtype_give_the_same_grid() -> None:
    # Long boolean and integer columns are read in place, others converted to float64.
    rng = np.random.default_rng(3)
    cells = 5000
    flags = rng.integers(0, 2, cells).astype(bool)
    tp = rng.choice([1, 2, 4, 8], cells)
    grids = [
        estimate_memory_grid(
            LLAMA_8B,
            seq_len=4096,
            tp=tp.astype(np.int64 if dtype is bool else dtype),
            sequence_parallel=flags.astype(dtype),
            fused_swiglu=flags[::-1].astype(dtype),
            fp8=flags[::-1].astype(dtype),
        )
        for dtype in (bool, np.int64, np.int32, np.uint8, np.float64)
    ]
    for grid in grids[1:]:
        assert np.array_equal(grid.total, grids[0].total)
        assert np.array_equal(grid.field("act_norm"), grids[0].field("act_norm"))
    assert grids[0].valid.all()
    assert len(np.unique(grids[0].total)) > 8


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_long_integer_columns_are_read_in_place_and_checked(dtype: Any) -> None:
    from tokenbatch.memory.options import _numeric

    rng = np.random.default_rng(4)
    cells = 6000
    dp = rng.choice([1, 2, 8], cells).astype(dtype)
    zero = rng.integers(0, 4, cells).astype(dtype)
    dp[[5, 17]] = [-1, 0]
    zero[[9, 33]] = [4, -2]
    assert np.shares_memory(_numeric("dp", dp), dp)
    grid = estimate_memory_grid(LLAMA_8B, seq_len=4096, dp=dp, zero=zero)
    as_floats = estimate_memory_grid(
        LLAMA_8B, seq_len=4096, dp=dp.astype(np.float64), zero=zero.astype(np.float64)
    )
    assert np.flatnonzero(~grid.valid).tolist() == [5, 9, 17, 33]
    assert np.array_equal(grid.reason_code, as_floats.reason_code)
    assert np.array_equal(grid.total[grid.valid], as_floats.total[grid.valid])


def test_huge_pipeline_degrees_are_invalid_not_a_crash() -> None:
    # pp * vpp = 2^66 once wrapped to 0 in 64 bits: a division by zero in the core.
    with pytest.raises(InvalidValueError, match="pp"):
        estimate_memory(LLAMA_8B, seq_len=4096, pp=2**33, vpp=2**33)
    grid = estimate_memory_grid(LLAMA_8B, seq_len=4096, pp=[2**33, 4], vpp=[2**33, 1])
    assert grid.valid.tolist() == [False, True]
    assert "pp" in grid.reasons()[0]


def test_moe_expert_parallel_and_pipeline_stage() -> None:
    mixtral = ModelSpec.preset("mixtral-8x7b")
    no_ep = estimate_memory(mixtral, seq_len=4096, dp=8)
    ep8 = estimate_memory(mixtral, seq_len=4096, dp=8, ep=8)
    expert_params = 32 * 8 * 3 * 4096 * 14336
    assert no_ep.params - ep8.params == 2 * (expert_params - expert_params // 8)
    pp = estimate_memory(LLAMA_8B, seq_len=4096, pp=4)
    assert pp.stage == 0
    assert pp.params < estimate_memory(LLAMA_8B, seq_len=4096).params / 3


def test_uneven_pipeline_stages_express_the_published_layouts() -> None:
    deepseek = ModelSpec.preset("deepseek-v3")
    with pytest.raises(InvalidValueError, match="pipeline_split='auto'"):
        estimate_memory(deepseek, seq_len=4096, pp=16)
    # 61 layers on 16 stages: 3 + 14 x 4 + 2, the first three dense, on the first stage.
    auto = estimate_memory(deepseek, seq_len=4096, pp=16, dp=128, ep=64, pipeline_split="auto")
    explicit = estimate_memory(
        deepseek, seq_len=4096, pp=16, dp=128, ep=64, first_stage_layers=3, last_stage_layers=2
    )
    assert auto.to_dict() == explicit.to_dict()
    assert auto.layers == {0: 3, 15: 2}.get(auto.stage, 4)
    stages = estimate_memory_stages(
        deepseek, seq_len=4096, pp=16, dp=128, ep=64, pipeline_split="auto"
    )
    assert [x.layers for x in stages] == [3] + [4] * 14 + [2]
    assert [x.stage for x in stages] == list(range(16))
    busiest = max(stages, key=lambda x: x.total)
    assert busiest.to_dict() == auto.to_dict()
    assert stages[0].params > stages[1].params  # the embedding
    with pytest.raises(InvalidValueError, match="layers do not split"):
        estimate_memory_stages(deepseek, seq_len=4096, pp=16)
    assert f"holding {auto.layers} of 61 layers" in auto.explanation()
    # Llama 3.1 405B on 16 stages: one layer fewer on the first and last (126 = 7 + 14 x 8 + 7).
    llama = ModelSpec.preset("llama-3.1-405b")
    layouts = [
        {"pipeline_split": "auto"},
        {"pipeline_split": "embedding_and_loss"},
        {"first_stage_layers": 7, "last_stage_layers": 7},
    ]
    totals = {
        estimate_memory(llama, seq_len=8192, tp=8, pp=16, dp=8, zero=1, **layout).total
        for layout in layouts
    }
    assert len(totals) == 1
    grid = estimate_memory_grid(
        llama,
        seq_len=8192,
        tp=8,
        pp=16,
        pipeline_split=["even", "auto", "embedding", "loss", "embedding_and_loss"],
    )
    assert grid.valid.tolist() == [False, True, False, False, True]
    # The first stage keeps 16 micro-batches of 7 layers, the second 15 of 8: it is the busiest.
    assert (grid.stage[1], grid.layers[1]) == (1, 8)
    with pytest.raises(InvalidValueError, match="pipeline_split must be"):
        estimate_memory(llama, seq_len=8192, pp=16, pipeline_split="uneven")
    with pytest.raises(InvalidValueError, match="layers do not split"):
        estimate_memory(llama, seq_len=8192, pp=16, first_stage_layers=7)


def test_moe_cp_mtp_fp8_fused_loss_and_offload_options() -> None:
    deepseek = ModelSpec.preset("deepseek-v3")
    layout: dict[str, Any] = {"pp": 16, "dp": 128, "ep": 64, "pipeline_split": "auto"}
    base = estimate_memory(deepseek, seq_len=4096, **layout)
    padded = estimate_memory(deepseek, seq_len=4096, moe_capacity_factor=1.25, **layout)
    assert padded.activation_parts["mlp"] > base.activation_parts["mlp"]
    assert base.activation_parts["comm"] > 0  # EP all-to-all buffers
    assert base.saved_activations == base.activations - base.activation_parts["comm"]
    # Multi-token prediction: one more MoE layer, three norms and a 2h x h projection, and
    # its activations, on the last stage.
    mtp = deepseek.replace(mtp_layers=1)
    moe_layer = deepseek.replace(num_layers=62).num_params() - deepseek.num_params()
    assert mtp.num_params() - deepseek.num_params() == moe_layer + 3 * 7168 + 2 * 7168**2
    last = estimate_memory_stages(mtp, seq_len=4096, **layout)[-1]
    assert last.activation_parts["mtp"] > 0
    assert estimate_memory_stages(deepseek, seq_len=4096, **layout)[-1].activation_parts["mtp"] == 0
    # FP8 weights: 1 byte each, 16-bit gradients and activations unless told otherwise.
    llama = LLAMA_8B
    n = llama.num_params()
    fp8 = estimate_memory(llama, seq_len=4096, param_dtype="fp8")
    assert (fp8.params, fp8.grads, fp8.optimizer) == (n, 2 * n, 12 * n)
    assert fp8.activations == estimate_memory(llama, seq_len=4096).activations
    fp8_acts = estimate_memory(llama, seq_len=4096, fp8=True)
    assert fp8_acts.activations < fp8.activations
    assert "FP8 linear inputs" in fp8_acts.explanation()
    # A fused cross-entropy keeps no fp32 logits: 4 bytes x 128,256 per token fewer.
    fused = estimate_memory(llama, seq_len=4096, loss="fused")
    plain = estimate_memory(llama, seq_len=4096)
    assert plain.activation_parts["logits"] - fused.activation_parts["logits"] == 4096 * (
        4 * 128_256 - 4
    )
    offload = estimate_memory(llama, seq_len=4096, optimizer_offload=1.0)
    assert (offload.optimizer, offload.cpu_optimizer) == (0, 12 * n)
    assert "offloaded to CPU" in offload.explanation()
    ring = estimate_memory(llama, seq_len=8192, cp=4)
    gathered = estimate_memory(llama, seq_len=8192, cp=4, cp_comm="all_gather")
    assert gathered.activation_parts["comm"] == 2 * ring.activation_parts["comm"]
    for option, value in (("loss", "chunked"), ("cp_comm", "ring"), ("optimizer_offload", 2)):
        with pytest.raises(InvalidValueError, match=option):
            estimate_memory(llama, seq_len=4096, **{option: value})


@pytest.mark.parametrize(
    ("spec", "options", "match"),
    [
        (LLAMA_8B, {"tp": 3}, "tp must divide num_heads"),
        (LLAMA_8B, {"pp": 5}, "num_layers"),
        (LLAMA_8B, {"zero": 4}, "zero"),
        (LLAMA_8B, {"dp": -2}, "dp"),
        (LLAMA_8B, {"micro_batch": math.nan}, "micro_batch"),
        (LLAMA_8B, {"ep": 2}, "ep"),
        (LLAMA_8B, {"recompute": "sometimes"}, "recompute"),
        (LLAMA_8B, {"param_dtype": "fp64"}, "param_dtype"),
    ],
)
def test_bad_layouts_raise_naming_the_parameter(
    spec: ModelSpec, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidValueError, match=match):
        estimate_memory(spec, seq_len=4096, **options)


def test_bad_specs_and_arguments_raise() -> None:
    with pytest.raises(InvalidValueError, match="num_heads=3 must divide hidden_size"):
        ModelSpec(hidden_size=64, num_layers=2, num_heads=3, ffn_size=128, vocab_size=10)
    with pytest.raises(InvalidValueError, match="num_kv_heads"):
        ModelSpec(
            hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=3, ffn_size=128, vocab_size=10
        )
    with pytest.raises(InvalidValueError, match="hidden_size"):
        ModelSpec(hidden_size=-64, num_layers=2, num_heads=4, ffn_size=128, vocab_size=10)
    with pytest.raises(InvalidValueError, match="top_k"):
        LLAMA_8B.replace(num_experts=4, top_k=5, moe_ffn_size=128)
    with pytest.raises(InvalidValueError, match="num_layers=5000"):
        LLAMA_8B.replace(num_layers=5000)
    with pytest.raises(InvalidValueError, match="unknown preset 'llama-9'"):
        ModelSpec.preset("llama-9")
    with pytest.raises(InvalidValueError, match="moe_dispatcher must be 'alltoall' or 'allgather'"):
        MIXTRAL.replace(implementation="fused", moe_dispatcher="all_gather")
    with pytest.raises(InvalidValueError, match="needs implementation='fused'"):
        MIXTRAL.replace(moe_dispatcher="allgather")
    with pytest.raises(InvalidTypeError, match="scalar"):
        estimate_memory(LLAMA_8B, seq_len=np.array([1, 2]))
    with pytest.raises(InvalidTypeError, match="unknown option"):
        estimate_memory(LLAMA_8B, seq_len=4096, tensor_parallel=2)
    with pytest.raises(InvalidValueError, match="broadcast"):
        estimate_memory_grid(LLAMA_8B, seq_len=[1, 2], tp=[1, 2, 4])
    # An integer past 64 bits is too large, not of the wrong type.
    with pytest.raises(TokenBatchOverflowError, match=r"seq_len = 1(0){30} does not fit"):
        estimate_memory(LLAMA_8B, seq_len=10**30)


@settings(max_examples=50, deadline=None)
@given(
    preset=st.sampled_from(sorted(tokenbatch.memory.PRESETS)),
    layers=st.integers(1, 200),
    fused=st.booleans(),
)
def test_model_specs_are_frozen_values(preset: str, layers: int, fused: bool) -> None:
    # Built once in the core: equal fields make equal, hash-equal specs that survive
    # pickling, copying and their own repr, and replace() builds a new validated spec.
    base = ModelSpec.preset(preset)
    layers = max(layers, base.first_dense_layers)
    spec = base.replace(num_layers=layers, implementation="fused" if fused else "hf")
    assert type(spec) is ModelSpec
    assert spec.num_layers == layers
    assert (spec == base) == (layers == base.num_layers and not fused)
    for again in (
        pickle.loads(pickle.dumps(spec)),
        copy.deepcopy(spec),
        spec.replace(),
        eval(repr(spec), {"ModelSpec": ModelSpec}),
    ):
        assert again == spec
        assert hash(again) == hash(spec)
        assert again.to_dict() == spec.to_dict()
        assert again.num_params() == spec.num_params()
    assert repr(spec).startswith(f"ModelSpec(name='{spec.name}', hidden_size=")
    assert spec != spec.replace(name="other")
    with pytest.raises(AttributeError):
        spec.num_layers = 1  # type: ignore[misc]


def test_model_spec_fields_of_the_wrong_type_or_range_name_the_field() -> None:
    with pytest.raises(InvalidTypeError, match=r"hidden_size must be an integer, got 4096\.5"):
        LLAMA_8B.replace(hidden_size=4096.5)
    assert LLAMA_8B.replace(hidden_size=4096.0) == LLAMA_8B
    with pytest.raises(InvalidTypeError, match="tied_embeddings must be a bool, got 1"):
        LLAMA_8B.replace(tied_embeddings=1)
    with pytest.raises(InvalidTypeError, match="ffn_type must be a string"):
        LLAMA_8B.replace(ffn_type=1)
    with pytest.raises(InvalidValueError, match="norm must be 'rmsnorm' or 'layernorm'"):
        LLAMA_8B.replace(norm="batchnorm")
    with pytest.raises(InvalidTypeError, match="ModelSpec has no field 'heads'"):
        LLAMA_8B.replace(heads=8)
    with pytest.raises(
        TokenBatchOverflowError, match="vocab_size=18446744073709551616 does not fit"
    ):
        LLAMA_8B.replace(vocab_size=2**64)
    with pytest.raises(InvalidValueError, match="top_k, moe_ffn_size and num_shared_experts"):
        LLAMA_8B.replace(top_k=2)


MIXTRAL = ModelSpec.preset("mixtral-8x7b")
OVERFLOW = "the estimate exceeds the range of a float"

#: (model, the input too large, its value, a sane value, other options): bytes past the
#: largest float through each input that multiplies them.
ABSURD = [
    (LLAMA_8B, "seq_len", 1.7e308, 4096, {}),
    (LLAMA_8B, "micro_batch", 1e300, 1, {"pp": 4, "recompute": "full"}),
    (LLAMA_8B, "seq_len", 1e160, 4096, {"attention": "eager"}),
    (LLAMA_8B, "overhead_bytes", sys.float_info.max, 0, {"micro_batch": 1e290}),
    (MIXTRAL, "moe_capacity_factor", 1e308, 1.25, {"ep": 2, "dp": 2}),
    (MIXTRAL, "seq_len", 1e303, 4096, {"cp": 2, "recompute": "selective"}),
]


@pytest.mark.parametrize(("spec", "name", "value", "sane", "others"), ABSURD)
def test_absurd_inputs_are_an_overflow_error_not_infinite_bytes(
    spec: ModelSpec, name: str, value: float, sane: float, others: dict[str, Any]
) -> None:
    options = {"seq_len": 4096, **others, name: value}
    # The error says what went wrong, with the values given of the inputs it names.
    shown = ".*".join(f"{k}=" for k in options if k in ("seq_len", "micro_batch", name))
    with pytest.raises(TokenBatchOverflowError, match=rf"^{OVERFLOW}.*\(got {shown}") as raised:
        estimate_memory(spec, **options)
    assert isinstance(raised.value, OverflowError)
    with pytest.raises(TokenBatchOverflowError, match=OVERFLOW):
        estimate_memory_stages(spec, **options)
    # In a grid, the cell is invalid with that reason, next to the same layout with a sane
    # value, which stays valid.
    grid = estimate_memory_grid(spec, **{**options, name: [value, sane]})
    assert grid.valid.tolist() == [False, True]
    assert grid.reasons()[0].startswith(OVERFLOW)
    assert np.isnan(grid.to_dict()["total"][0])
    assert grid.fits(1e308).tolist() == [False, grid.total[1] <= 1e308]


#: A huge finite number: the largest float, or m x 10^e with e from 16 (whole) to 308.
huge = st.one_of(
    st.just(sys.float_info.max),
    st.builds(
        lambda m, e: min(m * 10.0**e, sys.float_info.max),
        st.floats(1, 1.79),
        st.integers(16, 308),
    ),
)
#: Options that take unbounded numbers, at sane values (counts past 2^53 are whole floats).
UNBOUNDED = {
    "seq_len": 4096,
    "micro_batch": 1,
    "dp": 4,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "vpp": 1,
    "first_stage_layers": 0,
    "last_stage_layers": 0,
    "grad_accum_steps": 0,
    "overhead_bytes": 0,
    "moe_capacity_factor": 0,
}
#: Dense and MoE layouts with and without context, expert and pipeline parallelism,
#: recomputation, eager attention and the korthikanti model.
LAYOUTS = [
    {},
    {"cp": 2, "recompute": "full"},
    {"pp": 4, "pipeline_split": "auto", "recompute": "selective", "zero": 1},
    {"pp": 2, "pipeline_split": "auto", "attention": "eager", "tp": 2},
    {"activation_model": "korthikanti", "tp": 4, "sequence_parallel": True, "zero": 3},
]


@settings(max_examples=40, deadline=None)
@given(
    spec=st.sampled_from([LLAMA_8B, MIXTRAL, ModelSpec.preset("deepseek-v3")]),
    layout=st.sampled_from(LAYOUTS),
    changes=st.lists(st.tuples(st.sampled_from(list(UNBOUNDED)), huge), min_size=1, max_size=6),
)
def test_valid_cells_are_finite_over_huge_inputs(
    spec: ModelSpec, layout: dict[str, Any], changes: list[tuple[str, float]]
) -> None:
    base = {**UNBOUNDED, "ep": 2 if spec.is_moe else 1, **layout}
    # The base layout, then one huge input per cell.
    cells = [base, *({**base, name: value} for name, value in changes)]
    grid = estimate_memory_grid(spec, **{k: [cell[k] for cell in cells] for k in base})
    table = np.stack(list(grid.to_dict().values()))
    assert grid.valid[0]
    assert np.isfinite(table[:, grid.valid]).all()
    assert np.isnan(table[:, ~grid.valid]).all()
    for i, cell in enumerate(cells):
        if grid.valid[i]:
            assert estimate_memory(spec, **cell).total == grid.total[i]
            continue
        overflow = grid.reasons()[i].startswith(OVERFLOW)
        error = TokenBatchOverflowError if overflow else InvalidValueError
        with pytest.raises(error, match=re.escape(grid.reasons()[i])):
            estimate_memory(spec, **cell)


def test_plan_says_why_when_an_option_leaves_no_valid_layout() -> None:
    kwargs: dict[str, Any] = {"num_gpus": 32, "seq_len": 4096, "global_batch_tokens": 4096 * 64}
    assert plan_layouts(MIXTRAL, moe_capacity_factor=1.25, **kwargs)
    # Every layout's estimate overflows: the overflow error, not an empty plan.
    with pytest.raises(TokenBatchOverflowError, match=f"^{OVERFLOW}.*moe_capacity_factor=1e"):
        plan_layouts(MIXTRAL, moe_capacity_factor=1e308, **kwargs)
    # An option that no layout makes valid is named with its value.
    with pytest.raises(InvalidValueError, match=r"fused_swiglu must be a boolean.*=0\.5"):
        plan_layouts(LLAMA_8B, fused_swiglu=0.5, **kwargs)
    with pytest.raises(InvalidValueError, match=r"overhead_bytes.*overhead_bytes=-1"):
        plan_layouts(LLAMA_8B, overhead_bytes=-1, **kwargs)
    # A model that fits nowhere is still an empty plan, not an error.
    assert plan_layouts(LLAMA_8B, gpu_memory=1e9, **kwargs) == []


@pytest.mark.parametrize("name", ["master_weights", "fp32_grad_accum"])
def test_fp32_copy_options_are_booleans(name: str) -> None:
    n = LLAMA_8B.num_params()
    off, on = (estimate_memory(LLAMA_8B, seq_len=1024, **{name: flag}) for flag in (0, 1))
    assert on.model_states - off.model_states == 4 * n
    for same in (False, np.False_, 0.0):
        assert estimate_memory(LLAMA_8B, seq_len=1024, **{name: same}).total == off.total
    for same in (True, np.True_, 1.0):
        assert estimate_memory(LLAMA_8B, seq_len=1024, **{name: same}).total == on.total
    # Half a copy or two copies are not settings: refused, naming the option and its value.
    for bad in (0.5, 2, -1, math.nan, math.inf, 1e308):
        with pytest.raises(InvalidValueError, match=rf"fp32_grad_accum booleans \(got .*{name}="):
            estimate_memory(LLAMA_8B, seq_len=1024, **{name: bad})
    # In a grid, those cells are invalid with the same reason; the others are estimated.
    grid = estimate_memory_grid(LLAMA_8B, seq_len=1024, **{name: [True, 0.5, False, 2]})
    assert grid.valid.tolist() == [True, False, True, False]
    assert grid.total[0] == on.total
    assert grid.total[2] == off.total
    assert all("fp32_grad_accum booleans" in reason for reason in grid.reasons()[[1, 3]])


def test_max_micro_batch_tokens_is_the_largest_that_fits() -> None:
    memory = 80e9
    layout: dict[str, Any] = {"dp": 8, "zero": 1, "recompute": "selective"}
    tokens = max_micro_batch_tokens(LLAMA_8B, memory, multiple_of=128, **layout)
    assert tokens > 0
    assert tokens % 128 == 0
    assert estimate_memory(LLAMA_8B, seq_len=tokens, **layout).total <= memory
    assert estimate_memory(LLAMA_8B, seq_len=tokens + 128, **layout).total > memory
    assert max_micro_batch_tokens(LLAMA_8B, 1e9) == 0
    with pytest.raises(InvalidTypeError, match="seq_len"):
        max_micro_batch_tokens(LLAMA_8B, memory, seq_len=4096)
    # A bad option is named; the seq_len its message shows is the probe's, and said so.
    probe = r"tp must divide num_heads.*tp=3.*it tries \(seq_len=128\)"
    with pytest.raises(InvalidValueError, match=probe):
        max_micro_batch_tokens(LLAMA_8B, memory, multiple_of=128, tp=3)
    with pytest.raises(InvalidValueError, match=r"attention must be one of .*'x'$"):
        max_micro_batch_tokens(LLAMA_8B, memory, attention="x")


def test_context_parallel_padding_matches_the_packed_layout() -> None:
    # Load-balanced CP pads every sequence to a multiple of 2 * cp: 4097 tokens on cp = 4
    # cost what 4104 do, and a length that 2 * cp does not divide is no longer refused.
    cp4 = {"cp": 4, "dp": 2, "zero": 1}
    assert (
        estimate_memory(LLAMA_8B, seq_len=4097, **cp4).total
        == estimate_memory(LLAMA_8B, seq_len=4104, **cp4).total
        > estimate_memory(LLAMA_8B, seq_len=4096, **cp4).total
    )
    assert estimate_memory(LLAMA_8B, seq_len=4096, cp=3).activations > 0
    budget = max_micro_batch_tokens(LLAMA_8B, 80e9, multiple_of=128, **cp4)
    assert budget > 0
    assert budget % 128 == 0
    assert estimate_memory(LLAMA_8B, seq_len=budget, **cp4).total <= 80e9
    assert estimate_memory(LLAMA_8B, seq_len=budget + 128, **cp4).total > 80e9
    assert max_micro_batch_tokens(LLAMA_8B, 80e9, multiple_of=5, cp=3) % 30 == 0
    # The packer charges each document its length rounded up to 2 * cp, so every row of a
    # packing at this budget, padding included, fits the budget the estimate was made for.
    lengths = np.random.default_rng(0).integers(1, budget, 2000)
    packing = tokenbatch.pack(lengths, budget, pad_to_multiple_of=8)
    padded = -(-packing.lengths // 8) * 8
    rows = np.add.reduceat(padded, packing.bin_offsets[:-1])
    assert rows.max() <= budget
    longest = estimate_memory(LLAMA_8B, seq_len=int(rows.max()), **cp4)
    assert longest.total <= estimate_memory(LLAMA_8B, seq_len=budget, **cp4).total


def test_plan_ranks_plain_data_parallelism_first_for_a_small_model() -> None:
    layouts = plan_layouts(
        ModelSpec.preset("llama-3.2-1b"),
        num_gpus=8,
        gpu_memory=80e9,
        seq_len=4096,
        global_batch_tokens=4096 * 256,
    )
    best = layouts[0]
    assert (best.dp, best.tp, best.pp, best.cp) == (8, 1, 1, 1)
    assert best.recompute == "none"
    assert best.dp * best.micro_batch * best.grad_accum_steps * 4096 == 4096 * 256
    assert [x.step_time for x in layouts] == sorted(x.step_time for x in layouts)
    assert all(x.memory <= 0.9 * 80e9 for x in layouts)
    assert 0.0 < best.mfu < 0.6


def test_plan_shards_a_big_model_and_keeps_tensor_parallel_in_the_node() -> None:
    spec = ModelSpec.preset("llama-3.1-70b")
    layouts = plan_layouts(
        spec, num_gpus=64, gpu_memory=80e9, seq_len=8192, global_batch_tokens=8192 * 512, top=None
    )
    assert layouts
    assert all(x.tp <= 8 for x in layouts)
    best = layouts[0]
    assert best.tp * best.pp > 1 or best.zero == 3
    check = estimate_memory(spec, seq_len=8192, **best.layout())
    assert check.total == best.memory
    assert (
        plan_layouts(spec, num_gpus=1, gpu_memory=80e9, seq_len=8192, global_batch_tokens=8192)
        == []
    )
    with pytest.raises(InvalidValueError, match="multiple of seq_len"):
        plan_layouts(spec, num_gpus=8, gpu_memory=80e9, seq_len=8192, global_batch_tokens=1000)


def test_cli_memory_and_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["memory", "llama-3.1-8b", "--dp", "8", "--zero", "1", "--gpu-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "optimizer" in out
    assert "fits in 74.5 GiB" in out
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_CONFIG))
    assert main(["memory", str(config), "--seq-len", "1024", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == estimate_memory(LLAMA_8B, seq_len=1024).total
    assert main(["plan", "llama-3.2-1b", "--gpus", "8", "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["rank", "dp", "tp"]
    assert len([line for line in lines if line[:1].isdigit()]) == 3
    # The options of issue 12's model reach the estimate and the planner.
    options = ["--implementation", "fused", "--loss", "fused", "--fp8", "--cp", "2"]
    options += ["--cp-comm", "all_gather", "--optimizer-offload", "0.5"]
    options += ["--optimizer-dtype", "bf16", "--mtp-layers", "1"]
    assert main(["memory", "deepseek-v3", "--dp", "4", "--ep", "8", "--json", *options]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = estimate_memory(
        ModelSpec.preset("deepseek-v3").replace(implementation="fused", mtp_layers=1),
        seq_len=4096,
        dp=4,
        ep=8,
        cp=2,
        loss="fused",
        fp8=True,
        cp_comm="all_gather",
        optimizer_offload=0.5,
        optimizer_dtype="bf16",
    )
    assert data["total"] == expected.total
    assert data["total"] != estimate_memory(ModelSpec.preset("deepseek-v3"), seq_len=4096).total
    assert main(["plan", "llama-3.2-1b", "--gpus", "8", "--hardware", "h200", "--top", "1"]) == 0
    assert "8 h200 GPUs x 140.4 GiB" in capsys.readouterr().out
    assert main(["memory", "llama-3.1-8b", "--tp", "3"]) == 2
    assert "tp must divide num_heads" in capsys.readouterr().err
    assert main(["memory", "no-such-model"]) == 2


def test_all_gather_dispatcher_keeps_its_sort_and_map_for_the_tensor_parallel_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Megatron-Core's all-gather dispatcher under tp = 2 with sequence parallelism: an int64
    # index per routed copy (top 2) and a byte and a bf16 probability per expert (8) of
    # every token of the group, half of them the other rank's, in each of the 32 MoE layers.
    all_to_all = MIXTRAL.replace(implementation="fused")
    all_gather = all_to_all.replace(moe_dispatcher="allgather")
    layout = {"seq_len": 4096, "tp": 2, "sequence_parallel": True}
    extra = (8 * 2 + 3 * 8) * 4096 // 2 * 32
    assert (
        estimate_memory(all_gather, **layout).activations
        == estimate_memory(all_to_all, **layout).activations + extra
    )
    # Without sequence parallelism each rank holds the whole sequence either way; the
    # model states do not depend on the dispatcher.
    gathered, sent = (
        estimate_memory(spec, seq_len=4096, tp=2) for spec in (all_gather, all_to_all)
    )
    assert (gathered.total, gathered.params, gathered.optimizer) == (
        sent.total,
        sent.params,
        sent.optimizer,
    )
    assert (
        "(fused kernels, allgather dispatcher)"
        in estimate_memory(all_gather, **layout).explanation()
    )
    # The command line's option reaches the spec.
    args = ["mixtral-8x7b", "--implementation", "fused", "--tp", "2", "--sequence-parallel"]
    assert main(["memory", *args, "--moe-dispatcher", "allgather", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == (
        estimate_memory(all_gather, **layout).total
    )
    assert main(["memory", "mixtral-8x7b", "--moe-dispatcher", "allgather"]) == 2
    assert "needs implementation='fused'" in capsys.readouterr().err


def test_cli_recompute_modes(capsys: pytest.CaptureFixture[str]) -> None:
    fused = ["--implementation", "fused", "--json"]
    assert main(["memory", "llama-3.1-8b", "--recompute", "core_attn", *fused]) == 0
    spec = LLAMA_8B.replace(implementation="fused")
    expected = estimate_memory(spec, seq_len=4096, recompute="core_attn")
    assert json.loads(capsys.readouterr().out)["total"] == expected.total
    assert expected.total > estimate_memory(spec, seq_len=4096, recompute="selective").total
    # The planner considers the modes named, and only those.
    plan_args = ["plan", "--gpus", "8", "--gpu-memory", "40GB", "--top", "50"]
    # Comma-separated, so that the model may follow the option.
    assert main([*plan_args, "--recompute", "core_attn,Full", "llama-3.1-8b", *fused]) == 0
    modes = {layout["recompute"] for layout in json.loads(capsys.readouterr().out)}
    assert modes == {"core_attn", "full"}
    with pytest.raises(SystemExit):
        main([*plan_args, "llama-3.1-8b", "--recompute", "none,partial"])
    assert "unknown recomputation mode 'partial'" in capsys.readouterr().err
    # Megatron-Core's modules, joined with "+", in both commands.
    assert main(["memory", "llama-3.1-8b", "--recompute", "MLP+core_attn", *fused]) == 0
    expected = estimate_memory(spec, seq_len=4096, recompute="core_attn+mlp")
    assert json.loads(capsys.readouterr().out)["total"] == expected.total
    assert main([*plan_args, "--recompute", "core_attn+mlp,full", "llama-3.1-8b", *fused]) == 0
    modes = {layout["recompute"] for layout in json.loads(capsys.readouterr().out)}
    assert modes == {"core_attn+mlp", "full"}
    with pytest.raises(SystemExit):
        main(["memory", "llama-3.1-8b", "--recompute", "mlp+moe_acts"])
    assert "unknown recomputation mode 'mlp+moe_acts'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "flags", "options"),
    [
        # Llama 3.1 405B's published stages: 7 + 14 x 8 + 7 (Dubey et al. 2024, 3.3.2).
        (
            "llama-3.1-405b",
            ["--first-stage-layers", "7", "--last-stage-layers", "7"],
            {"first_stage_layers": 7, "last_stage_layers": 7},
        ),
        # One end given, the other stages splitting the rest: 6 + 15 x 8.
        ("llama-3.1-405b", ["--first-stage-layers", "6"], {"first_stage_layers": 6}),
        ("llama-3.1-405b", ["--pipeline-split", "embedding_and_loss"], {}),
        # DeepSeek-V3's 61 layers: 3 + 14 x 4 + 2.
        ("deepseek-v3", ["--pipeline-split", "auto", "--ep", "64"], {"ep": 64}),
    ],
)
def test_cli_memory_takes_explicit_pipeline_stages(
    model: str, flags: list[str], options: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    layout = ["--seq-len", "8192", "--tp", "8", "--pp", "16", "--dp", "128", "--zero", "1"]
    assert main(["memory", model, *layout, *flags, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    if "--pipeline-split" in flags:
        options["pipeline_split"] = flags[flags.index("--pipeline-split") + 1]
    spec = ModelSpec.preset(model)
    layout_options = {"tp": 8, "pp": 16, "dp": 128, "zero": 1}
    expected = estimate_memory(spec, seq_len=8192, **layout_options, **options)
    assert data == {"model": spec.name, **expected.to_dict()}
    # The stages are those asked for (not the even split, which 126 and 61 layers lack).
    stages = estimate_memory_stages(spec, seq_len=8192, **layout_options, **options)
    first, last = options.get("first_stage_layers"), options.get("last_stage_layers")
    assert first in (None, stages[0].layers)
    assert last in (None, stages[-1].layers)
    assert sum(x.layers for x in stages) == spec.num_layers
    with pytest.raises(InvalidValueError, match="do not split over pp"):
        estimate_memory(spec, seq_len=8192, **layout_options)
    # The planner chooses the stages itself.
    with pytest.raises(InvalidTypeError, match="plan chooses"):
        plan_layouts(spec, num_gpus=8, seq_len=8192, global_batch_tokens=8192 * 8, **options)


def test_public_names() -> None:
    for name in (
        "ModelSpec",
        "MemoryEstimate",
        "estimate_memory",
        "estimate_memory_grid",
        "max_micro_batch_tokens",
        "plan_layouts",
        "profile",
    ):
        assert name in tokenbatch.__all__


layouts = st.fixed_dictionaries(
    {
        "seq_len": st.sampled_from([512, 2048, 8192]),
        "micro_batch": st.integers(1, 4),
        "dp": st.sampled_from([1, 2, 8]),
        "tp": st.sampled_from([1, 2, 4, 8, 16]),
        "pp": st.sampled_from([1, 2, 4, 3]),
        "cp": st.sampled_from([1, 2]),
        "zero": st.integers(0, 3),
        "recompute": st.sampled_from(
            ["none", "selective", "full", "core_attn", "core_attn+mlp", "moe+layernorm"]
        ),
        "sequence_parallel": st.booleans(),
        "activation_model": st.sampled_from(["modern", "korthikanti"]),
    }
)


@settings(max_examples=60, deadline=None)
@given(layout=layouts)
def test_grid_cell_equals_scalar_and_more_tokens_cost_more(layout: dict[str, Any]) -> None:
    grid = estimate_memory_grid(LLAMA_8B, **{k: [v] for k, v in layout.items()})
    if not grid.valid[0]:
        with pytest.raises(InvalidValueError, match=re.escape(str(grid.reasons()[0]))):
            estimate_memory(LLAMA_8B, **layout)
        return
    one = estimate_memory(LLAMA_8B, **layout)
    assert grid.valid[0]
    assert grid.total[0] == one.total
    assert one.total == one.params + one.grads + one.optimizer + one.activations
    bigger = estimate_memory(LLAMA_8B, **{**layout, "micro_batch": layout["micro_batch"] + 1})
    assert bigger.activations > one.activations
    assert bigger.model_states == one.model_states


def test_an_estimate_is_immutable_and_compares_by_its_numbers() -> None:
    estimate = estimate_memory(LLAMA_8B, seq_len=4096, tp=2, recompute="selective")
    with pytest.raises(AttributeError, match="immutable"):
        estimate.total = 0  # type: ignore[misc]
    assert estimate == estimate_memory(LLAMA_8B, seq_len=4096, tp=2, recompute="selective")
    assert estimate != estimate_memory(LLAMA_8B, seq_len=4096, tp=4, recompute="selective")
    # The options as given, with every default filled in; the inputs the core used.
    assert estimate.options["tp"] == 2
    assert estimate.options["dp"] == 1
    assert estimate.inputs["tp"] == 2.0
    assert estimate.inputs["param_bytes"] == 2.0
    assert sum(estimate.activation_parts.values()) == pytest.approx(estimate.activations, abs=9)
    assert f"total={estimate.total}" in repr(estimate)
    with pytest.raises(TypeError, match="unhashable"):
        hash(estimate)
    # Pickled (a process pool's result) and copied whole.
    assert pickle.loads(pickle.dumps(estimate)) == estimate
    assert copy.deepcopy(estimate) == estimate
    assert copy.deepcopy(estimate).options == estimate.options
