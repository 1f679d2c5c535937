"""Type stubs of the compiled extension ``tokenbatch._core`` (checked by mypy.stubtest).

Private API: use the typed wrappers of the ``tokenbatch`` package instead.
"""

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal, TypedDict, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

__all__ = [
    "DEAL_FORMAT",
    "EMPTY_SLOT",
    "MAX_COST_COLUMNS",
    "ContextParallelShard",
    "Dealer",
    "EpochDeal",
    "MixtureDealer",
    "MixturePlan",
    "ModelSpec",
    "Packing",
    "PackingBins",
    "RankBatches",
    "Schedule",
    "ShareSchedule",
    "StreamBin",
    "StreamBuffer",
    "__version__",
    "_panic_for_test",
    "batch_padded",
    "cp_rank_major_order",
    "cp_shard",
    "evaluation_table",
    "gather_segments",
    "get_num_threads",
    "memory_estimate",
    "memory_fields",
    "memory_grid",
    "memory_max_tokens",
    "memory_option_choices",
    "memory_option_code",
    "memory_option_codes",
    "memory_recompute_modules",
    "memory_recompute_name",
    "memory_stages",
    "mix_seed",
    "pack",
    "pack_costs",
    "permutation",
    "planner_check_hardware",
    "planner_names",
    "planner_plan",
    "planner_step_time",
    "set_num_threads",
]

__version__: str

def set_num_threads(threads: int | None) -> None: ...
def get_num_threads() -> int: ...

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]
_Lengths = npt.NDArray[np.int64] | npt.NDArray[np.int32]

@final
class Packing:
    """A packing in CSR form (see ``tokenbatch.Packing``)."""

    @property
    def bin_offsets(self) -> _I64: ...
    @property
    def indices(self) -> _I64: ...
    @property
    def starts(self) -> _I64: ...
    @property
    def lengths(self) -> _I64: ...
    @property
    def bin_tokens(self) -> _I64: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def n_seqs(self) -> int: ...
    @property
    def kind(self) -> Literal["packed", "padded"]: ...
    @property
    def n_bins(self) -> int: ...
    @property
    def n_segments(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...
    @property
    def efficiency(self) -> float: ...
    @property
    def lower_bound(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, bin_index: int, /) -> _I64: ...
    def __iter__(self) -> PackingBins: ...
    def segments(self, bin_index: int) -> tuple[_I64, _I64, _I64]: ...
    def stats(self) -> dict[str, int | float]: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...
    @staticmethod
    def _from_parts(
        bin_offsets: _I64,
        indices: _I64,
        starts: _I64,
        lengths: _I64,
        bin_tokens: _I64,
        counts: tuple[int, int, int, int, int, int, int],
        max_tokens: int,
        n_seqs: int,
        kind: str,
        lower_bound: int,
        group_ids: _I64 | None = None,
    ) -> Packing: ...

@final
class PackingBins(Iterator[_I64]):
    def __iter__(self) -> PackingBins: ...
    def __next__(self) -> _I64: ...

def pack(
    lengths: _Lengths,
    max_tokens: int,
    *,
    algorithm: str,
    max_seqs: int | None,
    pad_to_multiple_of: int,
    oversize: str,
    seed: int,
    groups: _I64 | None = None,
) -> Packing: ...
def batch_padded(
    lengths: _Lengths,
    max_tokens: int,
    *,
    max_seqs: int | None,
    pad_to_multiple_of: int,
    oversize: str,
    groups: _I64 | None = None,
) -> Packing: ...

MAX_COST_COLUMNS: int

def pack_costs(
    costs: _I64,
    max_costs: list[int],
    *,
    groups: _I64 | None,
    max_seqs: int | None,
    pad_to_multiple_of: int,
    oversize: str,
) -> Packing: ...

# --- dealing ---
DEAL_FORMAT: int

_CostKind = Literal["tokens", "attention", "flops"]

@final
class Dealer:
    def __new__(
        cls,
        packing: Packing,
        num_replicas: int,
        *,
        seed: int,
        shuffle: bool,
        balance: str | None,
        drop_last: bool,
        pad_to_multiple_of: int,
        split_sequences: bool,
        hidden_size: int | None,
    ) -> Dealer: ...
    @property
    def packing(self) -> Packing: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def shuffle(self) -> bool: ...
    @property
    def balance(self) -> _CostKind | None: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def pad_to_multiple_of(self) -> int: ...
    @property
    def split_sequences(self) -> bool: ...
    @property
    def hidden_size(self) -> int | None: ...
    @property
    def epoch_tokens(self) -> int: ...
    def deal(self, epoch: int) -> EpochDeal: ...
    def deal_after(self, epoch: int, runs: Sequence[tuple[int, int]]) -> EpochDeal: ...

@final
class EpochDeal:
    @property
    def steps(self) -> _I64: ...
    @property
    def bin_offsets(self) -> _I64: ...
    @property
    def indices(self) -> _I64: ...
    @property
    def starts(self) -> _I64: ...
    @property
    def lengths(self) -> _I64: ...
    @property
    def epoch(self) -> int: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def n_steps(self) -> int: ...
    def rank_bins(self, rank: int) -> _I64: ...
    def batches(self, rank: int, start: int, segments: bool) -> RankBatches: ...
    def rest(self, step: int) -> Packing: ...
    def step_costs(self, kind: str) -> _F64: ...
    def real_tokens(self) -> _I64: ...
    def stats(self) -> dict[str, int | float]: ...

@final
class RankBatches(Iterator[Any]):
    def __iter__(self) -> RankBatches: ...
    def __next__(self) -> Any: ...
    def __length_hint__(self) -> int: ...

def mix_seed(parts: list[int]) -> int: ...
def permutation(seed: int, n: int) -> _I64: ...

# --- evaluation ---
EMPTY_SLOT: int

def evaluation_table(
    packing: Packing,
    num_replicas: int,
    *,
    balance: str | None,
    pad_to_multiple_of: int,
    hidden_size: int | None,
) -> npt.NDArray[np.int64]: ...

# --- gather ---
_Words = (
    npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32] | npt.NDArray[np.uint64]
)

