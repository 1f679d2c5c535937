//! What an estimate derives once per model and shares over every configuration.

use crate::memory::spec::{LayerParams, ModelSpec};

/// Quantities derived once per model, shared by every configuration of a grid.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(crate) spec: ModelSpec,
    pub(crate) dense_layer: LayerParams,
    pub(crate) moe_layer: LayerParams,
    pub(crate) embedding: f64,
    pub(crate) positions: f64,
    pub(crate) final_norm: f64,
    /// One multi-token-prediction module: its layer, its norms and its projection.
    pub(crate) mtp_layer: LayerParams,
    pub(crate) mtp_norms: f64,
    pub(crate) mtp_projection: f64,
}

impl Prepared {
    /// Precompute per-layer parameter counts. The spec must have been validated.
    pub fn new(spec: &ModelSpec) -> Self {
        let (embedding, positions) = spec.embedding_params();
        let (final_norm, _) = spec.head_params(false);
        let (mtp_norms, mtp_projection) = spec.mtp_extra_params();
        Prepared {
            mtp_layer: spec.mtp_layer_params(false),
            mtp_norms,
            mtp_projection,
            spec: spec.clone(),
            dense_layer: spec.layer_params(0, false),
            moe_layer: spec.layer_params(spec.first_dense_layers, false),
            embedding,
            positions,
            final_norm,
        }
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
}
