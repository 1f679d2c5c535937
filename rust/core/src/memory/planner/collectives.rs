//! Ring collectives by NCCL's cost model: latency by link, bandwidth by where the ranks sit.

use super::hardware::Hardware;

/// NCCL's cost model for ring collectives with its Simple protocol (NCCL
/// `src/graph/tuning.cc`): a base latency per collective and one per step, by link.
pub(super) const BASE_LATENCY: f64 = 8.4e-6;
pub(super) const NVLINK_STEP: f64 = 3.4e-6;
pub(super) const NETWORK_STEP: f64 = 9.6e-6;

/// Latency of a ring collective over `group` ranks, `on_node` of them per node.
pub(super) fn steps_latency(group: f64, on_node: f64) -> f64 {
    let nodes = group / group.min(on_node);
    if group > 1.0 {
        BASE_LATENCY + (group - nodes) * NVLINK_STEP + (nodes - 1.0) * NETWORK_STEP
    } else {
        0.0
    }
}

/// Bandwidth of a group whose ranks are `stride` apart: intra-node if it fits in one.
pub(super) fn group_bandwidth(group: f64, stride: f64, hw: &Hardware) -> f64 {
    if group * stride <= hw.gpus_per_node as f64 {
        hw.intra_node_bandwidth
    } else {
        hw.inter_node_bandwidth
    }
}

/// Ranks `stride` apart that share a node (at least 1).
pub(super) fn on_node(stride: f64, hw: &Hardware) -> f64 {
    // Truncation is the floor of a positive quotient, in one instruction where `floor`
    // is a library call.
    1.0f64.max((hw.gpus_per_node as f64 / stride) as i64 as f64)
}

/// A ring all-gather or reduce-scatter of `bytes` per rank over `group` ranks that are
/// `stride` apart: NCCL's latency plus the bandwidth term.
pub(super) fn ring(bytes: f64, group: f64, stride: f64, hw: &Hardware) -> f64 {
    Ring::new(group, stride, hw).time(bytes)
}

/// What a ring collective's time takes of its group: its latency, the share of the bytes
/// each rank sends, `(group - 1) / group`, and its bandwidth.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ring {
    latency: f64,
    share: f64,
    bandwidth: f64,
}

impl Ring {
    /// A group of `group` ranks `stride` apart.
    pub fn new(group: f64, stride: f64, hw: &Hardware) -> Self {
        Ring {
            latency: steps_latency(group, on_node(stride, hw)),
            share: (group - 1.0) / group,
            bandwidth: group_bandwidth(group, stride, hw),
        }
    }

    /// Seconds to all-gather or reduce-scatter `bytes` per rank.
    pub fn time(&self, bytes: f64) -> f64 {
        self.latency + self.share * bytes / self.bandwidth
    }
}
