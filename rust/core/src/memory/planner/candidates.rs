//! The candidate layouts of a search, before their memory is known.
//!
//! Bounds of the search, not of the model: sequence parallelism is on whenever tensor
//! parallelism is, tensor parallelism stays within a node, context parallelism is at most
//! 32-way, micro-batches hold at most 64 sequences and ZeRO-2 and -3 are not combined
//! with pipeline parallelism (Megatron-LM and DeepSpeed do not support it).

use crate::memory::layout::Recompute;
use crate::memory::pipeline::{PipelineSplit, StageLayers};
use crate::memory::spec::ModelSpec;

use super::layer_time::LayerKey;

const MAX_CP: u64 = 32;
const MAX_MICRO_BATCH: u64 = 64;
const VPP: [u64; 4] = [1, 2, 4, 8];

/// How the layers of a `(pp, vpp)` pipeline are split: the rule, the explicit first and
/// last stage sizes (0 unless explicit) and the layers of the stages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    pub rule: PipelineSplit,
    pub first_stage: u64,
    pub last_stage: u64,
    pub stages: StageLayers,
    /// Layers of the first, of the largest and of the last stage.
    pub first_middle_last: (u64, u64, u64),
}

impl Split {
    fn new(rule: PipelineSplit, first_stage: u64, last_stage: u64, stages: StageLayers) -> Self {
        let pp = stages.pp();
        let first = stages.stage_layers(0);
        let last = stages.stage_layers(pp - 1);
        let middle = if pp > 2 { stages.stage_layers(1) } else { 0 };
        Split {
            rule,
            first_stage,
            last_stage,
            stages,
            first_middle_last: (first, first.max(middle).max(last), last),
        }
    }

    /// Layers of every stage.
    pub fn stage_layers(&self) -> Vec<u64> {
        (0..self.stages.pp())
            .map(|stage| self.stages.stage_layers(stage))
            .collect()
    }
}

/// One candidate; `split` indexes the search's splits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub vpp: u64,
    pub zero: u64,
    pub recompute: Recompute,
    pub micro_batch: u64,
    pub steps: u64,
    pub split: usize,
    /// Indexes the search's [`LayerKey`]s.
    pub layer: usize,
    /// Indexes the search's data-parallel groups.
    pub group: usize,
}

/// What a search enumerates over.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub num_gpus: u64,
    pub seq_len: u64,
    /// Sequences per step.
    pub sequences: u64,
    pub gpus_per_node: u64,
    pub modes: Vec<Recompute>,
}

/// The divisors of `n`, in increasing order.
pub fn divisors(n: u64) -> Vec<u64> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// The output layer and multi-token-prediction modules, in layers of compute.
pub fn end_cost(spec: &ModelSpec) -> f64 {
    let sum = |p: crate::memory::LayerParams| p.replicated + p.tp_split + p.kv + p.experts;
    let layers = spec.num_layers;
    let moe_layers = if spec.is_moe() {
        layers - spec.first_dense_layers
    } else {
        0
    };
    let moe_index = spec.first_dense_layers.min(layers.saturating_sub(1));
    let dense = sum(spec.layer_params(0, false));
    let moe_active = sum(spec.layer_params(moe_index, true));
    let active =
        (dense * (layers - moe_layers) as f64 + moe_active * moe_layers as f64) / layers as f64;
    let embedding = spec.embedding_params().0;
    let projection = spec.head_params(false).1;
    let head = (if projection == 0.0 {
        embedding
    } else {
        projection
    }) / active;
    let last_layer = if moe_layers > 0 { moe_active } else { dense };
    head + spec.mtp_layers as f64 * (last_layer / active + head)
}

/// The split of the layers over stages that balances the stages' compute.
///
/// Every layer costs 1, the last stage `end_cost` more (the output layer and the
/// multi-token-prediction modules, in layers of compute). Among the splits Megatron-LM
/// can express (even; the embedding and/or the loss counted as a layer; explicit first
/// and last stage sizes, the rest even), the one whose slowest stage is fastest; ties go
/// to fewer layers on the first stage, which keeps the most micro-batches in flight,
/// then to the simpler rule.
pub fn balanced_split(spec: &ModelSpec, pp: u64, vpp: u64, end_cost: f64) -> Option<Split> {
    let layers = spec.num_layers;
    let mut best: Option<((f64, u64, u64), Split)> = None;
    let mut consider = |rank: u64, rule: PipelineSplit, first: u64, last: u64| {
        let Some(stages) = StageLayers::new(layers, pp, vpp, rule, first, last) else {
            return;
        };
        let split = Split::new(rule, first, last, stages);
        let (head, middle, tail) = split.first_middle_last;
        let slowest_before_last = if pp > 1 { head.max(middle) as f64 } else { 0.0 };
        let cost = slowest_before_last.max(tail as f64 + end_cost);
        let key = (cost, head, rank);
        let better = best.as_ref().is_none_or(|(best_key, _)| {
            (key.0, key.1, key.2)
                .partial_cmp(best_key)
                .is_some_and(|order| order.is_lt())
        });
        if better {
            best = Some((key, split));
        }
    };
    let rules = [
        PipelineSplit::Even,
        PipelineSplit::EmbeddingAndLoss,
        PipelineSplit::Embedding,
        PipelineSplit::Loss,
    ];
    for (rank, rule) in rules.into_iter().enumerate() {
        consider(rank as u64, rule, 0, 0);
    }
    if pp > 1 {
        let widest = 2 * layers.div_ceil(pp);
        for first in (vpp..=widest).step_by(vpp as usize) {
            for last in (vpp..=widest).step_by(vpp as usize) {
                consider(4, PipelineSplit::Even, first, last);
            }
        }
    }
    best.map(|(_, split)| split)
}

