"""Megatron-Core's GPT models trained one step tensor- or expert-parallel on CPU (gloo),
each rank measured against ``implementation="fused"`` (tests/runs/megatron_cpu.py):
``torchrun --nproc_per_node=2 megatron_parallel.py OUT --tp 2 --sp dense:none mla:full``.

Every rank writes ``OUT/rank<r>.json``: per ``model:recompute`` case its measured
weights, gradients, optimizer states and saved activations, the estimate's, and what the
local spec keeps beyond the fused modules.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    from megatron_cpu import local_spec_extra, measure, megatron_on_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--sp", action="store_true", help="sequence parallelism")
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("cases", nargs="+", help="model:recompute")
    args = parser.parse_args()
    records: dict[str, dict[str, Any]] = {}
    warnings.simplefilter("ignore")  # Megatron-Core's warnings about its own defaults
    with megatron_on_cpu(tp=args.tp, ep=args.ep):
        for case in args.cases:
            model_name, recompute = case.split(":")
            measured, estimate = measure(recompute, model_name, tp=args.tp, sp=args.sp, ep=args.ep)
            extra = local_spec_extra(recompute, model_name, tp=args.tp, sp=args.sp)
            records[case] = {
                "measured": [
                    measured.params,
                    measured.grads,
                    measured.optimizer,
                    measured.activations,
                ],
                "estimate": [
                    estimate.params,
                    estimate.grads,
                    estimate.optimizer,
                    estimate.saved_activations,
                ],
                "extra": extra,
            }
    rank = int(os.environ["RANK"])
    (args.out / f"rank{rank}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
