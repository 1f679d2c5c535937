//! The breakdown of one pipeline stage of a valid configuration.

use crate::memory::activations::rotary_tables;
use crate::memory::breakdown::Breakdown;
use crate::memory::layout::Layout;
use crate::memory::numeric::{ceil, count};
use crate::memory::pipeline::StageLayers;
use crate::memory::prepared::Prepared;
use crate::memory::terms::{cp_rank_tokens, Terms};

/// Whether `l` recomputes fully. A comparison of the code (validated) rather
/// than of the [`Recompute`] mode: a float comparison chooses between values with masks,
/// where a branch on the mode, which varies from cell to cell in a list of layouts, was
/// mispredicted.
#[inline(always)]
fn full_recompute(l: &Layout) -> bool {
    l.recompute == 2.0
}

/// What the stages of one valid configuration share.
pub(crate) struct Config<'a> {
    prep: &'a Prepared,
    l: &'a Layout,
    terms: &'a Terms,
    tokens: f64,
    /// Rotary tables kept per micro-batch (shared by the layers).
    rotary_per_mb: f64,
    working: f64,
    embedding_per_mb: f64,
    logits_per_mb: f64,
    /// Communication buffers of one layer (EP all-to-all, CP key/value exchange).
    comm: f64,
    /// One multi-token-prediction module's activations per micro-batch.
    mtp_per_mb: f64,
    dense_group: f64,
    expert_group: f64,
    pp: u64,
    vpp: u64,
    stages: StageLayers,
}

impl<'a> Config<'a> {
    /// Inlined: a grid builds one for every cell, and a `Config` returned through memory
    /// stalled when its fields were read back in pairs over their fresh stores.
    #[inline(always)]
    pub(crate) fn new(
        prep: &'a Prepared,
        l: &'a Layout,
        terms: &'a Terms,
        stages: StageLayers,
    ) -> Self {
        let spec = &prep.spec;
        let tokens = l.micro_batch * cp_rank_tokens(l.seq_len, l.cp);
        let korthikanti = terms.korthikanti;
        // What depends on full recomputation is computed either way and chosen by
        // `full_recompute`, a mask rather than a branch.
        let full = full_recompute(l);
        let working = if korthikanti {
            0.0
        } else {
            let layer = |(per_token, fixed): (f64, f64)| tokens * per_token + fixed;
            let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
            let dense = if has_dense {
                layer(terms.working_dense)
            } else {
                0.0
            };
            let moe = if spec.is_moe() {
                layer(terms.working_moe)
            } else {
                0.0
            };
            let working = dense.max(moe);
            if full {
                working
            } else {
                0.0
            }
        };
        let rotary = terms.rotary.map_or(0.0, |widths| {
            rotary_tables(cp_rank_tokens(l.seq_len, l.cp), widths)
        });
        let dense_group = l.dp * l.cp;
        Config {
            prep,
            l,
            terms,
            tokens,
            rotary_per_mb: if full { 0.0 } else { rotary },
            working,
            embedding_per_mb: terms.embedding_per_token * tokens,
            logits_per_mb: if korthikanti {
                0.0
            } else {
                tokens * terms.head_per_token
            },
            // No buffer is no bytes, even for a token count that overflowed to infinity
            // (infinity x 0 would make the whole estimate NaN).
            comm: if terms.comm_per_token == 0.0 {
                0.0
            } else {
                tokens * terms.comm_per_token
            },
            mtp_per_mb: if korthikanti || spec.mtp_layers == 0 {
                0.0
            } else {
                tokens * terms.mtp.0 + terms.mtp.1
            },
            dense_group,
            expert_group: dense_group / l.ep,
            pp: l.pp as u64,
            vpp: l.vpp as u64,
            stages,
        }
    }

    /// (dense, MoE) layers held by `stage`.
    pub(crate) fn layer_counts(&self, stage: u64) -> (f64, f64) {
        let spec = &self.prep.spec;
        let layers = self.stages.stage_layers(stage);
        let dense = if spec.is_moe() {
            self.stages
                .leading_layers_on(stage, spec.first_dense_layers)
        } else {
            layers
        };
        (count(dense), count(layers - dense))
    }

