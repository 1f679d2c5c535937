//! Parallel-layout planning: enumerate the layouts that fit, rank them by step time.
//!
//! The search enumerates data, tensor, pipeline (with interleaving), context and expert
//! parallelism, the ZeRO stage, recomputation and the micro-batch size
//! ([`candidates`]); estimates the memory of every candidate in one grid (pipeline
//! stages split to balance their compute, so that 61 or 126 layers split over 16
//! stages); keeps those within `usable_fraction` of the GPU's memory; and ranks them by
//! the step-time model of [`step_time`] on a [`Hardware`].

pub mod candidates;
pub mod collectives;
pub mod hardware;
pub mod inputs;
pub mod layer_time;
pub mod options;
pub mod step_time;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use rayon::prelude::*;

use crate::error::{at_least, Error, Result};
use crate::memory::breakdown::OUTPUT_FIELDS;
use crate::memory::grid::{estimate_grid, GridInput, GridTable, Values};
use crate::memory::layout::{Invalid, Layout, Recompute, INVALID_REASONS, LAYOUT_FIELDS};
use crate::memory::options::Choice;
use crate::memory::pipeline::PipelineSplit;
use crate::memory::spec::ModelSpec;

pub use candidates::{Bounds, Candidates, Row, Split};
pub use hardware::{Hardware, HARDWARE_FIGURES, HARDWARE_PRESETS};
pub use inputs::{Candidate, Constants, SpecTerms, CANDIDATE_FIELDS, OVERLAP_TAX};
pub use layer_time::{LayerKey, LayerTerms};
pub use options::recompute_modes;
pub use step_time::{DataGroups, StepTime, TIME_PARTS};

/// What to plan: the cluster, the batch and the options of the memory estimate.
#[derive(Debug, Clone)]
pub struct Request<'a, S: AsRef<str>> {
    pub num_gpus: i64,
    pub seq_len: i64,
    pub global_batch_tokens: i64,
    pub hardware: Hardware,
    /// Figures that replace the hardware's, each checked: memory (`gpu_memory`), peak
    /// FLOP/s, intra- and inter-node bandwidths, GPUs per node.
    pub overrides: Overrides,
    /// The memory estimate's options (dtypes, optimizer, `fp8`...); the fields the
    /// planner chooses are ignored.
    pub options: Layout,
    pub constants: Constants,
    /// Fraction of the GPU's memory a layout may use.
    pub usable_fraction: f64,
    /// The recomputation modes to consider, by name.
    pub recompute: &'a [S],
    /// Each parallel layout (dp, tp, pp, cp, ep) once, with its fastest setting.
    pub distinct: bool,
    /// The most layouts to return (all with `None`).
    pub top: Option<i64>,
}

/// Figures of a [`Request`] that replace its hardware's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub gpu_memory: Option<f64>,
    pub peak_flops: Option<f64>,
    pub intra_node_bandwidth: Option<f64>,
    pub inter_node_bandwidth: Option<f64>,
    pub gpus_per_node: Option<i64>,
}

impl Overrides {
    /// `hw` with these figures, each checked and named as the caller named it.
    pub fn apply(&self, hw: &Hardware) -> Result<Hardware> {
        let mut hw = *hw;
        let figures = [
            ("gpu_memory", self.gpu_memory, &mut hw.memory),
            ("peak_flops", self.peak_flops, &mut hw.peak_flops),
            (
                "intra_node_bandwidth",
                self.intra_node_bandwidth,
                &mut hw.intra_node_bandwidth,
            ),
            (
                "inter_node_bandwidth",
                self.inter_node_bandwidth,
                &mut hw.inter_node_bandwidth,
            ),
        ];
        for (name, value, figure) in figures {
            if let Some(value) = value {
                *figure = hardware::positive(name, value)?;
            }
        }
        if let Some(gpus) = self.gpus_per_node {
            hw.gpus_per_node = at_least(gpus, 1, "gpus_per_node")?;
        }
        hw.check()?;
        Ok(hw)
    }
}

/// The planned layouts, fastest first, column by column.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub dp: Vec<u64>,
    pub tp: Vec<u64>,
    pub pp: Vec<u64>,
    pub cp: Vec<u64>,
    pub ep: Vec<u64>,
    pub vpp: Vec<u64>,
    pub zero: Vec<u64>,
    pub recompute: Vec<Recompute>,
    pub micro_batch: Vec<u64>,
    pub grad_accum_steps: Vec<u64>,
    pub pipeline_split: Vec<PipelineSplit>,
    /// Explicit layers of the first and last stage (0: set by the split rule).
    pub first_stage_layers: Vec<u64>,
    pub last_stage_layers: Vec<u64>,
    /// Layers of every stage.
    pub stage_layers: Vec<Vec<u64>>,
    /// Bytes per GPU on the busiest stage.
    pub memory: Vec<f64>,
    pub step_time: Vec<f64>,
    pub mfu: Vec<f64>,
    pub tokens_per_second: Vec<f64>,
    /// Seconds of each part of [`TIME_PARTS`], in that order.
    pub time_parts: [Vec<f64>; 10],
}