def gather_segments(values: _Words, starts: _I64, lengths: _I64) -> _Words: ...

# --- context parallelism ---
@final
class ContextParallelShard:
    """The part of a packed row that one context-parallel rank processes (read-only arrays)."""

    @property
    def indices(self) -> _I64:
        """Positions in the padded row of this rank's tokens, in its order (for each document,
        chunk ``cp_rank`` then chunk ``2 * cp_size - 1 - cp_rank``)."""
    @property
    def cu_seqlens(self) -> _I64:
        """Cumulative count of each document's real (not padding) tokens on this rank."""
    @property
    def cu_seqlens_padded(self) -> _I64:
        """Cumulative count of each document's tokens on this rank, padding included."""

def cp_shard(
    cu_seqlens: _I64, cu_seqlens_padded: _I64, cp_size: int, cp_rank: int
) -> ContextParallelShard: ...
def cp_rank_major_order(cu_seqlens_padded: _I64, cp_size: int) -> _I64: ...

# --- schedule ---
@final
class ShareSchedule:
    def __new__(
        cls, points: list[int], shares: list[float], n_sources: int, interpolation: str
    ) -> ShareSchedule: ...
    def at(self, consumed: int) -> npt.NDArray[np.float64]: ...

@final
class MixtureDealer:
    def __new__(
        cls,
        names: list[str],
        lengths: npt.NDArray[np.int64],
        sizes: list[int],
        max_repetition: list[int],
        shares: ShareSchedule,
        exhausted: str,
        schedule: Schedule,
        *,
        max_tokens: int,
        kind: str,
        algorithm: str,
        max_seqs: int | None,
        pad_to_multiple_of: int,
        oversize: str,
        num_replicas: int,
        seed: int,
        shuffle: bool,
        balance: str | None,
        drop_last: bool,
        hidden_size: int | None,
    ) -> MixtureDealer: ...
    def plan(self, epoch: int, consumed_before: int) -> MixturePlan: ...
    def epoch_tokens(self, epoch: int, consumed_before: int) -> int: ...

