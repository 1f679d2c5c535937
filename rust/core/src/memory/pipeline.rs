//! How the layers of a model are split over pipeline stages and their model chunks.
//!
//! Megatron-LM's rules (`megatron/core/transformer/transformer_block.py`,
//! `get_num_layers_to_build`, and `transformer_layer.py`, `get_transformer_layer_offset`):
//!
//! * **even**: every stage holds `num_layers / pp` layers, in `vpp` chunks of equal size;
//! * **explicit first and/or last stage** (`--decoder-first-pipeline-num-layers`,
//!   `--decoder-last-pipeline-num-layers`): those stages hold the given number of layers
//!   (a multiple of `vpp`), the other stages split the rest evenly;
//! * **embedding and/or loss counted as a layer** (`--account-for-embedding-in-pipeline-split`,
//!   `--account-for-loss-in-pipeline-split`): the split is even over `num_layers + 1` (or
//!   `+ 2`) units, and the first chunk of the first stage (the last chunk of the last stage)
//!   builds one layer fewer.
//!
//! A fourth rule, **auto**, is what a planner uses for a model whose layers do not divide:
//! the even split when it exists; else the embedding and the loss counted as layers, or
//! the embedding alone, or the loss alone, the first that divides; else middle stages of
//! `ceil(num_layers / pp)` layers (rounded up to a multiple of `vpp`) with the layers left
//! over taken off the last stage first, then the first stage, the two stages that also
//! hold the output layer and the embedding. It reproduces the published layouts of Llama
//! 3.1 405B (126 layers on 16 stages: 7 + 14 x 8 + 7; Dubey et al. 2024, section 3.3.2) and
//! of 61-layer DeepSeek-V3-style models on 16 stages (3 + 14 x 4 + 2, Megatron-LM's Kimi-K2
//! configuration).
//!
//! Virtual stage `v = j * pp + i` is chunk `j` of stage `i`; layers are numbered in
//! virtual-stage order.

/// Rule for splitting layers over stages (the `pipeline_split` layout field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineSplit {
    Even,
    Auto,
    Embedding,
    Loss,
    EmbeddingAndLoss,
}

impl PipelineSplit {
    /// The rule of a `pipeline_split` code (0..=4); `None` for any other value.
    pub fn from_code(code: f64) -> Option<Self> {
        match code as i64 {
            _ if code.fract() != 0.0 => None,
            0 => Some(PipelineSplit::Even),
            1 => Some(PipelineSplit::Auto),
            2 => Some(PipelineSplit::Embedding),
            3 => Some(PipelineSplit::Loss),
            4 => Some(PipelineSplit::EmbeddingAndLoss),
            _ => None,
        }
    }
}

/// Layers per virtual stage: chunks of the first, middle and last stages, and the one
/// layer fewer that an accounted embedding (loss) takes from the very first (last) chunk.
///
/// Packed in one word (five 12-bit sizes and two flags): a grid builds a split for every
/// cell, and any larger value went through memory, where reading it back over its fresh
/// narrower stores stalled (a sixth of a grid's time). Sizes above 4,095 are refused (no
/// model has that many layers in a chunk, or stages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLayers(u64);

const SIZE_BITS: u32 = 12;
const SIZE_MASK: u64 = (1 << SIZE_BITS) - 1;
const PP: u32 = 0;
const VPP: u32 = 1;
const FIRST: u32 = 2;
const MIDDLE: u32 = 3;
const LAST: u32 = 4;
const EMBEDDING_UNIT: u64 = 1 << (5 * SIZE_BITS);
const LOSS_UNIT: u64 = 1 << (5 * SIZE_BITS + 1);

