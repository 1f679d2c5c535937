"""Measure what a real PyTorch training step holds, to check the estimates against.

``torch`` is imported when :func:`profile` runs, so ``tokenbatch`` imports without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from tokenbatch.errors import InvalidTypeError, InvalidValueError

if TYPE_CHECKING:
    import torch

__all__ = ["ProfileResult", "master_weight_adamw", "profile"]


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """Bytes measured during one training step of a module.

    ``params``, ``grads`` and ``optimizer`` count tensor storages once each. ``optimizer``
    holds the optimizer's non-scalar state tensors (moments...) plus the tensors it updates
    that are not the module's parameters (fp32 master weights); the 0-dimensional ``step``
    counters are left out. ``activations`` is the bytes of the storages saved for backward
    during the forward pass (``torch.autograd.graph.saved_tensors_hooks``), deduplicated by
    storage and excluding the parameters themselves; ``saved_tensors`` counts the tensors
    saved. On CUDA, ``peak_allocated`` is ``torch.cuda.max_memory_allocated`` over the step
    (None on other devices).
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    saved_tensors: int
    peak_allocated: int | None
    device: str


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _storage_bytes(tensors: Iterable[torch.Tensor], exclude: set[tuple[str, int]]) -> int:
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in tensors:
        key = _storage_key(tensor)
        if key in seen or key in exclude:
            continue
        seen.add(key)
        total += tensor.untyped_storage().nbytes()
    return total


def master_weight_adamw(
    model: torch.nn.Module, **adamw_options: Any
) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """AdamW over fp32 master copies of ``model``'s (low-precision) parameters.

    The optimizer setup :func:`~tokenbatch.estimate_memory` assumes by default and
    Megatron-LM runs: weights and gradients in the model's dtype, fp32 master weights and
    fp32 moments in the optimizer. Returns the optimizer and a ``step()`` that copies the
    gradients to the master weights, steps, and copies the weights back; pass both to
    :func:`profile` (``optimizer=``, ``optimizer_step=``). ``adamw_options`` go to
    ``torch.optim.AdamW``.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    master = [p.detach().float().clone() for p in params]
    optimizer = torch.optim.AdamW(master, **adamw_options)

    def step() -> None:
        for copy, param in zip(master, params, strict=True):
            copy.grad = None if param.grad is None else param.grad.float()
        optimizer.step()
        with torch.no_grad():
            for copy, param in zip(master, params, strict=True):
                copy.grad = None
                param.copy_(copy)

    return optimizer, step


def profile(
    model: torch.nn.Module,
    inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_step: Callable[[], None] | None = None,
) -> ProfileResult:
    """Run one training step of ``model`` on ``inputs`` and measure its memory.

    ``inputs`` is passed as ``model(*inputs)`` for a tuple or list, ``model(**inputs)``
    for a mapping and ``model(inputs)`` otherwise. ``loss_fn(output)`` gives the scalar
    loss (default: the output itself). After ``backward``, ``optimizer_step()`` runs when
    given (e.g. a mixed-precision step that copies gradients to fp32 master weights),
    else ``optimizer.step()``. Gradients are left on the parameters.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    parameters = [p for p in model.parameters()]
    if not parameters:
        raise InvalidValueError("model has no parameters")
    device = parameters[0].device
    cuda = device.type == "cuda"
    for p in parameters:
        p.grad = None
    param_keys = {_storage_key(p) for p in parameters}
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)

    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        if isinstance(inputs, (tuple, list)):
            output = model(*inputs)
        elif isinstance(inputs, Mapping):
            output = model(**inputs)
        else:
            output = model(inputs)
        loss = output if loss_fn is None else loss_fn(output)
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise InvalidValueError(
            "the loss (model output or loss_fn(output)) must be a scalar tensor"
        )
    activations = _storage_bytes((t for t in saved if t.numel() > 0), param_keys)
    count = len(saved)
    saved.clear()
    cast(Any, loss).backward()
    grads = _storage_bytes((p.grad for p in parameters if p.grad is not None), set())
    if optimizer_step is not None:
        optimizer_step()
    elif optimizer is not None:
        optimizer.step()
    optimizer_bytes = 0
    if optimizer is not None:
        state_tensors = [
            value
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0
        ]
        held = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer_bytes = _storage_bytes([*state_tensors, *held], param_keys)
    peak = None
    if cuda:
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device))
    return ProfileResult(
        params=_storage_bytes(parameters, set()),
        grads=grads,
        optimizer=optimizer_bytes,
        activations=activations,
        saved_tensors=count,
        peak_allocated=peak,
        device=str(device),
    )