    /// The breakdown of `stage`, which holds `(n_dense, n_moe)` layers. Inlined, for the
    /// same reason as [`Config::new`].
    #[inline(always)]
    pub(crate) fn stage(&self, stage: u64, (n_dense, n_moe): (f64, f64)) -> Breakdown {
        let (prep, l, spec) = (self.prep, self.l, &self.prep.spec);
        let (pp, vpp) = (self.pp, self.vpp);
        let first = stage == 0;
        let last = stage == pp - 1;

        // Sharding of model states.
        let z = l.zero;
        // Divided by 1 below the threshold (exact): a choice of divisor is a mask, where a
        // branch on `zero`, which varies from cell to cell in a list, was mispredicted.
        let shard = |states: f64, threshold: f64, group: f64| {
            states / if z >= threshold { group } else { 1.0 }
        };
        let terms = self.terms;
        let mut dense_params = n_dense * terms.dense_layer.0 + n_moe * terms.moe_layer.0;
        let mut expert_params = n_dense * terms.dense_layer.1 + n_moe * terms.moe_layer.1;
        let mtp = if last { spec.mtp_layers as f64 } else { 0.0 };
        if first {
            dense_params += terms.embedding_per_rank + prep.positions;
        }
        if last {
            // A tied projection is the embedding itself unless the pipeline puts them on
            // different stages, where Megatron keeps a synchronized copy on the last one.
            let head = if spec.tied_embeddings && pp == 1 {
                0.0
            } else {
                terms.embedding_per_rank
            };
            dense_params += prep.final_norm + head;
            // Multi-token prediction runs on the last stage, which then needs the
            // embedding too (Megatron-LM builds it there when pp > 1).
            dense_params += mtp * terms.mtp_module.0;
            expert_params += mtp * terms.mtp_module.1;
            if mtp > 0.0 && pp > 1 {
                dense_params += terms.embedding_per_rank;
            }
        }
        let per_param = |bytes: f64, threshold: f64| {
            bytes
                * (shard(dense_params, threshold, self.dense_group)
                    + shard(expert_params, threshold, self.expert_group))
        };
        let params = ceil(per_param(l.param_bytes, 3.0));
        let grads = ceil(per_param(l.grad_bytes + l.grad_buffer_bytes, 2.0));
        let all_optimizer = ceil(per_param(l.master_bytes + l.optimizer_state_bytes, 1.0));
        let cpu_optimizer = ceil(all_optimizer * l.optimizer_offload);
        let optimizer = all_optimizer - cpu_optimizer;

        // Micro-batches in flight on this stage, in units of "all the stage's layers once".
        let m = l.grad_accum_steps;
        let remaining = count(pp - stage);
        // With one stage, both forms give 1 (`m`, when set, is at least 1); `pp` varies
        // from cell to cell in a list, and a branch on it was mispredicted, as one on
        // whether `m` is set would be (the choice below is a mask).
        let in_flight = if vpp == 1 {
            let capped = remaining.min(m);
            if m > 0.0 {
                capped
            } else {
                remaining
            }
        } else {
            let chunks = 2.0 * (remaining - 1.0) + count((vpp - 1) * pp) + 1.0;
            let chunks = if m > 0.0 {
                chunks.min(m * count(vpp))
            } else {
                chunks
            };
            chunks / count(vpp)
        };
        let layer_tokens = self.tokens * in_flight;
        // What full recomputation keeps and what the other modes keep are both computed,
        // and `full_recompute` chooses.
        let full = full_recompute(l);
        let (d, e) = (&terms.dense_acts, &terms.moe_acts);
        let checkpoints = layer_tokens * (n_dense + n_moe) * terms.checkpoint;
        let attention = layer_tokens * (n_dense * d.attention + n_moe * e.attention)
            + in_flight * self.rotary_per_mb;
        let mlp =
            layer_tokens * (n_dense * d.mlp + n_moe * e.mlp) + in_flight * n_moe * terms.moe_fixed;
        let norm = layer_tokens * (n_dense * d.norm + n_moe * e.norm);
        let kept = |x: f64| if full { 0.0 } else { x };
        let act_attention = kept(attention);
        let act_mlp = kept(mlp);
        let act_norm = kept(norm);
        let act_checkpoints = if full { checkpoints } else { 0.0 };
        let act_embedding = if first {
            self.embedding_per_mb * in_flight
        } else {
            0.0
        };
        let act_logits = if last { self.logits_per_mb } else { 0.0 };
        let act_mtp = mtp * self.mtp_per_mb;
        let (act_working, act_comm) = if n_dense + n_moe + mtp > 0.0 {
            (self.working, self.comm)
        } else {
            (0.0, 0.0)
        };
        let activations = ceil(
            act_attention
                + act_mlp
                + act_norm
                + act_embedding
                + act_logits
                + act_checkpoints
                + act_working
                + act_comm
                + act_mtp,
        );
        Breakdown {
            params,
            grads,
            optimizer,
            activations,
            overhead: l.overhead_bytes,
            total: params + grads + optimizer + activations + l.overhead_bytes,
            act_attention,
            act_mlp,
            act_norm,
            act_embedding,
            act_logits,
            act_checkpoints,
            act_working,
            act_comm,
            act_mtp,
            stage: count(stage),
            layers: n_dense + n_moe,
            cpu_optimizer,
        }
    }
}
