"""The evaluation options of the trainer integrations refuse bad input clearly."""

from __future__ import annotations

import pytest

from tokenbatch import InvalidTypeError, InvalidValueError
from tokenbatch.integrations._source import build_evaluation_sampler, check_evaluation_source
from tokenbatch.integrations.lightning import TokenBudgetCallback
from tokenbatch.integrations.transformers import TokenBudgetTrainer
from tokenbatch.torch import EvaluationBatchSampler, TokenBudgetBatchSampler


def sampler() -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler([3, 4, 5], 16, num_replicas=1, rank=0)


def test_an_evaluation_source_must_be_a_sampler_or_a_function() -> None:
    check_evaluation_source(None, "x")
    check_evaluation_source(lambda: None, "x")
    with pytest.raises(InvalidTypeError, match="eval_batch_sampler must be"):
        check_evaluation_source(3, "x")
    with pytest.raises(InvalidTypeError, match="eval_batch_sampler must be"):
        TokenBudgetTrainer(batch_sampler=sampler(), eval_batch_sampler="eval")
    with pytest.raises(InvalidTypeError, match="eval_batch_sampler must be"):
        TokenBudgetCallback(sampler(), eval_batch_sampler=[3, 4])  # type: ignore[arg-type]


def test_an_evaluation_function_must_return_a_sampler() -> None:
    built = EvaluationBatchSampler([3, 4], 16, num_replicas=1, rank=0)
    assert build_evaluation_sampler(built) is built
    assert build_evaluation_sampler(lambda n: built, 1) is built
    with pytest.raises(InvalidTypeError, match="must return an EvaluationBatchSampler"):
        build_evaluation_sampler(lambda: sampler())


def test_the_callbacks_evaluation_is_refused_before_setup_and_outside_validation() -> None:
    budget = TokenBudgetCallback(sampler())
    with pytest.raises(InvalidValueError, match="no evaluation sampler"):
        budget.eval_sampler  # noqa: B018
    with pytest.raises(InvalidValueError, match="validation_step"):
        budget.add_eval_batch(None, {})
