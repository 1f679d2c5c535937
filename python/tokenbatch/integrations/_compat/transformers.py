"""The private hooks of transformers (checked on 4.57 to 5.x).

``Trainer.get_train_dataloader`` is the documented place to give a Trainer other
training batches, but the Trainer drops the columns the model's ``forward`` does not take
(``remove_unused_columns=True``) inside its own loader construction, in two private
methods with no public equivalent. The token-budget Trainer builds its loader with them,
so that the columns it trains on are exactly the Trainer's.
"""

from __future__ import annotations

from typing import Any

from tokenbatch.integrations._compat import Hook

REMOVE_UNUSED_COLUMNS = Hook(
    "transformers",
    "transformers:Trainer",
    "_remove_unused_columns",
    "drop the columns of a datasets.Dataset the model does not take",
)
COLLATOR_WITH_REMOVED_COLUMNS = Hook(
    "transformers",
    "transformers:Trainer",
    "_get_collator_with_removed_columns",
    "drop the columns of other datasets' items the model does not take",
)
HOOKS = (REMOVE_UNUSED_COLUMNS, COLLATOR_WITH_REMOVED_COLUMNS)


def training_data(trainer: Any, dataset: Any, collator: Any, is_hf_dataset: bool) -> Any:
    """``(dataset, collator)`` with the model's unused columns removed, as the Trainer
    removes them from its own training loader."""
    if is_hf_dataset:
        return REMOVE_UNUSED_COLUMNS.get(trainer)(dataset, description="training"), collator
    return dataset, COLLATOR_WITH_REMOVED_COLUMNS.get(trainer)(collator, description="training")
