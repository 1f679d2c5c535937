"""What an estimate returns: one configuration's breakdown, or a grid's columns."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from tokenbatch.errors import InvalidValueError
from tokenbatch.memory.options import OUTPUT_FIELDS, REASON_MESSAGES
from tokenbatch.memory.spec import ModelSpec

__all__ = ["MemoryEstimate", "MemoryGrid"]

_F64 = npt.NDArray[np.float64]


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of one configuration, in bytes, on the busiest pipeline stage.

    ``stage`` is that stage's index and ``layers`` the transformer layers it holds.

    ``total = params + grads + optimizer + activations + overhead``. ``activation_parts``
    says what activations are made of: ``attention``, ``mlp`` and ``norm`` blocks of the
    layers in flight, ``embedding`` (first stage), ``logits`` (last stage),
    ``checkpoints`` (layer inputs kept by full recomputation), ``working`` (one layer
    rebuilt during backward), ``comm`` (expert-parallel all-to-all and context-parallel
    key/value buffers of one layer) and ``mtp`` (multi-token-prediction modules, last
    stage). ``cpu_optimizer`` is the optimizer state offloaded to CPU memory, not in
    ``total``. ``options`` are the options as given (defaults filled in);
    ``inputs`` are the numbers the core computed with (bytes per element of each dtype,
    optimizer state bytes, codes of named choices), keyed by the core's field names.
    """

    spec: ModelSpec
    options: dict[str, Any]
    inputs: dict[str, float]
    params: int
    grads: int
    optimizer: int
    activations: int
    overhead: int
    total: int
    activation_parts: dict[str, int]
    stage: int
    layers: int
    cpu_optimizer: int

    @property
    def model_states(self) -> int:
        """Weights, gradients and optimizer state."""
        return self.params + self.grads + self.optimizer

    @property
    def saved_activations(self) -> int:
        """Activations saved for backward when the forward passes end: ``activations``
        without the transient ``working`` set of full recomputation and ``comm`` buffers.
        This is what :func:`~tokenbatch.profile` measures (``ProfileResult.activations``)."""
        parts = self.activation_parts
        return self.activations - parts["working"] - parts["comm"]

    def fits(self, gpu_memory: float) -> bool:
        """Whether ``total`` is at most ``gpu_memory`` bytes."""
        return self.total <= gpu_memory

    def to_dict(self) -> dict[str, Any]:
        """The numbers as a flat dict (bytes)."""
        result: dict[str, Any] = {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
            "stage": self.stage,
            "layers": self.layers,
            "cpu_optimizer": self.cpu_optimizer,
        }
        result.update({f"act_{k}": v for k, v in self.activation_parts.items()})
        return result

    def explanation(self) -> str:
        """The breakdown as text, with the formula and source of each line."""
        from tokenbatch.memory.explain import explain

        return explain(self)

    def explain(self, file: TextIO | None = None) -> None:
        """Print :meth:`explanation` (to ``file``, default standard output)."""
        print(self.explanation(), file=sys.stdout if file is None else file)


class MemoryGrid:
    """Estimates over a broadcast grid: every field is a read-only float64 array of ``shape``.

    Invalid cells hold NaN; ``valid`` marks the others, ``reason_code`` (uint8, 0 for a
    valid cell) says which check failed and :meth:`reasons` says it in words. Each field is
    a contiguous array. Fields: ``params``, ``grads``, ``optimizer``, ``activations``,
    ``overhead``, ``total``, ``act_attention``, ``act_mlp``, ``act_norm``,
    ``act_embedding``, ``act_logits``, ``act_checkpoints``, ``act_working`` (bytes),
    ``stage`` and ``layers`` (the busiest stage and its transformer layers).
    """

    def __init__(
        self,
        spec: ModelSpec,
        shape: tuple[int, ...],
        table: _F64,
        reason_code: npt.NDArray[np.uint8],
    ) -> None:
        table.flags.writeable = False
        reason_code.flags.writeable = False
        self.spec = spec
        self.shape = shape
        # One contiguous row per field: a field is a view, and a reduction over it reads
        # only its own bytes.
        self._table = table
        self.reason_code = reason_code
        self.valid: npt.NDArray[np.bool_] = reason_code == 0
        self.valid.flags.writeable = False

    def field(self, name: str) -> _F64:
        """One output column as an array of ``shape`` (a view, no copy)."""
        if name not in OUTPUT_FIELDS:
            raise InvalidValueError(f"unknown field {name!r}; fields: {', '.join(OUTPUT_FIELDS)}")
        column: _F64 = self._table[OUTPUT_FIELDS.index(name)].reshape(self.shape)
        return column

    params = property(lambda self: self.field("params"), doc="Weight bytes per GPU.")
    grads = property(lambda self: self.field("grads"), doc="Gradient bytes per GPU.")
    optimizer = property(lambda self: self.field("optimizer"), doc="Optimizer state bytes.")
    activations = property(lambda self: self.field("activations"), doc="Activation bytes.")
    overhead = property(lambda self: self.field("overhead"), doc="Constant overhead bytes.")
    total = property(lambda self: self.field("total"), doc="Total bytes per GPU.")
    stage = property(lambda self: self.field("stage"), doc="Busiest pipeline stage.")
    layers = property(lambda self: self.field("layers"), doc="Layers of the busiest stage.")

    @property
    def size(self) -> int:
        """Number of cells."""
        return int(np.prod(self.shape))

    def fits(self, gpu_memory: float | npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Valid cells whose total is at most ``gpu_memory`` bytes."""
        result: npt.NDArray[np.bool_] = self.valid & (self.total <= np.asarray(gpu_memory))
        return result

    def reasons(self) -> npt.NDArray[np.str_]:
        """Why each cell is invalid (an empty string for valid cells)."""
        messages = np.asarray(["", *REASON_MESSAGES])
        result: npt.NDArray[np.str_] = messages[self.reason_code]
        return result

    def to_dict(self) -> dict[str, _F64]:
        """Every output column by name."""
        return {name: self.field(name) for name in OUTPUT_FIELDS}

    def __repr__(self) -> str:
        valid = int(self.valid.sum())
        return f"MemoryGrid(spec={self.spec.name!r}, shape={self.shape}, valid={valid})"
