"""The step-time model's fitted constants, written by ``docs/gen_step_time_validation.py --fit``.

Fitted once, together, by least squares on the relative error of predicted tokens per
second per GPU over 19 published runs (``docs/step_time_runs.csv``): Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
table 1 (GPT 1.7B to 1T on A100), and Megatron-LM's README weak-scaling table of
Megatron-Core r0.8.0 on H100 (1.7B to 462B). Nothing here is per model or per GPU.
"""

from __future__ import annotations

__all__ = ["LAYER_PASS_OVERHEAD", "MATMUL_EFFICIENCY"]

#: Fraction of the dense peak that large matmuls and the attention core reach.
MATMUL_EFFICIENCY = 0.648

#: Seconds of fixed cost per pass (forward or backward) of one layer over one
#: micro-batch: kernel launches and synchronizations.
LAYER_PASS_OVERHEAD = 0.000374
