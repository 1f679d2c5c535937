//! Closed-form per-GPU memory of one training configuration: model states (weights,
//! gradients, optimizer state, divided by tensor, pipeline, expert parallelism and ZeRO),
//! the activations of the busiest pipeline stage ([`crate::memory::activations`], times
//! the micro-batches in flight of [`crate::memory::stage`]), and the overhead. The
//! formulas and their sources are in docs/memory.md ("Formulas and sources").

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
