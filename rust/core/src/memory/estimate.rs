//! Closed-form per-GPU memory of one training configuration.
//!
//! # Model states (bytes per parameter held by a GPU)
//! `param_bytes` weights, `grad_bytes + grad_buffer_bytes` gradients and
//! `master_bytes + optimizer_state_bytes` optimizer state; mixed-precision AdamW is
//! 2 + 2 + (4 + 4 + 4) = 16 bytes (Rajbhandari et al. 2020, "ZeRO", section 3.1;
//! Ultra-Scale Playbook, "Memory usage in Transformers"). fp32 master weights are optimizer
//! state, so ZeRO-1 shards them with the moments. ZeRO stage `z` divides optimizer state
//! (z >= 1), gradients (z >= 2) and weights (z >= 3) by the sharding group: `dp * cp` for
//! dense weights (Megatron shards the distributed optimizer over data and context
//! parallel ranks) and `dp * cp / ep` for routed experts.
//!
//! Tensor parallelism (Shoeybi et al. 2019) splits attention heads, MLP columns and the
//! vocabulary; norms, the MoE router and MLA's down-projections stay replicated; key/value
//! heads are replicated when `tp` exceeds their number. Expert parallelism splits routed
//! experts over `ep` ranks, and experts are also split over `tp` (Megatron-Core's default
//! expert tensor parallelism). Pipeline parallelism gives each stage `num_layers / pp`
//! layers; the first stage also holds the embedding, the last the final norm and output
//! projection (a copy of it when embeddings are tied and `pp > 1`).
//!
//! # Activations
//! Bytes saved for backward per token of a micro-batch (`micro_batch * seq_len / cp` tokens
//! per GPU, each sequence padded to a multiple of `2 * cp` when `cp > 1`, as load-balanced
//! context parallelism needs), per layer, times the layers and micro-batches in flight on the stage:
//! 1F1B keeps `min(m, pp - i)` micro-batches on stage `i` (Narayanan et al. 2021); the
//! interleaved schedule with `vpp` chunks keeps `min(m * vpp, 2 (pp - i - 1) + (vpp - 1) pp + 1)`
//! chunks, which on stage 0 is Megatron's `pp * (1 + (pp - 1) / (pp * vpp))` stage
//! equivalents. The reported breakdown is the busiest stage (largest total).
//!
//! `korthikanti`: Korthikanti et al. 2022, table 2, per layer
//! `sbh (10 + 24/t + 5as/(ht))` without sequence parallelism, `sbh/t (34 + 5as/h)` with it,
//! the `5as/h` term removed by selective recomputation and `2sbh` (`/t` with sequence
//! parallelism) kept by full recomputation, plus the `sbh` dropout mask of the input
//! embedding per micro-batch in flight (their section 4.3). It assumes GPT blocks (4h GeLU
//! MLP, LayerNorm, dropout, 16-bit activations); applied to other shapes it reproduces
//! published estimates such as the Ultra-Scale Playbook's, not the real allocation.
//!
//! `modern`: the tensors today's blocks save, listed in [`crate::memory::activations`],
//! for Hugging Face's modules or fused kernels (the spec's `implementation`); the head
//! keeps the final norm, its output and the logits in `logits_bytes` for the loss.
//! Full recomputation keeps each layer's input and needs one layer's activations while it
//! recomputes (Chen et al. 2016).

use crate::memory::breakdown::Breakdown;
use crate::memory::checks::{check_fields, ep_group_fit, split_fit, validate_fit};
use crate::memory::layout::{Invalid, Layout};
use crate::memory::memo::Memo;
use crate::memory::pipeline::StageLayers;
use crate::memory::prepared::Prepared;
use crate::memory::stage::Config;
use crate::memory::terms::{Terms, TermsKey, TERMS_KEY_WORDS};

/// Estimate one configuration (the spec must have been validated).
pub fn estimate(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    check_fields(l)?;
    let stages = validate_fit(&prep.spec, l)?;
    let terms = Terms::new(prep, &TermsKey::new(l));
    finite(estimate_valid(prep, l, &terms, stages))
}

/// Estimates configurations one after the other, as a grid's worker does: the [`Terms`] of
/// each distinct [`TermsKey`] are computed once, and cells with the same key share them.
pub(crate) struct Estimator<'p> {
    prep: &'p Prepared,
    terms: Memo<TERMS_KEY_WORDS, Terms>,
}