impl Plan {
    pub fn len(&self) -> usize {
        self.dp.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dp.is_empty()
    }
}

/// The layout fields a candidate sets: the rest come from the request's options, which
/// must not name these (the Python face refuses them by this list).
pub const CHOSEN: [&str; 15] = [
    "seq_len",
    "micro_batch",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "vpp",
    "zero",
    "sequence_parallel",
    "recompute",
    "grad_accum_steps",
    "first_stage_layers",
    "last_stage_layers",
    "pipeline_split",
];

/// Layouts of `num_gpus` GPUs that fit in memory, fastest first (ties: less memory, then
/// the order of the search). An empty plan when none fits; an error naming the field
/// when an argument is out of range, or when no candidate is valid at all (an option
/// makes every estimate invalid: the most common reason is given).
pub fn plan_layouts<S: AsRef<str>>(spec: &ModelSpec, r: &Request<'_, S>) -> Result<Plan> {
    spec.validate()?;
    let hw = &r.overrides.apply(&r.hardware)?;
    let num_gpus = at_least(r.num_gpus, 1, "num_gpus")?;
    let seq_len = at_least(r.seq_len, 1, "seq_len")?;
    let global_batch_tokens = at_least(r.global_batch_tokens, 1, "global_batch_tokens")?;
    r.constants.check()?;
    let usable = hardware::positive("usable_fraction", r.usable_fraction)?;
    if usable > 1.0 {
        return Err(Error::invalid(format!(
            "usable_fraction must be at most 1, got {usable}"
        )));
    }
    if global_batch_tokens % seq_len != 0 {
        return Err(Error::invalid(format!(
            "global_batch_tokens={global_batch_tokens} must be a multiple of seq_len={seq_len}"
        )));
    }
    let top = r.top.map(|top| at_least(top, 1, "top")).transpose()?;
    let bounds = Bounds {
        num_gpus,
        seq_len,
        sequences: global_batch_tokens / seq_len,
        gpus_per_node: hw.gpus_per_node,
        modes: recompute_modes(r.recompute)?,
    };
    let found = candidates::candidates(spec, &bounds);
    if found.rows.is_empty() {
        return Ok(Plan::default());
    }
    let terms = SpecTerms::new(spec);
    let (options, constants) = (&r.options, &r.constants);
    let seq = seq_len as f64;
    let layers: Vec<LayerTerms> = found
        .layers
        .par_iter()
        .map(|key| layer_time::layer_terms(&terms, key, hw, seq, options, constants))
        .collect();
    let groups: Vec<DataGroups> = (found.groups.iter())
        .map(|&(dp, tp, cp, ep)| DataGroups::new((dp as f64, tp as f64, cp as f64, ep as f64), hw))
        .collect();
    let time = |x: &Row| {
        let c = candidate(x, &found.splits[x.split]);
        let shared = (&layers[x.layer], &groups[x.group]);
        step_time::finish(&terms, &c, shared, hw, seq, options, constants)
    };
    let totals: Vec<f64> = found.rows.par_iter().map(|x| time(x).total).collect();
    let ranked = rank(spec, r, &found, &totals, usable * hw.memory, top)?;
    let mut plan = Plan::default();
    for (i, memory) in ranked {
        let x = &found.rows[i];
        let time = time(x);
        let split = &found.splits[x.split];
        plan.dp.push(x.dp);
        plan.tp.push(x.tp);
        plan.pp.push(x.pp);
        plan.cp.push(x.cp);
        plan.ep.push(x.ep);
        plan.vpp.push(x.vpp);
        plan.zero.push(x.zero);
        plan.recompute.push(x.recompute);
        plan.micro_batch.push(x.micro_batch);
        plan.grad_accum_steps.push(x.steps);
        plan.pipeline_split.push(split.rule);
        plan.first_stage_layers.push(split.first_stage);
        plan.last_stage_layers.push(split.last_stage);
        plan.stage_layers.push(split.stage_layers());
        plan.memory.push(memory);
        plan.step_time.push(time.total);
        plan.mfu
            .push(time.model_flops / (time.total * num_gpus as f64 * hw.peak_flops));
        plan.tokens_per_second
            .push(global_batch_tokens as f64 / time.total);
        for (column, &part) in plan.time_parts.iter_mut().zip(&time.parts) {
            column.push(part);
        }
    }
    Ok(plan)
}

