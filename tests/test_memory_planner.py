"""The planner against published training layouts, and its step-time model's properties.

Published runs (inputs are what the papers state; the model is not told the answers):

* DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sections 3.2-3.3 and 4.2):
  2,048 H800 GPUs, 15,360 sequences of 4,096 tokens per step, FP8 mixed precision, AdamW
  moments in BF16, one multi-token-prediction module, DualPipe overlapping the all-to-all
  with computation, node-limited routing with deduplicated dispatch; trained with 16-way
  pipeline, 64-way expert parallelism over 8 nodes and ZeRO-1 data parallelism, no tensor
  parallelism, recomputing the RMSNorms and the MLA up-projections in backward (3.2.3).
* Llama 3.1 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.2 and
  table 4): 16,384 H100 GPUs, 16M tokens per step; TP8 x CP1 x PP16 x DP128 at 8,192
  tokens, TP8 x CP16 x PP16 x DP8 at 131,072 tokens; all-gather context parallelism, FP32
  gradient accumulation and reduction.
"""

from __future__ import annotations

from typing import Any

import pytest

from tokenbatch import InvalidTypeError, InvalidValueError, ModelSpec, estimate_memory, plan_layouts
from tokenbatch.memory import HARDWARE, Hardware, PlannedLayout

DEEPSEEK = ModelSpec.preset("deepseek-v3").replace(implementation="fused", mtp_layers=1)
LLAMA = ModelSpec.preset("llama-3.1-405b").replace(implementation="fused")
LLAMA_OPTIONS: dict[str, Any] = {"cp_comm": "all_gather", "grad_dtype": "fp32"}


def _deepseek_plan(**overrides: Any) -> list[PlannedLayout]:
    options: dict[str, Any] = {
        "num_gpus": 2048,
        "seq_len": 4096,
        "global_batch_tokens": 15_360 * 4096,
        "hardware": "h800",
        "fp8": True,
        "optimizer_dtype": "bf16",
        "overlap_ep_comm": True,
        "deduplicated_dispatch": True,
        "top": None,
    }
    return plan_layouts(DEEPSEEK, **{**options, **overrides})


def test_deepseek_v3_published_layout_ranks_in_the_top_five() -> None:
    layouts = _deepseek_plan()
    top = layouts[:5]
    assert any((x.pp, x.ep, x.zero, x.tp) == (16, 64, 1, 1) for x in top), [
        (x.dp, x.tp, x.pp, x.cp, x.ep, x.zero) for x in top
    ]
    assert not (layouts[0].zero == 3 and layouts[0].ep == 1)
    zero3_no_ep = [i for i, x in enumerate(layouts) if x.zero == 3 and x.ep == 1]
    assert zero3_no_ep
    assert zero3_no_ep[0] > 20
    # The all-to-all that DualPipe hides and node-limited dispatch shrinks is what makes
    # 64-way expert parallelism pay: without them it drops out of the top five.
    plain = _deepseek_plan(overlap_ep_comm=False, deduplicated_dispatch=False, top=5)
    assert not any((x.pp, x.ep) == (16, 64) for x in plain)


def test_deepseek_v3_with_its_own_recomputation_ranks_the_published_layout_first() -> None:
    # DeepSeek-V3 recomputes its RMSNorms and MLA up-projections in backward (section
    # 3.2.3), Megatron-Core's `layernorm` and `mla_up_proj`: offered that mode, the planner
    # ranks the published layout itself first, DP128 x PP16 x EP64, ZeRO-1, no TP, no CP.
    layouts = _deepseek_plan(recompute=["none", "layernorm+mla_up_proj", "selective", "full"])
    first = layouts[0]
    assert (first.dp, first.tp, first.pp, first.cp, first.ep, first.zero) == (
        128,
        1,
        16,
        1,
        64,
        1,
    )
    assert first.recompute == "layernorm+mla_up_proj"
    # Within the 90% of an H800's 79.6 GiB that the planner fills.
    assert first.memory <= 0.9 * HARDWARE["h800"].memory