@final
class MixturePlan:
    @property
    def deal(self) -> EpochDeal: ...
    @property
    def step_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def source_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def target_tokens(self) -> npt.NDArray[np.float64]: ...
    @property
    def budgets(self) -> npt.NDArray[np.int64]: ...
    @property
    def repetitions(self) -> npt.NDArray[np.int64]: ...
    @property
    def total_tokens(self) -> int: ...

@final
class Schedule:
    @staticmethod
    def megatron(
        start: int,
        increment: int,
        ramp_samples: int,
        global_batch: int,
        seq_len: int | None,
    ) -> Schedule: ...
    @staticmethod
    def linear(
        start: int,
        end: int,
        ramp_tokens: int,
        *,
        unit: str,
        seq_len: int | None,
        by: str,
        multiple_of: int,
    ) -> Schedule: ...
    @staticmethod
    def piecewise(
        from_tokens: _I64,
        batches: _I64,
        *,
        unit: str,
        seq_len: int | None,
        allow_decrease: bool,
    ) -> Schedule: ...
    @staticmethod
    def megatron_steps(from_samples: _I64, batches: _I64, seq_len: int | None) -> Schedule: ...
    def batch_at(self, consumed: _I64) -> _I64: ...
    def table(
        self, total_tokens: int, micro_batch_tokens: int, dp: int
    ) -> tuple[_I64, _I64, _I64, _I64]: ...
    def group_into_steps(self, micro_batch_tokens: _I64, dp: int, consumed_tokens: int) -> _I64: ...
    def megatron_train_iters(self, train_samples: int) -> int | None: ...

