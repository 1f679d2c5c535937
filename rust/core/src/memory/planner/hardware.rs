//! Accelerators the planner times layouts on: peak FLOP/s, memory and link bandwidths.
//!
//! Every figure is the vendor's published peak for one GPU (dense, without sparsity),
//! except where a training report measured the effective one; bandwidths are one
//! direction, in bytes per second, per GPU. Memory is the capacity the driver reports
//! (`nvidia-smi`: 81,559 MiB for an "80 GB" H100 or H800, 143,771 MiB for an H200, 81,920
//! MiB for an A100 80GB; 192 GiB for an MI300X), before the CUDA context and allocator
//! take their share:
//!
//! * **H100 SXM** (NVIDIA H100 Tensor Core GPU datasheet): 989 TFLOP/s BF16, 1,979 FP8,
//!   3.35 TB/s HBM3, 80 GB; NVLink 4 at 900 GB/s both directions (450 one way); one
//!   400 Gb/s InfiniBand NDR adapter per GPU (50 GB/s), as in DGX H100 and Meta's
//!   clusters (Dubey et al. 2024, section 3.3.1).
//! * **H800 SXM**: the H100's compute and memory with NVLink cut to 400 GB/s both
//!   directions; DeepSeek-V3's cluster measured about 160 GB/s of NVLink and 50 GB/s of
//!   InfiniBand per GPU (DeepSeek-AI 2024, sections 3.1 and 3.2.2), the figures used here.
//! * **H200 SXM** (NVIDIA H200 datasheet): the H100's compute with 4.8 TB/s HBM3e and 141 GB.
//! * **A100 SXM 80GB** (NVIDIA A100 datasheet): 312 TFLOP/s BF16 (no FP8: FP8 matmuls run
//!   at the BF16 rate), 2.04 TB/s, NVLink 3 at 600 GB/s both directions, one 200 Gb/s HDR
//!   adapter per GPU (25 GB/s).
//! * **MI300X** (AMD Instinct MI300X datasheet): 1,307 TFLOP/s BF16, 2,615 FP8, 5.3 TB/s
//!   HBM3, 192 GB; seven Infinity Fabric links of 64 GB/s each way (448 GB/s to the other
//!   seven GPUs of a node); one 400 Gb/s network adapter per GPU.

use crate::error::{Error, Result};

const MIB: f64 = 1024.0 * 1024.0;

/// One accelerator and its links, as the step-time model sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hardware {
    /// Dense BF16 matmul FLOP/s.
    pub peak_flops: f64,
    /// Dense FP8 matmul FLOP/s.
    pub fp8_flops: f64,
    /// HBM bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// From a GPU to the others of its node (NVLink, Infinity Fabric), bytes/s one way.
    pub intra_node_bandwidth: f64,
    /// A GPU's share of the network to other nodes, bytes/s one way.
    pub inter_node_bandwidth: f64,
    /// Bytes of memory.
    pub memory: f64,
    pub gpus_per_node: u64,
}

/// The figures' names, in the order of [`Hardware::figures`].
pub const HARDWARE_FIGURES: [&str; 6] = [
    "peak_flops",
    "fp8_flops",
    "memory_bandwidth",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "memory",
];

/// The presets by name; sources in this module's documentation.
pub const HARDWARE_PRESETS: [(&str, Hardware); 5] = [
    (
        "h100",
        preset(989e12, 1979e12, 3.35e12, 450e9, 50e9, 81_559.0 * MIB),
    ),
    (
        "h800",
        preset(989e12, 1979e12, 3.35e12, 160e9, 50e9, 81_559.0 * MIB),
    ),
    (
        "h200",
        preset(989e12, 1979e12, 4.8e12, 450e9, 50e9, 143_771.0 * MIB),
    ),
    (
        "a100",
        preset(312e12, 312e12, 2.039e12, 300e9, 25e9, 81_920.0 * MIB),
    ),
    (
        "mi300x",
        preset(1307e12, 2615e12, 5.3e12, 448e9, 50e9, 192.0 * 1024.0 * MIB),
    ),
];

const fn preset(
    peak_flops: f64,
    fp8_flops: f64,
    memory_bandwidth: f64,
    intra_node_bandwidth: f64,
    inter_node_bandwidth: f64,
    memory: f64,
) -> Hardware {
    Hardware {
        peak_flops,
        fp8_flops,
        memory_bandwidth,
        intra_node_bandwidth,
        inter_node_bandwidth,
        memory,
        gpus_per_node: 8,
    }
}

impl Hardware {
    /// The figures in [`HARDWARE_FIGURES`] order.
    pub fn figures(&self) -> [f64; 6] {
        [
            self.peak_flops,
            self.fp8_flops,
            self.memory_bandwidth,
            self.intra_node_bandwidth,
            self.inter_node_bandwidth,
            self.memory,
        ]
    }

    /// Hardware from figures in [`HARDWARE_FIGURES`] order and `gpus_per_node`, each
    /// checked: finite and positive, at least one GPU per node.
    pub fn new(figures: [f64; 6], gpus_per_node: i64) -> Result<Hardware> {
        Self::check_figures(&figures, &HARDWARE_FIGURES)?;
        let gpus_per_node = crate::error::at_least(gpus_per_node, 1, "gpus_per_node")?;
        let [peak_flops, fp8_flops, memory_bandwidth, intra_node, inter_node, memory] = figures;
        Ok(Hardware {
            gpus_per_node,
            ..preset(
                peak_flops,
                fp8_flops,
                memory_bandwidth,
                intra_node,
                inter_node,
                memory,
            )
        })
    }

    /// Every figure finite and positive and at least one GPU per node, else an error
    /// naming the figure.
    pub fn check(&self) -> Result<()> {
        Self::check_figures(&self.figures(), &HARDWARE_FIGURES)?;
        if self.gpus_per_node == 0 {
            return Err(Error::invalid("gpus_per_node must be at least 1, got 0"));
        }
        Ok(())
    }

    /// Each figure finite and positive, else an error naming it (`names[i]` for
    /// `figures[i]`).
    pub fn check_figures(figures: &[f64], names: &[&str]) -> Result<()> {
        for (&value, name) in figures.iter().zip(names) {
            positive(name, value)?;
        }
        Ok(())
    }
}

/// `value` if it is a finite positive number, else an error naming `name`.
pub fn positive(name: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::invalid(format!(
            "{name} must be a positive number, got {}",
            shown(value)
        )))
    }
}

/// A number as Python writes it (`-1`, `0.5`, `1e+308`, `nan`), which is how the
/// user typed it.
pub fn shown(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.into()
    } else if value == value.trunc() && value.abs() < 1e16 {
        format!("{value:.0}")
    } else if value.abs() >= 1e16 || value.abs() < 1e-4 {
        let text = format!("{value:e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) if !exponent.starts_with('-') => {
                format!("{mantissa}e+{exponent:0>2}")
            }
            Some((mantissa, exponent)) => {
                format!("{mantissa}e-{:0>2}", exponent.trim_start_matches('-'))
            }
            None => text,
        }
    } else {
        format!("{value}")
    }
}
