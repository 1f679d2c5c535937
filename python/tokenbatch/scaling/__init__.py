"""Scaling laws for choosing the batch size instead of guessing it, and a launch plan.

* :class:`ThreeTermLaw`: ``L(N, M, K) = E + A / N^alpha + B / M^beta + C / K^gamma`` with
  ``N`` parameters, ``M`` the batch in tokens and ``K`` optimizer steps (tokens
  ``D = M K``), fitted robustly to runs that include suboptimal batch sizes; its batch
  terms :class:`BatchLaw` give the loss-optimal batch for a token budget, the range of
  near-optimal batches (Schaipp's definition, or in extra tokens), the critical batch on
  the law's own steps-tokens trade-off (and McCandlish's), and the fewest steps and tokens
  that reach a target loss.
* Published laws as data (:data:`LAWS`: coefficients, units, fitted ranges, source):
  Schaipp's three-term law (:meth:`BatchLaw.published`), :func:`step_law`,
  :func:`deepseek_llm`, :func:`kaplan_critical_batch`, and McCandlish et al.'s trade-off
  :func:`mccandlish_tradeoff`; each warns with :class:`ExtrapolationWarning` outside the
  data it was fitted on.
* :func:`launch_plan`: from a model, a token budget and a cluster to a :class:`LaunchPlan`:
  the batch per step, a ramp shaped by the law's critical batch, the parallel layout and
  micro-batch that fit memory, gradient accumulation and learning rate per stage, and the
  schedule as a sampler ``schedule=`` and as Megatron-LM arguments.
* :func:`recommend`: a batch size from Step Law or DeepSeek LLM and a rule-of-thumb ramp.

Only numpy is needed: the fit is a Levenberg-Marquardt iteration on the Huber loss of
log-loss residuals (iteratively reweighted), started from several points.
"""

from __future__ import annotations

from tokenbatch.scaling.batch_law import BatchLaw, RangeDefinition
from tokenbatch.scaling.launch import LaunchPlan, LaunchStage, launch_plan
from tokenbatch.scaling.published import (
    LAWS,
    ExtrapolationWarning,
    LawInfo,
    deepseek_llm,
    kaplan_critical_batch,
    mccandlish_tradeoff,
    step_law,
)
from tokenbatch.scaling.recommend import Recommendation, recommend
from tokenbatch.scaling.three_term import ThreeTermLaw

__all__ = [
    "LAWS",
    "BatchLaw",
    "ExtrapolationWarning",
    "LaunchPlan",
    "LaunchStage",
    "LawInfo",
    "RangeDefinition",
    "Recommendation",
    "ThreeTermLaw",
    "deepseek_llm",
    "kaplan_critical_batch",
    "launch_plan",
    "mccandlish_tradeoff",
    "recommend",
    "step_law",
]
