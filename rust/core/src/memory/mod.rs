//! Memory estimation for LLM training: per-GPU bytes of weights, gradients, optimizer
//! state and activations for a model and a parallel layout, one configuration or a
//! broadcast grid of millions.
//!
//! Formulas and their sources are documented in [`estimate`]; parameter counts in [`spec`].

pub mod activations;
pub mod breakdown;
mod checks;
pub mod estimate;
pub mod grid;
pub mod layout;
mod memo;
mod numeric;
pub mod options;
pub mod pipeline;
pub mod planner;
pub mod prepared;
pub mod spec;
pub mod spec_fields;
mod stage;
mod terms;

pub use activations::CpComm;
pub use breakdown::{Breakdown, N_OUTPUT_FIELDS, OUTPUT_FIELDS};
pub use checks::{check_field, validate};
pub use estimate::{estimate, estimate_stages};
pub use grid::{
    estimate_all_stages, estimate_grid, estimate_one, max_micro_batch_tokens, GridInput, GridTable,
    Values,
};
pub use layout::{
    ActivationModel, Invalid, Layout, Modules, Recompute, INVALID_REASONS, LAYOUT_FIELDS,
    MAX_RECOMPUTE_CODE, N_LAYOUT_FIELDS,
};
pub use options::{
    option_choices, option_code, option_codes, Attention, Choice, Dtype, Loss, Optimizer,
};
pub use pipeline::{PipelineSplit, StageLayers};
pub use prepared::Prepared;
pub use spec::{FfnType, Implementation, LayerParams, ModelSpec, MoeDispatcher, NormType};
pub use spec_fields::{Field, SPEC_FIELDS};

#[cfg(test)]
mod tests;