/// The distinct [`LayerKey`]s of a search, each numbered once: for each `(tp, cp)`, a
/// table of their numbers by micro-batch, expert parallelism (its place among the
/// divisors of the GPUs) and mode.
struct LayerKeys {
    divisors: Vec<u64>,
    modes: Vec<Recompute>,
    tables: Vec<((u64, u64), Vec<usize>)>,
    keys: Vec<LayerKey>,
}

impl LayerKeys {
    fn new(num_gpus: u64, modes: &[Recompute]) -> Self {
        LayerKeys {
            divisors: divisors(num_gpus),
            modes: modes.to_vec(),
            tables: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// The table of `(tp, cp)`.
    fn table(&mut self, tp: u64, cp: u64) -> usize {
        if let Some(t) = self.tables.iter().position(|(key, _)| *key == (tp, cp)) {
            return t;
        }
        let size = (MAX_MICRO_BATCH as usize + 1) * self.divisors.len() * self.modes.len();
        self.tables.push(((tp, cp), vec![usize::MAX; size]));
        self.tables.len() - 1
    }

    /// The numbers of the keys of `micro_batch` and `ep` in table `t`, mode by mode, in
    /// `numbers`.
    fn numbers(
        &mut self,
        t: usize,
        (micro_batch, ep): (u64, u64),
        numbers: &mut Vec<(usize, Recompute)>,
    ) {
        let ((tp, cp), _) = self.tables[t];
        let place = self.divisors.binary_search(&ep).unwrap_or(0);
        let first = (micro_batch as usize * self.divisors.len() + place) * self.modes.len();
        numbers.clear();
        for (mode, &recompute) in self.modes.iter().enumerate() {
            let slot = &mut self.tables[t].1[first + mode];
            if *slot == usize::MAX {
                *slot = self.keys.len();
                self.keys.push(LayerKey {
                    tp: tp as f64,
                    cp: cp as f64,
                    ep: ep as f64,
                    micro_batch: micro_batch as f64,
                    recompute: recompute.code(),
                });
            }
            numbers.push((*slot, recompute));
        }
    }
}

/// The candidates of a search and what its rows index.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    /// Every candidate within the bounds, in the order the ranking breaks ties by.
    pub rows: Vec<Row>,
    pub splits: Vec<Split>,
    pub layers: Vec<LayerKey>,
    /// The data-parallel groups of the rows: `(dp, tp, cp, ep)`.
    pub groups: Vec<(u64, u64, u64, u64)>,
}

/// Every candidate within the bounds.
pub fn candidates(spec: &ModelSpec, b: &Bounds) -> Candidates {
    let mut rows = Vec::new();
    let mut splits: Vec<Split> = Vec::new();
    let mut layers = LayerKeys::new(b.num_gpus, &b.modes);
    let mut groups = Vec::new();
    let mut numbered = Vec::new();
    // The split depends on (pp, vpp) only: found once for every tp.
    let mut found: Vec<((u64, u64), Option<usize>)> = Vec::new();
    let end = end_cost(spec);
    for tp in divisors(b.num_gpus) {
        if tp > b.gpus_per_node || spec.num_heads % tp != 0 {
            continue;
        }
        for pp in divisors(b.num_gpus / tp) {
            let vpps: &[u64] = if pp > 1 { &VPP } else { &VPP[..1] };
            for &vpp in vpps {
                let known = found
                    .iter()
                    .find(|(key, _)| *key == (pp, vpp))
                    .map(|(_, s)| *s);
                let split = known.unwrap_or_else(|| {
                    let index = balanced_split(spec, pp, vpp, end).map(|split| {
                        splits.push(split);
                        splits.len() - 1
                    });
                    found.push(((pp, vpp), index));
                    index
                });
                let Some(split) = split else {
                    continue;
                };
                for cp in divisors(b.num_gpus / (tp * pp)) {
                    if cp > MAX_CP || b.seq_len < 2 * cp {
                        continue;
                    }
                    let dp = b.num_gpus / (tp * pp * cp);
                    if b.sequences % dp != 0 {
                        continue;
                    }
                    let eps: Vec<u64> = if spec.is_moe() {
                        divisors(dp * cp)
                            .into_iter()
                            .filter(|e| spec.num_experts % e == 0)
                            .collect()
                    } else {
                        vec![1]
                    };
                    // ZeRO-2 and -3 reduce gradients after every micro-batch, which
                    // neither Megatron-LM nor DeepSpeed does under pipeline parallelism.
                    let zeros: &[u64] = if dp * cp == 1 {
                        &[0]
                    } else if pp > 1 {
                        &[0, 1]
                    } else {
                        &[0, 1, 2, 3]
                    };
                    let per_rank = b.sequences / dp;
                    let table = layers.table(tp, cp);
                    let first_group = groups.len();
                    groups.extend(eps.iter().map(|&ep| (dp, tp, cp, ep)));
                    for micro_batch in divisors(per_rank) {
                        if micro_batch > MAX_MICRO_BATCH {
                            break;
                        }
                        let steps = per_rank / micro_batch;
                        if vpp > 1 && steps % pp != 0 {
                            continue;
                        }
                        for (e, &ep) in eps.iter().enumerate() {
                            layers.numbers(table, (micro_batch, ep), &mut numbered);
                            let group = first_group + e;
                            for &zero in zeros {
                                for &(layer, recompute) in &numbered {
                                    rows.push(Row {
                                        dp,
                                        tp,
                                        pp,
                                        cp,
                                        ep,
                                        vpp,
                                        zero,
                                        recompute,
                                        micro_batch,
                                        steps,
                                        split,
                                        layer,
                                        group,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Candidates {
        rows,
        splits,
        layers: layers.keys,
        groups,
    }
}
