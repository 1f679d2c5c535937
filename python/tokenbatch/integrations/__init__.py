"""Drop-in integrations of the token-budget sampler with the trainers people use.

Each module imports its framework, so import the one you need:

* :mod:`tokenbatch.integrations.accelerate`: ``prepare_data_loader`` for custom loops on
  Accelerate (the ``hf`` extra);
* :mod:`tokenbatch.integrations.transformers`: ``TokenBudgetTrainer``, a Hugging Face
  ``Trainer`` that trains on token-budget micro-batches (the ``hf`` extra);
* :mod:`tokenbatch.integrations.trl`: ``TokenBudgetSFTTrainer``, the same for TRL's
  ``SFTTrainer`` (the ``trl`` extra);
* :mod:`tokenbatch.integrations.lightning`: ``TokenBudgetCallback`` for PyTorch Lightning
  (the ``lightning`` extra).

torchdata's ``StatefulDataLoader`` needs no adapter: the sampler follows its ``Stateful``
protocol (see ``docs/trainers.md``).
"""
