//! The planner's step-time model: seconds per optimizer step of a parallel layout.
//!
//! Standard formulas on stated hardware figures ([`Hardware`]) and two constants fitted
//! once on 19 published runs (the efficiency large matmuls reach and a fixed cost per
//! layer pass, kept with the fit in `tokenbatch/memory/steptime_fit.py`). The formulas,
//! their sources and what is not modelled are listed in `docs/memory.md`; in short:
//! matmuls by roofline (FLOPs at the peak times the efficiency, or their weights at the
//! HBM bandwidth, plus their inputs and outputs at the HBM bandwidth); element-wise
//! kernels, the loss and the optimizer step at the HBM bandwidth; a fixed overhead per
//! layer pass; the pipeline bubble of interleaved 1F1B; ring collectives with NCCL's
//! latency model for tensor, context, expert and data parallelism, on the links their
//! ranks share (ranks laid out tensor-parallel first, then context-, then data-parallel,
//! then pipeline stages, as Megatron-LM does).

use crate::memory::layout::Layout;

use super::collectives::Ring;
use super::hardware::Hardware;
use super::inputs::{Candidate, Constants, SpecTerms};
use super::layer_time::{layer_terms, LayerKey, LayerTerms};

/// The parts of a step's time, in the order [`StepTime::parts`] gives them.
pub const TIME_PARTS: [&str; 10] = [
    "compute",
    "elementwise",
    "overhead",
    "optimizer",
    "bubble",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
];

/// Seconds per step and its parts (see [`TIME_PARTS`]), and the model FLOPs of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTime {
    pub parts: [f64; 10],
    pub total: f64,
    pub model_flops: f64,
}

/// The rings of a candidate's data-parallel groups: `dp x cp` ranks `tp` apart for the
/// dense weights, `dp x cp / ep` ranks `tp x ep` apart for the experts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DataGroups {
    dense: Ring,
    experts: Ring,
}

impl DataGroups {
    /// The groups of data, tensor, context and expert parallelism `dp`, `tp`, `cp`, `ep`.
    pub fn new((dp, tp, cp, ep): (f64, f64, f64, f64), hw: &Hardware) -> Self {
        DataGroups {
            dense: Ring::new(dp * cp, tp, hw),
            experts: Ring::new(dp * cp / ep, tp * ep, hw),
        }
    }

    pub fn of(c: &Candidate, hw: &Hardware) -> Self {
        Self::new((c.dp, c.tp, c.cp, c.ep), hw)
    }
}

/// The seconds per step of `c`, with `inputs` the memory estimate's fields (dtypes,
/// `fp8`, `attention`, `moe_capacity_factor`, `cp_comm`...; its layout fields unread).
pub fn step_time(
    terms: &SpecTerms,
    c: &Candidate,
    hw: &Hardware,
    seq_len: f64,
    inputs: &Layout,
    k: &Constants,
) -> StepTime {
    let layer = layer_terms(terms, &LayerKey::of(c), hw, seq_len, inputs, k);
    let groups = DataGroups::of(c, hw);
    finish(terms, c, (&layer, &groups), hw, seq_len, inputs, k)
}

