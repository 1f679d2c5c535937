"""The private hook of Accelerate (checked on 1.12 to 1.x).

``Accelerator.prepare_data_loader`` shards every batch sampler over the processes, and
Accelerate documents no option for a batch sampler that is already rank-aware, so
:func:`tokenbatch.integrations.accelerate.prepare_data_loader` prepares the loader with
Accelerate's documented ``accelerate.data_loader.prepare_data_loader`` for one process
instead. What ``Accelerator.prepare_data_loader`` does besides is to record the loader in
``Accelerator._dataloaders``, whose loaders ``accelerator.save_state`` and
``load_state`` save and restore (the position of a ``use_stateful_dataloader`` loader).
"""

from __future__ import annotations

from typing import Any

from tokenbatch.integrations._compat import Hook


def _accelerator() -> object:
    from accelerate import Accelerator

    return Accelerator(cpu=True)


DATALOADERS = Hook(
    "accelerate",
    "accelerate:Accelerator",
    "_dataloaders",
    "record a prepared loader for accelerator.save_state and load_state",
    probe=_accelerator,
)
HOOKS = (DATALOADERS,)


def track_data_loader(accelerator: Any, loader: Any) -> None:
    """Record ``loader`` as ``accelerator.prepare_data_loader`` records the loaders it
    prepares."""
    DATALOADERS.get(accelerator).append(loader)
