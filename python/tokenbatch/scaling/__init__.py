"""Scaling laws for the batch size and learning rate, published runs, and launch plans.

* :class:`ThreeTermLaw` (``L(N, M, K) = E + A/N^alpha + B/M^beta + C/K^gamma``), its robust
  fit and its batch terms :class:`BatchLaw`: optimal, near-optimal and critical batches.
* Published laws as data (:data:`LAWS`) and as functions, each warning with
  :class:`ExtrapolationWarning` outside the data it was fitted on; published runs as data
  (:data:`PUBLISHED_RUNS`).
* :func:`launch_plan`: from a model, a token budget and a cluster to a :class:`LaunchPlan`
  (every law's value with the one chosen, the batch ramp, layout, learning rates and
  launcher arguments); :func:`recommend`: one law's batch and a rule-of-thumb ramp.
"""

from __future__ import annotations

from tokenbatch.scaling.batch_law import BatchLaw, RangeDefinition
from tokenbatch.scaling.launch import launch_plan
from tokenbatch.scaling.published import (
    LAWS,
    ExtrapolationWarning,
    LawInfo,
    deepseek_llm,
    kaplan_critical_batch,
    kaplan_loss,
    mccandlish_tradeoff,
    porian_law,
    step_law,
)
from tokenbatch.scaling.recommend import Recommendation, recommend
from tokenbatch.scaling.result import LaunchPlan, LaunchStage
from tokenbatch.scaling.runs import PUBLISHED_RUNS, PublishedRun
from tokenbatch.scaling.spread import LawEstimate, RunScale, Spread
from tokenbatch.scaling.three_term import ThreeTermLaw

__all__ = [
    "LAWS",
    "PUBLISHED_RUNS",
    "BatchLaw",
    "ExtrapolationWarning",
    "LaunchPlan",
    "LaunchStage",
    "LawEstimate",
    "LawInfo",
    "PublishedRun",
    "RangeDefinition",
    "Recommendation",
    "RunScale",
    "Spread",
    "ThreeTermLaw",
    "deepseek_llm",
    "kaplan_critical_batch",
    "kaplan_loss",
    "launch_plan",
    "mccandlish_tradeoff",
    "porian_law",
    "recommend",
    "step_law",
]