impl<'p> Estimator<'p> {
    pub fn new(prep: &'p Prepared) -> Self {
        Estimator {
            prep,
            terms: Memo::new(),
        }
    }

    /// [`estimate`] for a layout whose fields each passed [`check_field`]. Inlined into
    /// the grid's loops, for the reasons [`Config::new`] gives.
    #[inline(always)]
    pub fn estimate_checked_fields(&mut self, l: &Layout) -> Result<Breakdown, Invalid> {
        let prep = self.prep;
        let key = TermsKey::new(l);
        let terms = self
            .terms
            .get_or_insert_with(key.words(), || Terms::new(prep, &key));
        estimate_with_terms(prep, l, terms)
    }
}

/// [`estimate`] for a layout whose fields each passed [`check_field`], given its terms
/// (those of its [`TermsKey`]).
#[inline(always)]
pub(crate) fn estimate_with_terms(
    prep: &Prepared,
    l: &Layout,
    terms: &Terms,
) -> Result<Breakdown, Invalid> {
    // The checks of `validate_fit`, in its order.
    terms.tp_fit?;
    let stages = split_fit(&prep.spec, l)?;
    terms.ep_fit?;
    ep_group_fit(l)?;
    finite(estimate_valid(prep, l, terms, stages))
}

/// A breakdown whose total is a number, or [`Invalid::Overflow`]: an estimate of absurd
/// inputs is refused rather than reported as valid.
#[inline(always)]
fn finite(breakdown: Breakdown) -> Result<Breakdown, Invalid> {
    if breakdown.total.is_finite() {
        Ok(breakdown)
    } else {
        Err(Invalid::Overflow)
    }
}

/// The busiest stage of a valid configuration, with an infinite total where some stage's
/// total is past the largest `f64` (infinite, or NaN where an infinite count of tokens met
/// zero bytes; a NaN stage would never win the comparison below). Every non-negative
/// output of a stage adds up into its total (or, for the offloaded optimizer state, is at
/// most a part of it), so one check of each evaluated stage's total covers them all; the
/// middle stages skipped below hold at most what the first holds.
#[inline(always)]
fn estimate_valid(prep: &Prepared, l: &Layout, terms: &Terms, stages: StageLayers) -> Breakdown {
    let config = Config::new(prep, l, terms, stages);
    let pp = l.pp as u64;
    let first_counts = config.layer_counts(0);
    let mut best = config.stage(0, first_counts);
    let mut finite = best.total.is_finite();
    // A middle stage holding the same layers as the first stage or as the middle stage
    // before it cannot be the busiest: it has the same layer states, fewer micro-batches in
    // flight and no embedding. That leaves two stages to evaluate for a dense model,
    // whatever `pp`; when its split is even, not even a look at the middle stages, whose
    // number varies from cell to cell (a mispredicted loop exit in a list of layouts).
    let middles = if !prep.spec.is_moe() && stages.middle_stages_like_first() {
        1..1
    } else {
        1..pp.saturating_sub(1)
    };
    let mut previous_middle = (f64::NAN, f64::NAN);
    for stage in middles {
        let counts = config.layer_counts(stage);
        if counts == first_counts || counts == previous_middle {
            continue;
        }
        previous_middle = counts;
        let candidate = config.stage(stage, counts);
        finite &= candidate.total.is_finite();
        if candidate.total > best.total {
            best = candidate;
        }
    }
    if pp > 1 {
        let candidate = config.stage(pp - 1, config.layer_counts(pp - 1));
        finite &= candidate.total.is_finite();
        if candidate.total > best.total {
            best = candidate;
        }
    }
    if !finite {
        best.total = f64::INFINITY;
    }
    best
}

/// The breakdown of every pipeline stage of a configuration (the spec must have been
/// validated); [`estimate`] reports the first stage with the largest total. As there, a
/// stage whose total is past the largest `f64` makes it [`Invalid::Overflow`].
pub fn estimate_stages(prep: &Prepared, l: &Layout) -> Result<Vec<Breakdown>, Invalid> {
    check_fields(l)?;
    let stages = validate_fit(&prep.spec, l)?;
    let terms = Terms::new(prep, &TermsKey::new(l));
    let config = Config::new(prep, l, &terms, stages);
    let breakdowns: Vec<Breakdown> = (0..l.pp as u64)
        .map(|stage| config.stage(stage, config.layer_counts(stage)))
        .collect();
    if breakdowns.iter().all(|b| b.total.is_finite()) {
        Ok(breakdowns)
    } else {
        Err(Invalid::Overflow)
    }
}