/// A candidate's place in the ranking, as one integer whose order is that of its step
/// time, then of the search (memory breaks ties of time once it is known): the time's
/// bits in the order of [`f64::total_cmp`] above the candidate's index.
fn rank_key(time: f64, index: usize) -> Reverse<u128> {
    let bits = time.to_bits() as i64;
    let ordered = (bits ^ (((bits >> 63) as u64) >> 1) as i64) as u64 ^ (1 << 63);
    Reverse(u128::from(ordered) << 64 | index as u128)
}

/// The candidates that fit in `limit` bytes, fastest first (ties: less memory, then the
/// order of the search), at most `top`, each parallel layout once when `distinct`, with
/// their memory. The memory of a candidate is estimated only when it could be among
/// them: the candidates are taken fastest first, in batches (one grid each), until the
/// plan is full.
fn rank<S: AsRef<str>>(
    spec: &ModelSpec,
    r: &Request<'_, S>,
    found: &candidates::Candidates,
    totals: &[f64],
    limit: f64,
    top: Option<u64>,
) -> Result<Vec<(usize, f64)>> {
    let top = top.map_or(usize::MAX, |top| usize::try_from(top).unwrap_or(usize::MAX));
    let key = |i: usize| {
        let x = &found.rows[i];
        (x.dp, x.tp, x.pp, x.cp, x.ep)
    };
    // A min-heap: the fastest first.
    let mut heap: BinaryHeap<Reverse<u128>> = totals
        .iter()
        .enumerate()
        .map(|(i, &total)| rank_key(total, i))
        .collect();
    let mut seen = HashSet::new();
    let mut ranked = Vec::new();
    let mut reasons = [0usize; 256];
    let mut batch_size = 64;
    while ranked.len() < top {
        // The next candidates whose layout is not taken, ending with a whole group of
        // equal times (memory orders a group).
        let mut batch: Vec<usize> = Vec::new();
        while let Some(Reverse(rank)) = heap.pop() {
            let i = rank as u64 as usize;
            if !(r.distinct && seen.contains(&key(i))) {
                batch.push(i);
            }
            let group_ends = heap.peek().is_none_or(|next| next.0 >> 64 != rank >> 64);
            if batch.len() >= batch_size && group_ends {
                break;
            }
        }
        if batch.is_empty() {
            break;
        }
        batch_size *= 2;
        let rows: Vec<Row> = batch.iter().map(|&i| found.rows[i]).collect();
        let grid = estimate(spec, r.seq_len as f64, &r.options, &rows, &found.splits)?;
        let memory = grid.field(field_index("total"));
        let mut fits: Vec<(usize, f64)> = Vec::new();
        for (k, &i) in batch.iter().enumerate() {
            reasons[usize::from(grid.reasons[k])] += 1;
            if grid.reasons[k] == 0 && memory[k] <= limit {
                fits.push((i, memory[k]));
            }
        }
        // Stable: equal times and memory keep the order of the search.
        fits.sort_by(|a, b| {
            totals[a.0]
                .total_cmp(&totals[b.0])
                .then(a.1.total_cmp(&b.1))
        });
        for (i, memory) in fits {
            if ranked.len() == top {
                break;
            }
            if !r.distinct || seen.insert(key(i)) {
                ranked.push((i, memory));
            }
        }
    }
    if ranked.is_empty() && reasons[0] == 0 {
        // Every candidate was estimated (none was skipped for a layout taken) and none is
        // valid: an option is at fault, and the most common reason says which.
        if let Some(reason) = most_common_reason(&reasons) {
            return Err(no_valid_layout(reason, &r.options));
        }
    }
    Ok(ranked)
}

/// The step time of each of `candidates` (of `seq_len` tokens per sequence, with the
/// memory estimate's options `inputs`), on all cores.
pub fn step_times(
    spec: &ModelSpec,
    candidates: &[Candidate],
    hw: &Hardware,
    seq_len: f64,
    inputs: &Layout,
    constants: &Constants,
) -> Result<Vec<StepTime>> {
    spec.validate()?;
    hw.check()?;
    constants.check()?;
    hardware::positive("seq_len", seq_len)?;
    let terms = SpecTerms::new(spec);
    Ok(candidates
        .par_iter()
        .map(|c| step_time::step_time(&terms, c, hw, seq_len, inputs, constants))
        .collect())
}