impl StageLayers {
    /// The split of `num_layers` layers, or `None` when the rule cannot split them.
    /// `first` and `last` are explicit layer counts (0: not given; only with `Even`).
    ///
    /// Inlined, with no recursion, so that a grid builds the split in place for every cell
    /// (returned through memory, it was a quarter of a grid's time, its copy stalling on
    /// the fresh stores).
    #[inline(always)]
    pub fn new(
        num_layers: u64,
        pp: u64,
        vpp: u64,
        split: PipelineSplit,
        first: u64,
        last: u64,
    ) -> Option<Self> {
        if pp == 0 || vpp == 0 {
            return None;
        }
        // Every size a split holds fits in 12 bits (see `build`), so no split exists for
        // larger arguments; refusing them here keeps the arithmetic below from overflowing.
        const MAX_LAYERS: u64 = (SIZE_MASK + 1) * (SIZE_MASK + 1) * (SIZE_MASK + 1);
        if pp > SIZE_MASK
            || vpp > SIZE_MASK
            || [num_layers, first, last].iter().any(|&n| n > MAX_LAYERS)
        {
            return None;
        }
        if first > 0 || last > 0 {
            if split != PipelineSplit::Even || pp == 1 {
                return None;
            }
            return Self::uneven(num_layers, pp, vpp, first, last);
        }
        match split {
            PipelineSplit::Even => Self::even(num_layers, pp, vpp),
            PipelineSplit::Auto => Self::even(num_layers, pp, vpp).or_else(|| {
                if pp == 1 {
                    return None;
                }
                Self::accounted(num_layers, pp, vpp, 1, 1)
                    .or_else(|| Self::accounted(num_layers, pp, vpp, 1, 0))
                    .or_else(|| Self::accounted(num_layers, pp, vpp, 0, 1))
                    .or_else(|| Self::fewer_at_the_ends(num_layers, pp, vpp))
            }),
            PipelineSplit::Embedding => Self::accounted(num_layers, pp, vpp, 1, 0),
            PipelineSplit::Loss => Self::accounted(num_layers, pp, vpp, 0, 1),
            PipelineSplit::EmbeddingAndLoss => Self::accounted(num_layers, pp, vpp, 1, 1),
        }
    }

    /// Every chunk `num_layers / (pp * vpp)` layers.
    #[inline]
    fn even(num_layers: u64, pp: u64, vpp: u64) -> Option<Self> {
        let chunks = pp * vpp;
        if num_layers % chunks != 0 {
            return None;
        }
        let chunk = num_layers / chunks;
        Self::build((pp, vpp), (chunk, chunk, chunk), (0, 0))
    }

    /// A split from its sizes; `None` when one does not fit in 12 bits.
    #[inline(always)]
    fn build(
        (pp, vpp): (u64, u64),
        (first_chunk, middle_chunk, last_chunk): (u64, u64, u64),
        (embedding_unit, loss_unit): (u64, u64),
    ) -> Option<Self> {
        let sizes = [pp, vpp, first_chunk, middle_chunk, last_chunk];
        if sizes.iter().any(|&n| n > SIZE_MASK) {
            return None;
        }
        let packed = sizes
            .iter()
            .enumerate()
            .fold(0, |word, (i, &n)| word | n << (i as u32 * SIZE_BITS));
        let flags = if embedding_unit > 0 {
            EMBEDDING_UNIT
        } else {
            0
        } | if loss_unit > 0 { LOSS_UNIT } else { 0 };
        Some(StageLayers(packed | flags))
    }

    #[inline(always)]
    fn size(&self, which: u32) -> u64 {
        (self.0 >> (which * SIZE_BITS)) & SIZE_MASK
    }

    fn embedding_unit(&self) -> u64 {
        u64::from(self.0 & EMBEDDING_UNIT != 0)
    }

    fn loss_unit(&self) -> u64 {
        u64::from(self.0 & LOSS_UNIT != 0)
    }

    /// The embedding and/or the loss (`0` or `1` units each) counted as layers.
    #[inline]
    fn accounted(
        num_layers: u64,
        pp: u64,
        vpp: u64,
        embedding_unit: u64,
        loss_unit: u64,
    ) -> Option<Self> {
        let chunks = pp * vpp;
        let units = num_layers + embedding_unit + loss_unit;
        if units % chunks != 0 {
            return None;
        }
        let chunk = units / chunks;
        // The chunk that loses a layer to both units (pp = vpp = 1) needs two.
        let taken = if chunks == 1 {
            embedding_unit + loss_unit
        } else {
            1
        };
        if chunk < taken {
            return None;
        }
        Self::build(
            (pp, vpp),
            (chunk, chunk, chunk),
            (embedding_unit, loss_unit),
        )
    }