def _llama_plan(seq_len: int) -> list[PlannedLayout]:
    return plan_layouts(
        LLAMA,
        num_gpus=16_384,
        seq_len=seq_len,
        global_batch_tokens=16 * 2**20,
        hardware="h100",
        top=5,
        **LLAMA_OPTIONS,
    )


def test_llama_405b_published_layouts_rank_in_the_top_five() -> None:
    short = [(x.tp, x.pp, x.dp, x.cp) for x in _llama_plan(8192)]
    assert (8, 16, 128, 1) in short, short
    long = [(x.tp, x.pp, x.dp, x.cp) for x in _llama_plan(131_072)]
    assert (8, 16, 8, 16) in long, long
    # At 128K tokens every layout in the top five shards the sequence.
    assert all(cp >= 16 for _, _, _, cp in long)


def test_planned_layouts_fit_and_explain_their_time() -> None:
    layouts = _llama_plan(8192)
    for layout in layouts:
        estimate = estimate_memory(LLAMA, seq_len=8192, **layout.layout())
        assert estimate.total == layout.memory
        assert layout.memory <= 0.9 * HARDWARE["h100"].memory
        assert layout.step_time == pytest.approx(sum(layout.time_parts.values()))
        assert layout.dp * layout.tp * layout.pp * layout.cp == 16_384
        assert sum(layout.stage_layers) == 126
        assert len(layout.stage_layers) == layout.pp
    text = layouts[0].explain()
    for word in ("bubble", "tp_comm", "dp_comm", "MFU", "layers per stage", "h100"):
        assert word in text
    assert [x.step_time for x in layouts] == sorted(x.step_time for x in layouts)
    distinct = {(x.dp, x.tp, x.pp, x.cp, x.ep) for x in layouts}
    assert len(distinct) == len(layouts)


def test_more_bandwidth_or_flops_never_slows_a_layout() -> None:
    spec = ModelSpec.preset("mixtral-8x7b").replace(implementation="fused")
    common: dict[str, Any] = {
        "num_gpus": 64,
        "seq_len": 4096,
        "global_batch_tokens": 4096 * 256,
        "top": None,
        "distinct": False,
    }

    def times(**hardware: Any) -> dict[tuple[Any, ...], float]:
        return {
            (x.dp, x.tp, x.pp, x.vpp, x.cp, x.ep, x.zero, x.recompute, x.micro_batch): x.step_time
            for x in plan_layouts(spec, hardware=HARDWARE["h100"].replace(**hardware), **common)
        }

    base = times()
    for faster in (
        {"inter_node_bandwidth": 100e9},
        {"intra_node_bandwidth": 900e9},
        {"peak_flops": 1979e12},
        {"memory_bandwidth": 6.7e12},
    ):
        other = times(**faster)
        assert base.keys() == other.keys()
        assert all(other[k] <= base[k] * (1 + 1e-12) for k in base)
        assert any(other[k] < base[k] for k in base)


def test_hardware_presets_and_overrides() -> None:
    assert set(HARDWARE) == {"h100", "h800", "h200", "a100", "mi300x"}
    assert Hardware.preset("H800").intra_node_bandwidth < HARDWARE["h100"].intra_node_bandwidth
    small = ModelSpec.preset("llama-3.2-1b")
    kwargs: dict[str, Any] = {"num_gpus": 8, "seq_len": 4096, "global_batch_tokens": 4096 * 64}
    a100 = plan_layouts(small, hardware="a100", **kwargs)[0]
    h100 = plan_layouts(small, hardware="h100", **kwargs)[0]
    assert a100.step_time > h100.step_time
    assert a100.hardware == "a100"
    custom = HARDWARE["h100"].replace(name="h100-200g", inter_node_bandwidth=25e9)
    assert plan_layouts(small, hardware=custom, **kwargs)[0].hardware == "h100-200g"
    assert plan_layouts(small, gpu_memory=1e9, **kwargs) == []
    with pytest.raises(InvalidValueError, match="unknown hardware"):
        plan_layouts(small, hardware="tpu", **kwargs)
    with pytest.raises(InvalidTypeError, match="hardware"):
        plan_layouts(small, hardware=3, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="inter_node_bandwidth"):
        plan_layouts(small, inter_node_bandwidth=-1, **kwargs)
    with pytest.raises(InvalidValueError, match="memory_bandwidth"):
        HARDWARE["h100"].replace(memory_bandwidth=0)
    with pytest.raises(InvalidTypeError, match="plan chooses"):
        plan_layouts(small, vpp=2, **kwargs)
    with pytest.raises(InvalidTypeError, match="chooses first_stage_layers, pipeline_split, vpp"):
        plan_layouts(small, vpp=2, pipeline_split="even", first_stage_layers=1, **kwargs)