/// A count of the search as an `f64`. Every count is below 2^63 (the GPUs and sequences
/// arrive as `i64`), where the signed conversion, one instruction, is exact as the
/// unsigned one is.
fn float(n: u64) -> f64 {
    n as i64 as f64
}

/// The step-time model's view of a candidate.
fn candidate(x: &Row, split: &Split) -> Candidate {
    let (first, middle, last) = split.first_middle_last;
    Candidate {
        dp: float(x.dp),
        tp: float(x.tp),
        pp: float(x.pp),
        cp: float(x.cp),
        ep: float(x.ep),
        vpp: float(x.vpp),
        zero: float(x.zero),
        recompute: x.recompute.code(),
        micro_batch: float(x.micro_batch),
        grad_accum_steps: float(x.steps),
        first_layers: float(first),
        middle_layers: float(middle),
        last_layers: float(last),
    }
}

fn field_index(name: &str) -> usize {
    OUTPUT_FIELDS.iter().position(|f| *f == name).unwrap_or(0)
}

fn layout_index(name: &str) -> usize {
    LAYOUT_FIELDS.iter().position(|f| *f == name).unwrap_or(0)
}

/// The memory of every candidate, in one grid over the list of them.
fn estimate(
    spec: &ModelSpec,
    seq_len: f64,
    options: &Layout,
    rows: &[Row],
    splits: &[Split],
) -> Result<GridTable> {
    let column = |value: &dyn Fn(&Row, &Split) -> f64| -> Vec<f64> {
        rows.iter().map(|x| value(x, &splits[x.split])).collect()
    };
    let chosen: Vec<(&str, Vec<f64>)> = vec![
        ("micro_batch", column(&|x, _| x.micro_batch as f64)),
        ("dp", column(&|x, _| x.dp as f64)),
        ("tp", column(&|x, _| x.tp as f64)),
        ("pp", column(&|x, _| x.pp as f64)),
        ("cp", column(&|x, _| x.cp as f64)),
        ("ep", column(&|x, _| x.ep as f64)),
        ("vpp", column(&|x, _| x.vpp as f64)),
        ("zero", column(&|x, _| x.zero as f64)),
        (
            "sequence_parallel",
            column(&|x, _| f64::from(u8::from(x.tp > 1))),
        ),
        ("recompute", column(&|x, _| x.recompute.code())),
        ("grad_accum_steps", column(&|x, _| x.steps as f64)),
        ("first_stage_layers", column(&|_, s| s.first_stage as f64)),
        ("last_stage_layers", column(&|_, s| s.last_stage as f64)),
        ("pipeline_split", column(&|_, s| s.rule.code())),
    ];
    let mut fixed = *options;
    fixed.seq_len = seq_len;
    let fixed = fixed.to_values();
    let mut inputs: Vec<GridInput<'_>> = fixed
        .iter()
        .map(|value| GridInput {
            data: Values::F64(std::slice::from_ref(value)),
            strides: &[0],
        })
        .collect();
    for (name, values) in &chosen {
        inputs[layout_index(name)] = GridInput {
            data: Values::F64(values),
            strides: &[1],
        };
    }
    estimate_grid(spec, &[rows.len()], &inputs)
}

/// The most common reason among `counts` of the codes of invalid cells (the smallest
/// code of equals).
fn most_common_reason(counts: &[usize; 256]) -> Option<Invalid> {
    let best = (1..256).fold(1, |best, code| {
        if counts[code] > counts[best] {
            code
        } else {
            best
        }
    });
    INVALID_REASONS.get(best - 1).copied()
}

/// The error of a search whose every candidate is invalid for `reason`, with the values
/// of the options it names.
fn no_valid_layout(reason: Invalid, options: &Layout) -> Error {
    let message = reason.message();
    let defaults = Layout::default().to_values();
    let given: Vec<String> = LAYOUT_FIELDS
        .iter()
        .zip(options.to_values())
        .zip(defaults)
        .filter(|((name, value), default)| {
            !CHOSEN.contains(name)
                && message.contains(*name)
                && value.to_bits() != default.to_bits()
        })
        .map(|((name, value), _)| format!("{name}={}", hardware::shown(value)))
        .collect();
    let text = if given.is_empty() {
        message.to_string()
    } else {
        format!("{message} (got {})", given.join(", "))
    };
    if reason == Invalid::Overflow {
        Error::overflow(text)
    } else {
        Error::invalid(text)
    }
}
