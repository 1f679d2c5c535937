"""Accelerators the planner times layouts on: peak FLOP/s, memory and link bandwidths.

Every figure is the vendor's published peak for one GPU (dense, without sparsity), except
where a training report measured the effective one; bandwidths are one direction, in
bytes per second, per GPU. Memory is the capacity the driver reports (``nvidia-smi``:
81,559 MiB for an "80 GB" H100 or H800, 143,771 MiB for an H200, 81,920 MiB for an A100
80GB; 192 GiB for an MI300X), before the CUDA context and allocator take their share:

* **H100 SXM** (NVIDIA H100 Tensor Core GPU datasheet): 989 TFLOP/s BF16, 1,979 FP8,
  3.35 TB/s HBM3, 80 GB; NVLink 4 at 900 GB/s both directions (450 one way); one
  400 Gb/s InfiniBand NDR adapter per GPU (50 GB/s), as in DGX H100 and Meta's clusters
  (Dubey et al. 2024, section 3.3.1).
* **H800 SXM**: the H100's compute and memory with NVLink cut to 400 GB/s both directions;
  DeepSeek-V3's cluster measured about 160 GB/s of NVLink and 50 GB/s of InfiniBand per
  GPU (DeepSeek-AI 2024, sections 3.1 and 3.2.2), the figures used here.
* **H200 SXM** (NVIDIA H200 datasheet): the H100's compute with 4.8 TB/s HBM3e and 141 GB.
* **A100 SXM 80GB** (NVIDIA A100 datasheet): 312 TFLOP/s BF16 (no FP8: FP8 matmuls run
  at the BF16 rate), 2.04 TB/s, NVLink 3 at 600 GB/s both directions, one 200 Gb/s HDR
  adapter per GPU (25 GB/s).
* **MI300X** (AMD Instinct MI300X datasheet): 1,307 TFLOP/s BF16, 2,615 FP8, 5.3 TB/s
  HBM3, 192 GB; seven Infinity Fabric links of 64 GB/s each way (448 GB/s to the other
  seven GPUs of a node); one 400 Gb/s network adapter per GPU.
"""

from __future__ import annotations

import dataclasses

from tokenbatch import _core
from tokenbatch.errors import InvalidTypeError, InvalidValueError

__all__ = ["HARDWARE", "HARDWARE_FIGURES", "Hardware"]

_NAMES = _core.planner_names()
_PRESETS, _FIGURES = _NAMES["presets"], _NAMES["figures"]

#: The figures of a :class:`Hardware`, in the order the core takes them.
HARDWARE_FIGURES: tuple[str, ...] = tuple(_FIGURES)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator and its links, as the planner's step-time model sees them.

    ``peak_flops`` and ``fp8_flops`` are dense matmul FLOP/s (BF16 and FP8),
    ``memory_bandwidth`` the HBM bandwidth, ``intra_node_bandwidth`` the bandwidth from a
    GPU to the others of its node (NVLink, Infinity Fabric) and ``inter_node_bandwidth``
    its share of the network to other nodes, all in bytes per second and one direction.
    ``memory`` is in bytes. Use :meth:`replace` to change a figure of a preset.
    """

    name: str
    peak_flops: float
    fp8_flops: float
    memory_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    memory: float
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or isinstance(self.gpus_per_node, bool):
            raise InvalidTypeError(f"gpus_per_node must be an integer, got {self.gpus_per_node!r}")
        for name in HARDWARE_FIGURES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidTypeError(f"{name} must be a number, got {value!r}")
        # The core checks the values, as it does for the planner's overrides.
        _core.planner_check_hardware(
            [float(getattr(self, name)) for name in HARDWARE_FIGURES], self.gpus_per_node
        )

    def replace(self, **changes: float | int | str) -> Hardware:
        """A copy with some figures changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def preset(cls, name: str) -> Hardware:
        """A preset by name (case-insensitive): see :data:`HARDWARE`."""
        try:
            return HARDWARE[name.lower()]
        except KeyError:
            known = ", ".join(sorted(HARDWARE))
            raise InvalidValueError(f"unknown hardware {name!r}; presets: {known}") from None


#: Presets by name; sources in this module's docstring. The figures are the core's
#: (``tokenbatch_core::memory::planner::hardware``), defined there once.
HARDWARE: dict[str, Hardware] = {
    name: Hardware(name, **dict(zip(HARDWARE_FIGURES, figures, strict=True)), gpus_per_node=gpus)
    for name, figures, gpus in _PRESETS
}
