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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLayers {
    pub pp: u64,
    pub vpp: u64,
    first_chunk: u64,
    middle_chunk: u64,
    last_chunk: u64,
    embedding_unit: bool,
    loss_unit: bool,
}

impl StageLayers {
    /// The split of `num_layers` layers, or `None` when the rule cannot split them.
    /// `first` and `last` are explicit layer counts (0: not given; only with `Even`).
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
        let even = |chunk: u64| StageLayers {
            pp,
            vpp,
            first_chunk: chunk,
            middle_chunk: chunk,
            last_chunk: chunk,
            embedding_unit: false,
            loss_unit: false,
        };
        if first > 0 || last > 0 {
            if split != PipelineSplit::Even || pp == 1 {
                return None;
            }
            return Self::uneven(num_layers, pp, vpp, first, last);
        }
        let chunks = pp * vpp;
        match split {
            PipelineSplit::Even => (num_layers % chunks == 0).then(|| even(num_layers / chunks)),
            PipelineSplit::Auto => {
                if num_layers % chunks == 0 {
                    return Some(even(num_layers / chunks));
                }
                if pp == 1 {
                    return None;
                }
                [
                    PipelineSplit::EmbeddingAndLoss,
                    PipelineSplit::Embedding,
                    PipelineSplit::Loss,
                ]
                .into_iter()
                .find_map(|rule| Self::new(num_layers, pp, vpp, rule, 0, 0))
                .or_else(|| Self::fewer_at_the_ends(num_layers, pp, vpp))
            }
            PipelineSplit::Embedding | PipelineSplit::Loss | PipelineSplit::EmbeddingAndLoss => {
                let embedding_unit = split != PipelineSplit::Loss;
                let loss_unit = split != PipelineSplit::Embedding;
                let units = num_layers + u64::from(embedding_unit) + u64::from(loss_unit);
                if units % chunks != 0 {
                    return None;
                }
                let chunk = units / chunks;
                // The chunk that loses a layer to both units (pp = vpp = 1) needs two.
                let taken = if chunks == 1 {
                    u64::from(embedding_unit) + u64::from(loss_unit)
                } else {
                    1
                };
                (chunk >= taken).then_some(StageLayers {
                    embedding_unit,
                    loss_unit,
                    ..even(chunk)
                })
            }
        }
    }

    /// Middle stages of `ceil(num_layers / pp)` layers (a multiple of `vpp`), the layers
    /// left over taken off the last stage, then the first.
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
        Some(StageLayers {
            pp,
            vpp,
            first_chunk: or_middle(first),
            middle_chunk,
            last_chunk: or_middle(last),
            embedding_unit: false,
            loss_unit: false,
        })
    }

    /// Layers in chunk `chunk` of stage `stage`.
    pub fn chunk_layers(&self, stage: u64, chunk: u64) -> u64 {
        let base = if stage == 0 {
            self.first_chunk
        } else if stage == self.pp - 1 {
            self.last_chunk
        } else {
            self.middle_chunk
        };
        let first_virtual = stage == 0 && chunk == 0;
        let last_virtual = stage == self.pp - 1 && chunk == self.vpp - 1;
        base - u64::from(self.embedding_unit && first_virtual)
            - u64::from(self.loss_unit && last_virtual)
    }

    /// Index of the first layer of chunk `chunk` of stage `stage`.
    fn chunk_offset(&self, stage: u64, chunk: u64) -> u64 {
        let round = if self.pp == 1 {
            self.first_chunk
        } else {
            self.first_chunk + (self.pp - 2) * self.middle_chunk + self.last_chunk
        };
        let within = if stage == 0 {
            0
        } else {
            self.first_chunk + (stage - 1) * self.middle_chunk
        };
        (chunk * round + within)
            .saturating_sub(u64::from(self.embedding_unit && (stage, chunk) != (0, 0)))
    }

    /// Layers held by stage `stage`, all its chunks together.
    pub fn stage_layers(&self, stage: u64) -> u64 {
        (0..self.vpp)
            .map(|chunk| self.chunk_layers(stage, chunk))
            .sum()
    }

    /// How many of stage `stage`'s layers are among the model's first `leading` layers.
    pub fn leading_layers_on(&self, stage: u64, leading: u64) -> u64 {
        (0..self.vpp)
            .map(|chunk| {
                let start = self.chunk_offset(stage, chunk);
                leading
                    .saturating_sub(start)
                    .min(self.chunk_layers(stage, chunk))
            })
            .sum()
    }
}