# memory
@disjoint_base
class ModelSpec:
    """Shape of a decoder-only transformer (see ``tokenbatch.ModelSpec``)."""

    def __new__(
        cls,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        ffn_size: int,
        vocab_size: int,
        *,
        num_kv_heads: int | None = ...,
        head_dim: int | None = ...,
        ffn_type: str = ...,
        tied_embeddings: bool = ...,
        norm: str = ...,
        qkv_bias: bool = ...,
        linear_bias: bool = ...,
        learned_positions: int = ...,
        num_experts: int = ...,
        top_k: int = ...,
        num_shared_experts: int = ...,
        moe_ffn_size: int = ...,
        first_dense_layers: int = ...,
        router_bias: bool = ...,
        router_groups: int = ...,
        router_group_top_k: int = ...,
        q_lora_rank: int = ...,
        kv_lora_rank: int = ...,
        qk_nope_head_dim: int = ...,
        qk_rope_head_dim: int = ...,
        v_head_dim: int = ...,
        mtp_layers: int = ...,
        implementation: str = ...,
        moe_dispatcher: str = ...,
        name: str = ...,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def ffn_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int | None: ...
    @property
    def ffn_type(self) -> str: ...
    @property
    def tied_embeddings(self) -> bool: ...
    @property
    def norm(self) -> str: ...
    @property
    def qkv_bias(self) -> bool: ...
    @property
    def linear_bias(self) -> bool: ...
    @property
    def learned_positions(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def num_shared_experts(self) -> int: ...
    @property
    def moe_ffn_size(self) -> int: ...
    @property
    def first_dense_layers(self) -> int: ...
    @property
    def router_bias(self) -> bool: ...
    @property
    def router_groups(self) -> int: ...
    @property
    def router_group_top_k(self) -> int: ...
    @property
    def q_lora_rank(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_nope_head_dim(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def mtp_layers(self) -> int: ...
    @property
    def implementation(self) -> str: ...
    @property
    def moe_dispatcher(self) -> str: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_size(self) -> int: ...
    @property
    def is_moe(self) -> bool: ...
    @property
    def is_mla(self) -> bool: ...
    def num_params(self) -> int: ...
    def num_active_params(self) -> int: ...
    def replace(self, **changes: Any) -> Self: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_Column = _F64 | _I64 | npt.NDArray[np.int32] | npt.NDArray[np.bool_]

def memory_grid(
    spec: ModelSpec,
    shape: list[int],
    inputs: list[tuple[_Column, list[int]]],
) -> tuple[_F64, npt.NDArray[np.uint8]]: ...
def memory_estimate(spec: ModelSpec, layout: Sequence[float]) -> tuple[list[float], int]: ...
def memory_stages(
    spec: ModelSpec, layout: Sequence[float]
) -> tuple[npt.NDArray[np.float64], int]: ...
def memory_max_tokens(
    spec: ModelSpec, layout: Sequence[float], gpu_memory: float, multiple_of: int
) -> tuple[int, int, int]: ...
def memory_fields() -> tuple[list[str], list[str], list[str], int]: ...
def memory_option_code(option: str, name: str) -> float: ...
def memory_option_codes(option: str, text: npt.NDArray[np.uint32]) -> npt.NDArray[np.float64]: ...
def memory_option_choices(option: str) -> list[tuple[str, float]]: ...
def memory_recompute_modules() -> list[tuple[str, int]]: ...
def memory_recompute_name(code: float) -> str | None: ...

# --- planner -------------------------------------------------------------------------
#: A GPU's figures (in the order of ``planner_names()["figures"]``) and its GPUs per node.
_Hardware = tuple[Sequence[float], int]
#: Matmul efficiency, seconds per layer pass, overlap tax (the model's own when None).
_Constants = tuple[float, float, float | None]

class _PlannerNames(TypedDict):
    presets: list[tuple[str, list[float], int]]
    figures: list[str]
    time_parts: list[str]
    candidate_fields: list[str]
    chosen: list[str]

def planner_names() -> _PlannerNames: ...
def planner_check_hardware(figures: Sequence[float], gpus_per_node: int) -> None: ...
def planner_plan(
    spec: ModelSpec,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    hardware: _Hardware,
    overrides: tuple[float | None, float | None, float | None, float | None, int | None],
    options: Sequence[float],
    constants: _Constants,
    overlap_ep_comm: bool,
    deduplicated_dispatch: bool,
    usable_fraction: float,
    recompute: Sequence[str],
    distinct: bool,
    top: int | None,
) -> dict[str, Any]: ...
def planner_step_time(
    spec: ModelSpec,
    columns: Sequence[npt.NDArray[np.float64]],
    *,
    hardware: _Hardware,
    seq_len: float,
    options: Sequence[float],
    constants: _Constants,
    overlap_ep_comm: bool,
    deduplicated_dispatch: bool,
) -> dict[str, npt.NDArray[np.float64]]: ...

# --- stream --------------------------------------------------------------------------
_Segment = tuple[int, int, int]

@final
class StreamBin:
    @property
    def segments(self) -> list[_Segment]: ...
    @property
    def released(self) -> list[int]: ...

@final
class StreamBuffer:
    STATE_VERSION: ClassVar[int]
    def __new__(
        cls,
        max_tokens: int,
        *,
        buffer_size: int,
        algorithm: str,
        max_seqs: int | None,
        oversize: str,
        shuffle: bool,
        seed: int,
        num_shards: int,
        shard: int,
    ) -> StreamBuffer: ...
    def push(self, position: int, length: int) -> int: ...
    def finish(self) -> None: ...
    def take_bin(self) -> StreamBin | None: ...
    def held_positions(self) -> list[int]: ...
    @property
    def next_position(self) -> int: ...
    @property
    def dropped_seqs(self) -> int: ...
    @property
    def yielded_bins(self) -> int: ...
    def state(self) -> dict[str, Any]: ...
    def restore(
        self,
        *,
        next_position: int,
        round: int,
        yielded_bins: int,
        dropped_seqs: int,
        buffer: list[_Segment],
        pending: list[list[_Segment]],
    ) -> None: ...

# --- test hook (not API) -------------------------------------------------------------
def _panic_for_test(location: str) -> None: ...