    /// Middle stages of `ceil(num_layers / pp)` layers (a multiple of `vpp`), the layers
    /// left over taken off the last stage, then the first.
    #[inline]
    fn fewer_at_the_ends(num_layers: u64, pp: u64, vpp: u64) -> Option<Self> {
        let middle = num_layers.div_ceil(pp * vpp) * vpp;
        let excess = pp * middle - num_layers;
        if excess % vpp != 0 {
            return None;
        }
        let last_cut = excess.div_ceil(2 * vpp) * vpp;
        let first_cut = excess - last_cut;
        if last_cut >= middle || first_cut >= middle {
            return None;
        }
        Self::uneven(num_layers, pp, vpp, middle - first_cut, middle - last_cut)
    }

    /// Megatron's explicit first/last stage sizes (0: not given), the rest split evenly.
    #[inline]
    fn uneven(num_layers: u64, pp: u64, vpp: u64, first: u64, last: u64) -> Option<Self> {
        if first % vpp != 0 || last % vpp != 0 {
            return None;
        }
        let explicit = u64::from(first > 0) + u64::from(last > 0);
        let middle_stages = pp.checked_sub(explicit)?;
        let middle_layers = num_layers.checked_sub(first + last)?;
        let middle_chunk = if middle_stages == 0 {
            if middle_layers != 0 {
                return None;
            }
            0
        } else {
            if middle_layers % (middle_stages * vpp) != 0 || middle_layers == 0 {
                return None;
            }
            middle_layers / (middle_stages * vpp)
        };
        let or_middle = |n: u64| if n > 0 { n / vpp } else { middle_chunk };
        Self::build(
            (pp, vpp),
            (or_middle(first), middle_chunk, or_middle(last)),
            (0, 0),
        )
    }

    /// Pipeline stages.
    pub fn pp(&self) -> u64 {
        self.size(PP)
    }

    /// Model chunks per stage.
    pub fn vpp(&self) -> u64 {
        self.size(VPP)
    }

    /// Layers in chunk `chunk` of stage `stage`.
    pub fn chunk_layers(&self, stage: u64, chunk: u64) -> u64 {
        let (pp, vpp) = (self.pp(), self.vpp());
        let base = if stage == 0 {
            self.size(FIRST)
        } else if stage == pp - 1 {
            self.size(LAST)
        } else {
            self.size(MIDDLE)
        };
        let first_virtual = stage == 0 && chunk == 0;
        let last_virtual = stage == pp - 1 && chunk == vpp - 1;
        base - self.embedding_unit() * u64::from(first_virtual)
            - self.loss_unit() * u64::from(last_virtual)
    }

    /// Index of the first layer of chunk `chunk` of stage `stage`.
    fn chunk_offset(&self, stage: u64, chunk: u64) -> u64 {
        let (first, middle, last) = (self.size(FIRST), self.size(MIDDLE), self.size(LAST));
        let pp = self.pp();
        let round = if pp == 1 {
            first
        } else {
            first + (pp - 2) * middle + last
        };
        let within = if stage == 0 {
            0
        } else {
            first + (stage - 1) * middle
        };
        (chunk * round + within)
            .saturating_sub(self.embedding_unit() * u64::from((stage, chunk) != (0, 0)))
    }

    /// Layers held by stage `stage`, all its chunks together.
    pub fn stage_layers(&self, stage: u64) -> u64 {
        (0..self.vpp())
            .map(|chunk| self.chunk_layers(stage, chunk))
            .sum()
    }

    /// Whether every stage between the first and the last holds as many layers as the
    /// first.
    pub fn middle_stages_like_first(&self) -> bool {
        self.size(MIDDLE) * self.vpp() == self.stage_layers(0)
    }

    /// How many of stage `stage`'s layers are among the model's first `leading` layers.
    pub fn leading_layers_on(&self, stage: u64, leading: u64) -> u64 {
        (0..self.vpp())
            .map(|chunk| {
                let start = self.chunk_offset(stage, chunk);
                leading
                    .saturating_sub(start)
                    .min(self.chunk_layers(stage, chunk))
            })
            .sum()
    }
}
