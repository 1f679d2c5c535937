//! The checks of a configuration: each layout field's own rule, then how the layout
//! fits the model (tensor, pipeline and expert parallelism dividing what they split).

use crate::memory::layout::{field_rule, Invalid, Layout};
use crate::memory::pipeline::{PipelineSplit, StageLayers};
use crate::memory::spec::ModelSpec;

/// Whether `d` (a validated positive whole number) divides `n`. Integer arithmetic,
/// because float remainders are several times slower in a grid's inner loop, and a mask
/// for the powers of two that most parallel degrees are, because a division is still
/// tens of cycles and a cell checks several.
#[inline]
fn divides(d: f64, n: u64) -> bool {
    let d = d as u64;
    if d.is_power_of_two() {
        n & (d - 1) == 0
    } else {
        n % d == 0
    }
}

/// Check a configuration against the model; the first problem found is returned (fields
/// in [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS) order, then how they fit the model).
pub fn validate(spec: &ModelSpec, l: &Layout) -> Result<(), Invalid> {
    check_fields(l)?;
    validate_fit(spec, l).map(|_| ())
}

/// [`check_field`] on every field, in field order.
pub(crate) fn check_fields(l: &Layout) -> Result<(), Invalid> {
    for (field, &value) in l.to_values().iter().enumerate() {
        check_field(field, value)?;
    }
    Ok(())
}

/// Check the value of field `field` (an index into
/// [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS)) on its own.
///
pub fn check_field(field: usize, x: f64) -> Result<(), Invalid> {
    let (rule, reason) = field_rule(field);
    if rule.accepts(x) {
        Ok(())
    } else {
        Err(reason)
    }
}

/// Check how a configuration whose fields each passed [`check_field`] fits the model, and
/// split its layers over the pipeline stages.
pub(crate) fn validate_fit(spec: &ModelSpec, l: &Layout) -> Result<StageLayers, Invalid> {
    tp_fit(spec, l.tp)?;
    let stages = split_fit(spec, l)?;
    ep_fit(spec, l.ep)?;
    ep_group_fit(l)?;
    Ok(stages)
}

/// Whether `tp` divides the heads and MLP widths of the model (key/value heads: divides
/// them or is a multiple of them).
pub(crate) fn tp_fit(spec: &ModelSpec, tp: f64) -> Result<(), Invalid> {
    if !divides(tp, spec.num_heads) {
        return Err(Invalid::TpHeads);
    }
    if !spec.is_mla() && !divides(tp, spec.num_kv_heads) && (tp as u64) % spec.num_kv_heads != 0 {
        return Err(Invalid::TpKvHeads);
    }
    let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
    if (has_dense && !divides(tp, spec.ffn_size))
        || (spec.is_moe() && !divides(tp, spec.moe_ffn_size))
    {
        return Err(Invalid::TpFfn);
    }
    Ok(())
}

/// The split of the model's layers over the pipeline stages. Inlined, so that the split is
/// built where it is used rather than copied out of a return slot for every cell of a grid.
#[inline(always)]
pub(crate) fn split_fit(spec: &ModelSpec, l: &Layout) -> Result<StageLayers, Invalid> {
    let split = PipelineSplit::from_code(l.pipeline_split).ok_or(Invalid::PipelineSplit)?;
    StageLayers::new(
        spec.num_layers,
        l.pp as u64,
        l.vpp as u64,
        split,
        l.first_stage_layers as u64,
        l.last_stage_layers as u64,
    )
    .ok_or(Invalid::PpLayers)
}

/// Whether `ep` divides the routed experts (1 for a dense model).
pub(crate) fn ep_fit(spec: &ModelSpec, ep: f64) -> Result<(), Invalid> {
    if spec.is_moe() {
        if !divides(ep, spec.num_experts) {
            return Err(Invalid::EpExperts);
        }
    } else if ep != 1.0 {
        return Err(Invalid::EpDense);
    }
    Ok(())
}

/// Whether `ep` divides the data- and context-parallel ranks that shard the experts.
#[inline(always)]
pub(crate) fn ep_group_fit(l: &Layout) -> Result<(), Invalid> {
    // Below 2^53 the float product is exact (and is below 2^53 only if the exact one is).
    let fits = if l.dp * l.cp < TWO_POW_53 {
        divides(l.ep, (l.dp * l.cp) as u64)
    } else {
        divides_product(l.ep, l.dp, l.cp)
    };
    if fits {
        Ok(())
    } else {
        Err(Invalid::EpDpCp)
    }
}

/// 2^53: whole numbers up to it are exact in an `f64`.
const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

/// Whether `d` (a validated positive whole number, at most the number of experts) divides
/// `a * b` (validated positive whole numbers whose product may be past 2^53): `d / gcd(d, a)` must divide
/// `b`. A float's remainder is exact, so huge `a` and `b` are read as they are.
#[cold]
fn divides_product(d: f64, a: f64, b: f64) -> bool {
    let d = d as u64;
    let mut x = d;
    let mut y = (a % d as f64) as u64;
    while y != 0 {
        (x, y) = (y, x % y);
    }
    let rest = d / x;
    b % rest as f64 == 0.0
}