/// The seconds per step of `c` from the terms of its layers and of its data-parallel
/// groups (those of [`LayerKey::of`]`(c)` and [`DataGroups::of`]`(c)`): the slowest
/// pipeline stage, its communication, the bubble, data parallelism and the optimizer step.
pub fn finish(
    terms: &SpecTerms,
    c: &Candidate,
    (layer, groups): (&LayerTerms, &DataGroups),
    hw: &Hardware,
    seq_len: f64,
    inputs: &Layout,
    k: &Constants,
) -> StepTime {
    let spec = &terms.spec;
    let (dp, tp, pp, cp, ep, vpp) = (c.dp, c.tp, c.pp, c.cp, c.ep, c.vpp);
    let m = c.grad_accum_steps;
    let l = layer;
    let stages = [c.first_layers, c.middle_layers, c.last_layers];
    let mut stage_times =
        stages.map(|layers| layers * (l.per_layer + l.layer_elementwise + l.layer_overhead));
    stage_times[2] = stage_times[2] + l.end_compute + l.end_elementwise + l.end_overhead;
    // The slowest stage, the first of equals.
    let slowest = (1..3).fold(0, |best, i| {
        if stage_times[i] > stage_times[best] {
            i
        } else {
            best
        }
    });
    let slowest_layers = stages[slowest];
    let last = slowest == 2;
    let end = |value: f64| if last { value } else { 0.0 };
    let stage_compute = slowest_layers * l.per_layer + end(l.end_compute);
    let stage_elementwise = slowest_layers * l.layer_elementwise + end(l.end_elementwise);
    let stage_overhead = slowest_layers * l.layer_overhead + end(l.end_overhead);
    let stage_layers = stages[0].max(stages[1]).max(stages[2]);

    // Communication per micro-batch on that stage.
    let tp_comm = stage_layers * l.tp_collectives * l.tp_ring;
    let cp_comm = stage_layers * l.cp_time;
    let ep_comm = if spec.is_moe() {
        stage_layers * l.moe_share * l.ep_time
    } else {
        0.0
    };
    let pp_comm = if pp > 1.0 {
        2.0 * vpp * l.point_to_point
    } else {
        0.0
    };
    let micro_batch_time =
        stage_compute + stage_elementwise + stage_overhead + tp_comm + cp_comm + ep_comm + pp_comm;

    // Data parallelism, on the stage with the most weights.
    let dense_weights = stage_layers * l.layer_weights
        + if pp > 1.0 {
            l.embedding
        } else {
            l.embedding_and_head
        };
    let expert_weights = stage_layers * l.moe_share * terms.moe_row[3] / (ep * tp);
    let dp_comm = data_parallel(
        c,
        groups,
        k,
        (dense_weights, expert_weights),
        micro_batch_time,
        (
            inputs.grad_bytes + inputs.grad_buffer_bytes,
            inputs.param_bytes,
        ),
    );
    // The optimizer step (Adam) on the local shard: reads the gradient, reads and writes
    // the master weights and both moments, writes the weights.
    let (dense_group, expert_group) = (dp * cp, dp * cp / ep);
    let sharded = c.zero >= 1.0;
    let local_params = dense_weights / if sharded { dense_group } else { 1.0 }
        + expert_weights / if sharded { expert_group } else { 1.0 };
    let update_bytes = inputs.grad_bytes
        + 2.0 * (inputs.master_bytes + inputs.optimizer_state_bytes)
        + inputs.param_bytes;
    let optimizer = local_params * update_bytes / hw.memory_bandwidth;
    let bubble = (pp - 1.0) / vpp * micro_batch_time;
    let total = m * micro_batch_time + bubble + dp_comm + optimizer;
    let step_tokens = dp * m * c.micro_batch * seq_len;
    let active = terms.active_params - terms.embedding;
    let model_flops = step_tokens
        * (6.0 * active
            + 3.0 * spec.num_layers as f64 * seq_len * spec.num_heads as f64 * terms.head_dims);
    StepTime {
        parts: [
            m * stage_compute,
            m * stage_elementwise,
            m * stage_overhead,
            optimizer,
            bubble,
            m * tp_comm,
            m * cp_comm,
            m * ep_comm,
            m * pp_comm,
            dp_comm,
        ],
        total,
        model_flops,
    }
}

/// The data-parallel collectives not hidden by compute (ring reduce-scatter and
/// all-gather over `dp x cp` ranks, over `dp x cp / ep` for experts): ZeRO-0 all-reduces
/// the gradients once per step behind the last micro-batch's backward; ZeRO-1
/// reduce-scatters them there and all-gathers the updated weights behind the next step's
/// first forward; ZeRO-2 reduce-scatters after every micro-batch's backward; ZeRO-3 also
/// gathers the weights before every micro-batch's forward and backward (Rajbhandari et
/// al. 2020), each hidden only behind the compute of the same micro-batch. `weights` are
/// the stage's dense and expert weights, `bytes` the gradient and weight bytes of each.
fn data_parallel(
    c: &Candidate,
    groups: &DataGroups,
    k: &Constants,
    (dense_weights, expert_weights): (f64, f64),
    micro_batch_time: f64,
    (grad_bytes, param_bytes): (f64, f64),
) -> f64 {
    let m = c.grad_accum_steps;
    let forward = micro_batch_time / 3.0;
    let backward = micro_batch_time - forward;
    // The dense weights' and the experts' collectives share the same compute to hide
    // behind.
    let collective = |bytes: f64| {
        groups.dense.time(dense_weights * bytes) + groups.experts.time(expert_weights * bytes)
    };
    let reduce = collective(grad_bytes);
    let gather = collective(param_bytes);
    // What `comm` adds to `window` of compute it overlaps: the part the window does not
    // hide, and the share of the hidden part the collective's kernels take from the
    // compute (streaming multiprocessors and memory bandwidth).
    let exposed =
        |comm: f64, window: f64| 0.0f64.max(comm - window) + k.overlap_tax * comm.min(window);
    if c.zero == 0.0 {
        exposed(2.0 * reduce, backward)
    } else if c.zero == 1.0 {
        exposed(reduce, backward) + exposed(gather, forward)
    } else if c.zero == 2.0 {
        m * exposed(reduce, backward) + exposed(gather, forward)
    } else {
        m * (exposed(gather, forward) + exposed(gather + reduce, backward))
    }
}