def test_recompute_names_the_modes_the_planner_considers() -> None:
    spec = ModelSpec.preset("llama-3.1-8b").replace(implementation="fused")
    kwargs: dict[str, Any] = {
        "num_gpus": 8,
        "seq_len": 8192,
        "global_batch_tokens": 8192 * 64,
        "gpu_memory": 40e9,
        "distinct": False,
        "top": None,
    }
    default = plan_layouts(spec, **kwargs)
    assert {x.recompute for x in default} == {"none", "selective", "full"}
    megatron = plan_layouts(spec, recompute=["none", "core_attn", "full"], **kwargs)
    assert {x.recompute for x in megatron} == {"none", "core_attn", "full"}

    # Megatron-Core's default keeps more than `selective` at the same time cost: a layout
    # that fits with it fits with `selective`, in less memory and the same time.
    def by_layout(layouts: list[PlannedLayout]) -> dict[tuple[Any, ...], PlannedLayout]:
        return {
            tuple(v for k, v in sorted(x.layout().items()) if k != "recompute"): x for x in layouts
        }

    selective = by_layout(plan_layouts(spec, recompute="selective", **kwargs))
    core_attn = by_layout(plan_layouts(spec, recompute="CORE_ATTN", **kwargs))
    assert len(core_attn) > 10
    assert set(core_attn) < set(selective)
    for key, layout in core_attn.items():
        assert layout.recompute == "core_attn"
        assert layout.memory > selective[key].memory
        assert layout.step_time == selective[key].step_time
        assert estimate_memory(spec, seq_len=8192, **layout.layout()).total == layout.memory
    # Megatron-Core's modules in sets, named in any order and case: `mlp` recomputed
    # too keeps less and costs the MLP's forward pass again.
    with_mlp = by_layout(plan_layouts(spec, recompute="MLP+core_attn", **kwargs))
    assert set(core_attn) <= set(with_mlp)
    for key, layout in core_attn.items():
        assert with_mlp[key].recompute == "core_attn+mlp"
        assert with_mlp[key].memory < layout.memory
        assert with_mlp[key].step_time > layout.step_time
        assert estimate_memory(spec, seq_len=8192, **with_mlp[key].layout()).total == (
            with_mlp[key].memory
        )
    with pytest.raises(InvalidValueError, match="recompute modes must be none, selective, full"):
        plan_layouts(spec, recompute=["none", "selctive"], **kwargs)
    with pytest.raises(InvalidValueError, match=r"joined with '\+', got 'mlp\+'"):
        plan_layouts(spec, recompute="mlp+", **kwargs)
    with pytest.raises(InvalidValueError, match="at least one mode"):
        plan_layouts(spec, recompute=[], **kwargs)
    with pytest.raises(InvalidTypeError, match="recompute modes must be strings"):
        plan_layouts(spec, recompute=[1], **kwargs)  # type: ignore[list-item]
    for not_names in (3, b"none"):
        with pytest.raises(InvalidTypeError, match="recompute must be a mode name"):
            plan_layouts(spec, recompute=not_names, **kwargs)  # type: ignore[arg-type]
